// dyad: command-line tool for DYAD (produce, consume, stat, ls, config,
// keygen, service status).
#include <csignal>
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <dyad/dyad_version.h>

#include "client/client.hpp"
#include "common/auth.hpp"
#include "common/config.hpp"
#include "common/settings.hpp"
#include "common/keygen.hpp"
#include "dtl/dtl.hpp"

namespace {

constexpr const char* kExitCodes =
    "Exit codes:\n"
    "  0  success\n"
    "  1  usage or configuration error (bad option, bad DYAD_* variable)\n"
    "  2  file problem: not produced, not under a managed directory, missing or unreadable\n"
    "  3  timeout: the file was not produced within --timeout / DYAD_WAIT_TIMEOUT\n"
    "  4  the DYAD service (or the owner's service) could not be reached\n"
    "  5  transfer failed or the received file did not match its checksum\n"
    "  6  other error\n";

int exit_code(const dyad::Status& s) {
    return dyad::rc_exit_code(s.rc());
}

int report(const dyad::Status& s, const std::string& what) {
    std::fprintf(stderr, "dyad %s: %s [%s]\n", what.c_str(), s.to_string().c_str(),
                 dyad::rc_name(s.rc()));
    return exit_code(s);
}

std::string human_bytes(double b) {
    const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        ++i;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, i ? "%.1f %s" : "%.0f %s", b, u[i]);
    return buf;
}

}  // namespace

int main(int argc, char** argv) {
    std::signal(SIGPIPE, SIG_IGN);
    CLI::App app{
        "dyad: produce and consume files through DYAD, inspect the metadata and the services.\n"
        "Configuration comes from DYAD_* environment variables (see 'dyad config')."};
    app.footer(kExitCodes);
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("dyad ") + dyad_version(),
                         "print the version and exit");
    bool json = false;
    app.add_flag("--json", json, "machine-readable output");

    std::vector<std::string> files;
    double timeout = -1;
    auto* produce = app.add_subcommand("produce", "publish files of DYAD_PATH_PRODUCER");
    produce->add_option("FILE", files, "files to publish")->required();
    auto* consume =
        app.add_subcommand("consume", "wait for files and bring them into DYAD_PATH_CONSUMER");
    consume->add_option("FILE", files, "consumer-side paths")->required();
    bool explain = false;
    consume->add_flag("--explain", explain,
                      "say which transport moved each file and why (DYAD_DTL_MODE=AUTO: every "
                      "candidate with its estimate)");
    consume->add_option("--timeout", timeout,
                        "seconds to wait for each file to be produced (default DYAD_WAIT_TIMEOUT)");
    std::string stat_file;
    auto* stat = app.add_subcommand("stat", "show the metadata of a file");
    stat->add_option("FILE", stat_file, "consumer-side path")->required();
    auto* ls = app.add_subcommand("ls", "list the files produced in the namespace");
    auto* config = app.add_subcommand(
        "config", "print every setting with its value and source, and the transports");
    bool markdown = false;
    config->add_flag("--markdown", markdown,
                     "print the settings table of the user guide (generated from the table)");
    std::string key_path;
    auto* key = app.add_subcommand(
        "key", "print the metadata key of a path relative to a managed directory");
    key->add_option("UPATH", key_path)->required();
    std::string keygen_path;
    auto* keygen = app.add_subcommand(
        "keygen",
        "write a new job key (32 random bytes, mode 0600) for dyadd --auth-key and "
        "DYAD_AUTH_KEY_FILE");
    keygen->add_option("FILE", keygen_path, "where to write it (never overwritten)")->required();
    auto* service = app.add_subcommand("service", "ask a service about itself");
    std::string uri;
    auto* status =
        service->add_subcommand("status", "identity, transports and counters of a service");
    status->add_option("--uri", uri, "service to ask (default DYAD_SERVICE_URI)");
    service->require_subcommand(1);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 1;
    }

    if (*keygen) {
        dyad::Status s = dyad::auth::Key::generate(keygen_path);
        if (!s) return report(s, "keygen");
        if (!json)
            std::cout << "wrote a new key to " << keygen_path
                      << " (mode 0600): give it to dyadd --auth-key and to clients as "
                         "DYAD_AUTH_KEY_FILE\n";
        return 0;
    }
    auto cfg = dyad::Config::from_env();
    if (!cfg) return report(cfg.status(), "config");
    if (timeout >= 0) cfg->wait_timeout = timeout;
    dyad::log::set_level(cfg->log_level);

    if (*config && markdown) {
        std::cout << dyad::settings::markdown();
        return 0;
    }
    if (*config) {
        nlohmann::json j = {{"config", cfg->to_json()}, {"settings", dyad::settings::describe()}};
        nlohmann::json t = nlohmann::json::array();
        for (const auto& b : dyad::dtl::backends()) t.push_back(b.attributes().to_json());
        j["transports_built"] = t;
        if (json) {
            std::cout << j.dump(2) << "\n";
        } else {
            // Like `ucx_info -c`: NAME=VALUE, then where the value came from.
            for (const auto& s : j["settings"]) {
                std::string line = s["name"].get<std::string>() + "=" +
                                   (s["value"].is_null() ? "" : s["value"].get<std::string>());
                std::cout << line << std::string(line.size() < 40 ? 40 - line.size() : 1, ' ')
                          << "# " << s["source"].get<std::string>() << "\n";
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
        return 0;
    }
    if (*key) {
        auto k = dyad::gen_path_key(key_path, cfg->key_depth, cfg->key_bins);
        if (!k) return report(k.status(), "key");
        std::cout << k.value() << "\n";
        return 0;
    }

    auto client = dyad::client::Client::create(cfg.value());
    if (!client) return report(client.status(), "init");
    auto& c = *client.value();

    if (*produce) {
        int rc = 0;
        for (const auto& f : files) {
            dyad::Status s = c.produce(f);
            if (!s)
                rc = report(s, "produce");
            else if (!json)
                std::cout << "produced " << f << "\n";
        }
        return rc;
    }
    if (*consume) {
        int rc = 0;
        for (const auto& f : files) {
            dyad::client::ConsumeReport r;
            dyad::Status s = c.consume(f, &r);
            if (!s) {
                rc = report(s, "consume");
                continue;
            }
            if (json) {
                std::cout << nlohmann::json{{"file", f},
                                            {"action", r.action},
                                            {"transport", r.transport},
                                            {"endpoint", r.endpoint},
                                            {"bytes", r.bytes},
                                            {"wait_s", r.wait_s},
                                            {"transfer_s", r.transfer_s},
                                            {"selection", r.selection}}
                                 .dump()
                          << "\n";
            } else {
                std::printf("%s: %s", f.c_str(), r.action.c_str());
                if (r.action == "fetched")
                    std::printf(" %s via %s from %s",
                                human_bytes(static_cast<double>(r.bytes)).c_str(),
                                r.transport.c_str(), r.endpoint.c_str());
                std::printf(" (waited %.3f s, transfer %.3f s)\n", r.wait_s, r.transfer_s);
                if (explain)
                    std::printf("  %s\n", r.explain.empty()
                                              ? (r.action == "fetched"
                                                     ? "fixed transport (DYAD_DTL_MODE)"
                                                     : "nothing moved: the file was already here")
                                              : r.explain.c_str());
            }
        }
        return rc;
    }
    if (*stat) {
        auto r = c.get_metadata(stat_file, false);
        if (!r) return report(r.status(), "stat");
        nlohmann::json j = r->to_json();
        j["generation"] = r->generation;
        j["owner_rank"] = r->owner_rank();
        j["key"] = c.key_of(r->upath);
        if (json)
            std::cout << j.dump(2) << "\n";
        else
            for (auto& [k, v] : j.items())
                std::cout << k << ": " << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
        return 0;
    }
    if (*ls) {
        auto l = c.list();
        if (!l) return report(l.status(), "ls");
        if (json) {
            nlohmann::json a = nlohmann::json::array();
            for (auto& r : l.value()) {
                auto j = r.to_json();
                j["generation"] = r.generation;
                a.push_back(j);
            }
            std::cout << a.dump(2) << "\n";
        } else {
            for (auto& r : l.value())
                std::printf("%12llu  gen %-4llu %-16s %s\n",
                            static_cast<unsigned long long>(r.size),
                            static_cast<unsigned long long>(r.generation), r.owner.c_str(),
                            r.upath.c_str());
        }
        return 0;
    }
    if (*status) {
        auto s = c.service_status(uri);
        if (!s) return report(s.status(), "service status");
        if (json) {
            std::cout << s->dump(2) << "\n";
            return 0;
        }
        auto& j = s.value();
        std::printf("service %s on node %s (pid %d), namespace %s\n",
                    j.value("service_id", "").c_str(), j.value("node", "").c_str(),
                    j.value("pid", 0), j.value("namespace", "").c_str());
        std::printf("producer dir: %s\nmetadata: %s\nendpoints: %s\n",
                    j.value("producer_dir", "").c_str(), j.value("kvs", "").c_str(),
                    j["endpoints"].dump().c_str());
        std::printf("uptime: %.1f s, connections: %d\n", j.value("uptime_s", 0.0),
                    j.value("connections", 0));
        auto& ctr = j["counters"];
        std::printf("requests %llu, served %llu, errors %llu, bytes sent %llu\n",
                    ctr.value("requests", 0ull), ctr.value("served", 0ull),
                    ctr.value("errors", 0ull), ctr.value("bytes_sent", 0ull));
        std::printf(
            "authentication: %s; refused peers %llu, unproduced fetches refused %llu, "
            "stale fetches refused %llu, published %llu\n",
            j.value("auth", std::string("none")).c_str(), ctr.value("auth_refused", 0ull),
            ctr.value("refused_unproduced", 0ull), ctr.value("refused_stale", 0ull),
            ctr.value("published", 0ull));
        for (auto& [name, p] : ctr["per_transport"].items())
            std::printf("  %-10s requests %llu served %llu errors %llu sent %llu received %llu\n",
                        name.c_str(), p.value("requests", 0ull), p.value("served", 0ull),
                        p.value("errors", 0ull), p.value("bytes_sent", 0ull),
                        p.value("bytes_received", 0ull));
        if (j.contains("store"))
            std::printf("store: %llu keys, %llu waiting\n", j["store"].value("keys", 0ull),
                        j["store"].value("waiters", 0ull));
        if (j.contains("metadata_store")) {
            auto& m = j["metadata_store"];
            bool up = m.value("reachable", false);
            std::string backend = m.value("backend", ""), endpoint = m.value("endpoint", "");
            if (backend != endpoint) backend += " at " + endpoint;
            std::printf("metadata store: %s, %s%s%s\n", backend.c_str(),
                        up ? "reachable" : "NOT reachable", up ? "" : ": ",
                        up ? "" : m.value("error", "").c_str());
        }
        if (j.contains("metrics")) std::printf("metrics: %s\n", j.value("metrics", "").c_str());
        return 0;
    }
    return 1;
}
