// SPDX-License-Identifier: Apache-2.0
// The dyad tool's subcommands that inspect: keygen, config, key, stat, ls,
// service status.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include <cctype>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <dyad/dyad_version.h>

#include "client/client.hpp"
#include "capi/intercept.hpp"
#include "common/auth.hpp"
#include "common/config.hpp"
#include "common/settings.hpp"
#include "common/keygen.hpp"
#include "doctor.hpp"
#include "dtl/dtl.hpp"
#include "common/json_text.hpp"
#include "job/job.hpp"
#include "proto/service_status.hpp"
#include "cli_common.hpp"

using dyad::kBadUtf8Replaced;

namespace dyad::tool {

// ---- the subcommands that need no client ----
int run_keygen(const Cli& o) {
    dyad::Status s = dyad::auth::Key::generate(o.keygen_path);
    if (!s) return report(s, o.keygen_path);
    if (!o.json)
        std::cout << "wrote a new key to " << o.keygen_path
                  << " (mode 0600). As a job key: give it to every dyadd of the job (--auth-key) "
                     "and to its clients (DYAD_AUTH_KEY_FILE). As the Slurm plugin's site secret "
                     "(/etc/dyad/slurm.key, or plugstack site_key=): copy it to every node, "
                     "readable by root only, and give it to no dyadd nor job (the plugin derives "
                     "each job's key from it)\n";
    return 0;
}

// `dyad config` lists the settings even when one is bad (to show where its
// value came from), then fails.
int run_config(const Cli& o, const dyad::Result<dyad::Config>& cfg) {
    if (o.markdown) {
        std::cout << dyad::settings::markdown();
        return 0;
    }
    nlohmann::json j = {{"config", cfg ? cfg->to_json() : nlohmann::json()},
                        {"settings", dyad::settings::describe()}};
    if (!cfg) j["error"] = cfg.status().message();
    // The node-local cache's counters (DYAD_CACHE_CAPACITY, shared by every
    // consumer of this consumer directory: .dyad/cache).
    if (cfg && cfg->cache_capacity > 0 && !cfg->cons_path.empty()) {
        auto c = dyad::client::Client::create(cfg.value());
        if (c) {
            if (auto st = c.value()->cache_stats()) j["cache"] = st->to_json();
        }
    }
    nlohmann::json t = nlohmann::json::array();
    for (const auto& b : dyad::dtl::backends()) t.push_back(b.attributes().to_json());
    j["transports_built"] = t;
    if (o.json) {
        std::cout << j.dump(2, ' ', false, kBadUtf8Replaced) << "\n";
    } else {
        // Like `ucx_info -c`: NAME=VALUE, then where the value came from.
        for (const auto& s : j["settings"]) {
            std::string line = s["name"].get<std::string>() + "=" +
                               (s["value"].is_null() ? "" : s["value"].get<std::string>());
            std::cout << line << std::string(line.size() < 40 ? 40 - line.size() : 1, ' ') << "# "
                      << s["source"].get<std::string>() << "\n";
        }
        if (j.contains("cache")) {
            const auto& c = j["cache"];
            std::cout << "cache: " << c["files"].get<uint64_t>() << " files, "
                      << c["bytes"].get<uint64_t>() << " of " << cfg->cache_capacity
                      << " bytes; hits " << c["hits"].get<uint64_t>() << ", misses "
                      << c["misses"].get<uint64_t>() << ", evictions "
                      << c["evictions"].get<uint64_t>() << " ("
                      << c["evicted_bytes"].get<uint64_t>() << " bytes)\n";
        }
        std::cout << "transports built:";
        for (auto& b : t) std::cout << " " << b["name"].get<std::string>();
        std::cout << "\n";
        for (auto& b : t) {
            std::string info = b.value("info", std::string());
            if (!info.empty())
                std::cout << "  " << b["name"].get<std::string>() << ": " << info << "\n";
        }
    }
    std::cout.flush();
    return cfg ? 0 : report(cfg.status());
}

int run_key(const Cli& o, const dyad::Config& cfg) {
    auto k = dyad::gen_path_key(o.key_path, cfg.key_depth, cfg.key_bins);
    if (!k) return report(k.status(), o.key_path);
    std::cout << k.value() << "\n";
    return 0;
}

int run_stat(dyad::client::Client& c, const Cli& o) {
    auto r = c.stat(resolve_relative(c, o.stat_file, true));
    if (!r)
        return report(r.status(), o.stat_file,
                      r.status().rc() == DYAD_RC_NOTFOUND
                          ? "'dyad ls' lists the files produced so far, 'dyad consume' "
                            "waits for one"
                          : "");
    nlohmann::json j = r->to_json();
    j["generation"] = r->generation;
    j["owner_rank"] = r->owner_rank();
    j["key"] = c.key_of(r->upath);
    // Where the other copies are: the replicas failover would use (of this
    // generation); the owner's copy is the record's owner and node.
    nlohmann::json reps = nlohmann::json::array();
    auto found = c.replicas(r->upath, r.value());
    if (found) {
        for (const auto& e : found.value())
            reps.push_back({{"holder", e.holder}, {"node", e.node}, {"generation", e.generation}});
        j["replicas"] = reps;
    } else {
        j["replicas_error"] = "replicas not looked up: " + found.status().message();
    }
    if (o.json) {
        std::cout << j.dump(2, ' ', false, kBadUtf8Replaced) << "\n";
        return 0;
    }
    for (auto& [k, v] : j.items()) {
        if (k == "mode" && v.is_number_unsigned())
            std::cout << "mode: " << octal_mode(v.get<uint64_t>()) << "\n";
        else if (k == "replicas") {
            if (v.empty()) std::cout << "replicas: none\n";
            for (const auto& e : v)
                std::cout << "replica: " << e["holder"].get<std::string>() << " on node "
                          << e["node"].get<std::string>() << ", generation "
                          << e["generation"].get<uint64_t>() << "\n";
        } else if (k == "mtime_ns" && v.is_number_integer())
            std::cout << "mtime: " << iso_time(v.get<int64_t>()) << "\n";
        else
            std::cout << k << ": "
                      << (v.is_string() ? v.get<std::string>()
                                        : v.dump(-1, ' ', false, kBadUtf8Replaced))
                      << "\n";
    }
    return 0;
}

// Streamed: a page is printed as it arrives, so memory stays flat however
// many records there are. --json: one object per line.
int run_ls(dyad::client::Client& c, const Cli& o) {
    dyad::Status s = c.list(o.ls_prefix, [&](const dyad::client::Record& r) {
        if (o.json) {
            auto j = r.to_json();
            j["generation"] = r.generation;
            std::cout << j.dump(-1, ' ', false, kBadUtf8Replaced) << "\n";
        } else {
            std::cout << std::setw(12) << r.size << "  gen " << std::left << std::setw(4)
                      << r.generation << " " << std::setw(16) << r.owner << std::right << " "
                      << r.upath << "\n";
        }
        return static_cast<bool>(std::cout);  // stdout closed (dyad ls | head): stop
    });
    std::cout.flush();
    return s ? 0 : report(s);
}

namespace {

unsigned long long ull(uint64_t v) {
    return v;
}

// `dyad service status`: the counters of the service and of its peers.
void print_counters(const proto::ServiceStatus& st) {
    const auto& ctr = st.counters;
    // Files asked for and served by this dyadd (a dyad.fetch_many asks for
    // many in one request); what its own clients fetched from others is
    // counted by those others.
    std::printf(
        "files requested %llu (in %llu requests), served %llu, errors %llu, bytes sent "
        "%llu\n",
        ull(ctr.files_requested), ull(ctr.requests + ctr.fetch_many_requests), ull(ctr.served),
        ull(ctr.errors), ull(ctr.bytes_sent));
    std::printf(
        "authentication: %s; refused peers %llu, unproduced fetches refused %llu, "
        "stale fetches refused %llu, published %llu\n",
        st.identity.auth.empty() ? "none" : st.identity.auth.c_str(), ull(ctr.auth_refused),
        ull(ctr.refused_unproduced), ull(ctr.refused_stale), ull(ctr.published));
    const auto& pc = st.peers;
    std::printf(
        "caps per peer: refused connections %llu (cap %llu), fetches %llu (cap %llu), "
        "LOCAL %llu (cap %llu); memory %llu bytes a peer\n",
        ull(ctr.refused_peer_connections), ull(pc.max_connections_per_peer),
        ull(ctr.refused_peer_fetches), ull(pc.max_fetches_per_peer), ull(ctr.refused_peer_local),
        ull(pc.max_local_per_peer), ull(pc.memory_per_peer));
    for (const auto& [name, p] : ctr.per_transport)
        std::printf("  %-10s requests %llu served %llu errors %llu sent %llu received %llu\n",
                    name.c_str(), ull(p.requests), ull(p.served), ull(p.errors), ull(p.bytes_sent),
                    ull(p.bytes_received));
}

// `dyad service status`: the store it hosts and the metadata store it uses.
void print_stores(const proto::ServiceStatus& st) {
    if (auto s = st.rest.find("store"); s != st.rest.end() && s->is_object())
        if (auto h = proto::HostedStore::parse(*s))
            std::printf("store: %llu keys, %llu waiting, epoch %llu\n", ull(h->keys),
                        ull(h->waiters), ull(h->epoch));
    auto ms = st.rest.find("metadata_store");
    if (ms == st.rest.end()) return;
    auto m = proto::StoreHealth::parse(*ms);
    if (!m) {
        std::printf("metadata store: %s\n", m.status().message().c_str());
        return;
    }
    std::string backend = m->backend;
    if (backend != m->endpoint) backend += " at " + m->endpoint;
    std::printf("metadata store: %s, %s%s%s\n", backend.c_str(),
                m->reachable  ? "reachable"
                : m->starting ? "STARTING (not reached yet)"
                              : "NOT reachable",
                m->reachable ? "" : ": ", m->reachable ? "" : m->error.c_str());
    if (m->starting) return;
    if (m->backend == "etcd")
        std::printf(
            "  watch stream %s: %llu keys watched, %llu consumers waiting, %llu "
            "reconnects; lease %lld (TTL %.0f s)\n",
            m->watch_stream_up ? "up" : "DOWN", ull(m->watched_keys), ull(m->waiters),
            ull(m->watch_reconnects), static_cast<long long>(m->lease_id), m->lease_ttl);
    if (m->rejoined || m->republished)
        std::printf(
            "  registered again %llu times after the store came back empty, "
            "%llu records published again\n",
            ull(m->rejoined), ull(m->republished));
}

// `dyad service status`: its replicas (copies of other services' files it
// holds, and what became of the copies of its own), one line; the counters
// that are not zero follow it.
void print_replicas(const proto::ServiceStatus& st) {
    auto it = st.rest.find("replicas");
    if (it == st.rest.end() || !it->is_object()) return;
    auto r = proto::ReplicaFigures::parse(*it);
    if (!r) return;
    std::printf(
        "replicas: %llu copies of each file by default (--replicas), holding %llu of other "
        "services' files (%llu of %llu bytes of --replica-space)\n",
        ull(r->default_copies), ull(r->held), ull(r->bytes), ull(r->space));
    std::string counters;
    for (const auto& [k, v] : r->counters) {
        if (v == 0) continue;
        counters += (counters.empty() ? "  " : ", ") + k + " " + std::to_string(v);
    }
    if (!counters.empty()) std::printf("%s\n", counters.c_str());
}

}  // namespace

int run_status(dyad::client::Client& c, const Cli& o) {
    auto s = c.service_status(o.uri);
    if (o.status_wait >= 0) {
        // --wait: ask again until it answers (a job script's "is it up yet").
        const auto end = std::chrono::steady_clock::now() +
                         std::chrono::duration<double>(o.status_wait < 0 ? 60 : o.status_wait);
        while (!s && s.status().rc() == DYAD_RC_CONNFAIL &&
               std::chrono::steady_clock::now() < end) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            s = c.service_status(o.uri);
        }
        if (!s && s.status().rc() == DYAD_RC_CONNFAIL)
            return report(s.status(), "",
                          "it did not answer within " +
                              human_seconds(o.status_wait < 0 ? 60 : o.status_wait) + " (--wait)");
    }
    if (!s) return report(s.status());
    if (o.json) {
        std::cout << s->dump(2, ' ', false, kBadUtf8Replaced) << "\n";
        return 0;
    }
    auto st = proto::ServiceStatus::parse(s.value());
    if (!st) return report(st.status());
    const proto::Identity& id = st->identity;
    std::printf("service %s on node %s (pid %lld), namespace %s\n", id.service_id.c_str(),
                id.node.c_str(), static_cast<long long>(id.pid), id.ns.c_str());
    std::printf("producer dir: %s\nmetadata: %s\nendpoints: %s\n", id.producer_dir.c_str(),
                id.kvs.c_str(),
                nlohmann::json(id.endpoints).dump(-1, ' ', false, kBadUtf8Replaced).c_str());
    std::printf("uptime: %.1f s, connections: %llu\n", st->uptime_s, ull(st->connections));
    print_counters(st.value());
    print_stores(st.value());
    print_replicas(st.value());
    if (st->metrics) std::printf("metrics: %s\n", st->metrics->c_str());
    return 0;
}

}  // namespace dyad::tool
