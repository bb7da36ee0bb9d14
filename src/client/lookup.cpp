// SPDX-License-Identifier: Apache-2.0
// The lookup (lookup.hpp): records at once or waiting for their produce,
// stat, listings, replicas, and the retry of a consume whose file changed.
#include "lookup.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <future>
#include <thread>

#include "common/keygen.hpp"
#include "common/seconds.hpp"
#include "timeouts.hpp"
#include "trace_points.hpp"
#include "wait_notice.hpp"

namespace dyad::client {

namespace {
// Seconds between looks for the new produce of a file changed since its
// produce (retry_stale): at first, and at most.
constexpr double kStalePollFirst = 0.01;
constexpr double kStalePollMax = 1.0;

// What a wait for a produce is shown as (wait_notice.hpp): the file, the
// service, and what ends it.
std::string waiting_for(const std::string& upath, const ServiceInfo& svc, const ManagedDir& cons,
                        const Config& cfg) {
    return "'" + upath + "'" + (cons.empty() ? "" : " (" + cons.join(upath) + ")") +
           " to be produced, looked up through service " + svc.id + " on node " + svc.node +
           " at " + cfg.service_uri;
}
std::string waiting_limit(const Config& cfg) {
    return cfg.wait_timeout
               ? "gives up after " + seconds_text(cfg.wait_timeout) + " s (DYAD_WAIT_TIMEOUT)"
               : "no time limit (DYAD_WAIT_TIMEOUT unset): is the name right ('dyad "
                 "ls' lists what was produced)?";
}
Result<kvs::Entry> wait_visibly(kvs::Store& st, const std::string& nspace, const std::string& key,
                                Deadline deadline, const std::string& what,
                                const std::string& limit) {
    WaitNotice notice(what, limit);
    return st.wait(nspace, key, deadline);
}
}  // namespace

Status reserved_check(const std::optional<std::string>& up) {
    if (!up) return Status::ok();
    auto n = normalize_upath(*up);
    return n ? Status::ok() : n.status();
}

Deadline Lookup::wait_deadline() const {
    return cfg_.wait_timeout ? Deadline::after(*cfg_.wait_timeout) : Deadline::never();
}

std::string Lookup::key_of(const std::string& upath) const {
    auto k = gen_path_key(upath, cfg_.key_depth, cfg_.key_bins);
    return k ? k.value() : upath;
}

Result<std::string> Lookup::consumer_relative(const std::string& path) const {
    if (cons_.empty())
        return Status(DYAD_RC_BADMANAGEDPATH, "no consumer directory (set DYAD_PATH_CONSUMER)",
                      EINVAL);
    auto up = cons_.relative(path, cfg_.relative_to_managed_path);
    if (!up && canonical_path(path) == cons_.path())
        return Status(DYAD_RC_UNTRACKED,
                      "'" + path + "' is the consumer directory itself (DYAD_PATH_CONSUMER): " +
                          "give a file in it",
                      EINVAL);
    if (!up)
        return Status(DYAD_RC_UNTRACKED,
                      "'" + path + "' is not inside the consumer directory " + cons_.path() +
                          " (DYAD_PATH_CONSUMER): give a path under it",
                      EINVAL);
    if (Status r = reserved_check(up); !r) return r;
    return std::move(up.value());
}

Result<Record> Lookup::stat(const std::string& path) {
    auto up = cons_.empty() ? std::nullopt : cons_.relative(path, cfg_.relative_to_managed_path);
    if (!up && !prod_.empty()) up = prod_.relative(path, cfg_.relative_to_managed_path);
    if (!up) {
        std::string dirs;
        if (!cons_.empty())
            dirs = "the consumer directory " + cons_.path() + " (DYAD_PATH_CONSUMER)";
        if (!prod_.empty())
            dirs += (dirs.empty() ? "" : " nor ") + std::string("the producer directory ") +
                    prod_.path() + " (DYAD_PATH_PRODUCER)";
        if (dirs.empty())
            return Status(DYAD_RC_BADMANAGEDPATH,
                          "no managed directory: set DYAD_PATH_CONSUMER or DYAD_PATH_PRODUCER",
                          EINVAL);
        return Status(DYAD_RC_UNTRACKED,
                      "'" + path + "' is not inside " + dirs + ": give a path under it", EINVAL);
    }
    if (Status r = reserved_check(up); !r) return r;
    return find(up.value(), false, Deadline::after(timeouts::kControl));
}

Result<Record> Lookup::find(const std::string& upath, bool should_wait, Deadline deadline) {
    auto key = gen_path_key(upath, cfg_.key_depth, cfg_.key_bins);
    if (!key) return key.status();
    auto svc = link_.service();
    if (!svc) return svc.status();
    auto st = link_.store();
    if (!st) return st.status();
    // A wait whose deadline passed already looks once.
    bool look_once = should_wait && deadline.expired();
    trace::Span sp(should_wait && !look_once ? "wait-for-create" : "lookup", "client");
    sp.arg("path", upath).arg("key", key.value());
    const std::string space = link_.ns(svc.value());
    auto e = should_wait && !look_once
                 ? wait_visibly(*st.value(), space, key.value(), deadline,
                                waiting_for(upath, svc.value(), cons_, cfg_), waiting_limit(cfg_))
                 : st.value()->get(space, key.value(), Deadline::after(timeouts::kControl));
    sp.fail(e.status());
    if (!e) return lookup_failure(e.status(), upath, should_wait, look_once, svc.value());
    auto r = Record::from_json(e->value, e->version);
    if (!r) return r.status();
    if (sp.active()) trace_record(sp, r.value(), key.value());
    if (r->upath != upath)
        return Status(DYAD_RC_BADMETADATA,
                      "metadata under key " + key.value() + " names '" + r->upath + "', not '" +
                          upath + "': producer and consumer use different DYAD_KEY_DEPTH/BINS?",
                      EPROTO);
    return r;
}

Status Lookup::lookup_failure(Status s, const std::string& upath, bool should_wait, bool look_once,
                              const ServiceInfo& svc) const {
    if (look_once && s.rc() == DYAD_RC_NOTFOUND) s = Status(DYAD_RC_TIMEOUT, "", ETIMEDOUT);
    if (s.rc() == DYAD_RC_TIMEOUT && should_wait)
        return Status(DYAD_RC_TIMEOUT,
                      "'" + upath + "' was not produced within " + seconds_text(cfg_.wait_timeout) +
                          " s (DYAD_WAIT_TIMEOUT): produce it first, or wait longer "
                          "(DYAD_WAIT_TIMEOUT=SECONDS; unset: wait forever)",
                      ETIMEDOUT);
    if (s.rc() == DYAD_RC_NOTFOUND)
        return Status(DYAD_RC_NOTFOUND, "'" + upath + "' has not been produced (yet)", ENOENT);
    if (s.rc() == DYAD_RC_CONNFAIL) return link_.store_failure(s, svc);
    return s.wrap("metadata of '" + upath + "'");
}

Status Lookup::retry_stale(const std::string& path, Record rec, Deadline deadline,
                           const std::function<Status(const Record&)>& once) {
    Status s = once(rec);
    // ESTALE: the file is no longer the one the record describes.
    // - Produced again since the lookup: looked up again and fetched, a few
    //   times at most; a file that keeps being produced again is reported.
    // - Changed since its produce, not produced again (yet): its producer is
    //   writing it again, and the consumer waits for that produce as it
    //   waits for a first one, until DYAD_WAIT_TIMEOUT (looking again every
    //   10 ms at first, then less often, up to every second). A producer
    //   that rewrites a file and produces it again must not make the
    //   consumers that come in between fail (docs/design.md, "Produced
    //   again").
    double pause = kStalePollFirst;
    for (int again = 0; !s && s.err() == ESTALE;) {
        auto up = consumer_relative(path);
        if (!up) break;
        auto fresh = find(up.value(), false, deadline);
        if (!fresh) break;
        if (fresh->generation == rec.generation) {
            if (deadline.expired())
                return Status(s.rc(),
                              s.message() + "; it was not produced again within " +
                                  seconds_text(cfg_.wait_timeout) + " s (DYAD_WAIT_TIMEOUT)",
                              s.err());
            std::this_thread::sleep_for(
                std::chrono::duration<double>(std::min(pause, deadline.remaining())));
            pause = std::min(kStalePollMax, pause * 2);
            continue;
        }
        if (++again > 3) break;
        rec = std::move(fresh.value());
        s = once(rec);
    }
    return s;
}

Status Lookup::list(const std::string& prefix, const std::function<bool(const Record&)>& each) {
    auto svc = link_.service();
    if (!svc) return svc.status();
    auto st = link_.store();
    if (!st) return st.status();
    // Keys are the relative path behind DYAD_KEY_DEPTH hashed levels: only
    // without them can the store itself select by the path's prefix.
    const std::string key_prefix = cfg_.key_depth == 0 ? prefix : std::string();
    const std::string space = link_.ns(svc.value());
    kvs::Store* store = st.value();
    auto fetch = [store, &space, &key_prefix](const std::string& after) {
        return store->list_page(space, key_prefix, after, 0, Deadline::after(timeouts::kList));
    };
    // One page ahead: the store makes the next page while this one is
    // read (two pages in memory at most).
    auto page = fetch("");
    for (;;) {
        if (!page) return link_.store_failure(page.status(), svc.value());
        std::future<Result<kvs::Page>> next;
        if (page->more) next = std::async(std::launch::async, fetch, page->entries.back().first);
        for (auto& [k, e] : page->entries) {
            auto r = Record::from_json(e.value, e.version);
            if (!r || r->upath.compare(0, prefix.size(), prefix) != 0) continue;
            if (!each(r.value())) return Status::ok();  // (next ends with its future)
        }
        if (!next.valid()) return Status::ok();
        page = next.get();
    }
}

Result<std::vector<proto::ReplicaEntry>> Lookup::replicas(const std::string& upath,
                                                          const Record& rec,
                                                          const ServiceInfo& svc) {
    auto st = link_.store();
    if (!st) return st.status();
    auto page = st.value()->list_page(proto::replica_namespace(link_.ns(svc)),
                                      proto::replica_prefix(key_of(upath)), "", 0,
                                      Deadline::after(timeouts::kList));
    if (!page) return page.status();
    std::vector<proto::ReplicaEntry> out;
    for (const auto& entry : page->entries) {
        auto r = proto::ReplicaEntry::parse(entry.second.value);
        // Only a copy of this very produce: the owner's generation, size
        // and mtime (the holder checks the generation again when serving).
        if (!r || r->upath != upath || r->of != rec.owner || r->holder == rec.owner ||
            r->generation != rec.generation || r->size != rec.size || r->mtime_ns != rec.mtime_ns)
            continue;
        out.push_back(std::move(r.value()));
    }
    return out;
}

}  // namespace dyad::client
