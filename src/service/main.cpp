// SPDX-License-Identifier: Apache-2.0
// dyadd: the DYAD service of one node.
#include <pthread.h>

#include <fcntl.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include <CLI/CLI.hpp>
#include <dyad/dyad_version.h>

#include "common/config.hpp"
#include "common/log.hpp"
#include "common/settings.hpp"
#include "common/trace.hpp"
#include "kvs/etcd/etcd_store.hpp"
#include "ledger_journal.hpp"
#include "metrics_http.hpp"
#include "proto/publish.hpp"
#include "replica_pull.hpp"
#include "rpc/wire.hpp"
#include "service.hpp"

namespace {

// dyadd's exit codes use the numbers of the dyad tool's for the same
// meanings (docs/user-guide.md).
constexpr int kUsage = 1;    // bad option or value: nothing was started
constexpr int kNetwork = 4;  // cannot listen, or the --kvs store is unreachable
constexpr int kOther = 6;    // any other start-up failure

constexpr const char* kExitCodes =
    "Exit codes:\n"
    "  0  stopped by SIGTERM or SIGINT\n"
    "  1  usage or configuration error: bad option or value, bad DYAD_* variable, unusable\n"
    "     key file or producer directory, a --listen not allowed without a key, another\n"
    "     dyadd already serving this --node, producer directory or --socket\n"
    "  4  cannot listen on --listen/--socket (address in use?), or the metadata store of\n"
    "     --kvs is unreachable or not a DYAD service\n"
    "  6  other start-up failure\n";

int start_failure_code(const dyad::Status& s) {
    if (s.err() == EBUSY) return kUsage;  // another dyadd holds this id, directory or socket
    switch (s.rc()) {
        case DYAD_RC_CONNFAIL:
            return kNetwork;
        case DYAD_RC_NOCTX:
        case DYAD_RC_NOAUTH:  // no key for a non-loopback --listen, or not the store's key
        case DYAD_RC_BADMANAGEDPATH:
        case DYAD_RC_BADDTLMODE:
        case DYAD_RC_BAD_CLI_PARSE:
        case DYAD_RC_MARGO_BAD_PROTO:
            return kUsage;
        default:
            return kOther;
    }
}

// What the command line gives besides Options (texts parsed after it).
struct Args {
    dyad::service::Options o;
    std::vector<std::string> allow_uids;
    std::string info_log, error_log, memory, metrics_listen, transports, trace;
    std::string store_max, store_ns_bytes, rank, memory_per_peer;
    std::string request_bytes_per_peer, request_bytes;
    std::string replica_space;
    double lease_ttl = 10;
    bool no_publish_ledger = false;  // --no-publish-ledger
    bool store_late = false;         // --store-late
    int ready_fd = -1;               // --ready-fd
    // Where --metrics-listen binds (parsed from it).
    std::string metrics_host;
    uint16_t metrics_port = 0;
};

// "dyadd: MSG" on stderr; returns `code` (the exit code).
int fail(int code, const std::string& msg) {
    std::fprintf(stderr, "dyadd: %s\n", msg.c_str());
    return code;
}

// Settings (table defaults, DYAD_CONFIG_FILE, environment) are the
// defaults of the command line, which overrides them.
void defaults_from_settings(dyad::service::Options& o) {
    namespace settings = dyad::settings;
    o.producer_dir = settings::text("DYAD_PATH_PRODUCER");
    if (auto m = settings::lookup("DYAD_DTL_MODE"); m.source != settings::Source::defaults)
        o.mode = m.text;
    if (auto n = settings::text("DYAD_KVS_NAMESPACE"); !n.empty()) o.ns = n;
    if (auto n = settings::text("DYAD_NODE_ID"); !n.empty()) o.node = n;
    o.figures = settings::text("DYAD_DTL_FIGURES");
    o.auth_key = settings::text("DYAD_AUTH_KEY_FILE");
}

// The service: directory, transports, listeners, logs.
void add_service_options(CLI::App& app, Args& a) {
    auto& o = a.o;
    auto& info_log = a.info_log;
    auto& error_log = a.error_log;
    auto& metrics_listen = a.metrics_listen;
    auto& lease_ttl = a.lease_ttl;
    auto& transports = a.transports;
    auto& memory = a.memory;
    app.add_option("producer_dir", o.producer_dir,
                   "producer-managed directory (default: $DYAD_PATH_PRODUCER)");
    app.add_flag("-d,--debug", o.debug, "debug logging");
    app.add_option("-m,--mode", o.mode,
                   "default transport: FLUX_RPC (alias STREAM); every built one is served")
        ->capture_default_str();
    app.add_option("-i,--info_log", info_log, "write info/debug log lines to FILE");
    app.add_option("-e,--error_log", error_log, "write warning/error log lines to FILE");
    app.add_option("--trace", a.trace,
                   "write a Chrome trace-event file of what this dyadd serves (publishes, "
                   "fetches, store requests) into DIR, for Perfetto (default: $DYAD_TRACE)");
    app.add_option("--namespace", o.ns,
                   "metadata namespace (default: $DYAD_KVS_NAMESPACE or 'dyad')");
    app.add_option("--node", o.node,
                   "node id of this service (default: $DYAD_NODE_ID or the host name); one "
                   "running dyadd per id and per producer directory");
    app.add_option("--listen", o.listen, "TCP HOST:PORT to serve on ('' for none)")
        ->capture_default_str();
    app.add_option("--socket", o.socket_path,
                   "also serve on this Unix socket (mode 0600, or 0666 with --allow-uid)");
    app.add_option("--listen-fd", o.listen_fd,
                   "serve on this inherited TCP socket, already bound to --listen's port "
                   "(`dyad job node-up` binds it, so that the job's start does not wait for "
                   "dyadd's)")
        ->check(CLI::Range(3, 1 << 20));
    app.add_option("--socket-fd", o.socket_fd,
                   "serve on this inherited Unix socket, already bound to --socket's path")
        ->check(CLI::Range(3, 1 << 20));
    app.add_option("--ready-fd", a.ready_fd,
                   "write one byte to this inherited descriptor, and close it, once the service "
                   "is ready (accepts and answers)")
        ->check(CLI::Range(3, 1 << 20));
    app.add_option("--metrics-listen", metrics_listen,
                   "serve GET /metrics (Prometheus text format) and GET /healthz over HTTP on "
                   "HOST:PORT (default: off; unauthenticated: prefer a loopback or management "
                   "address; without a key, loopback only)");
    app.add_option("--kvs", o.kvs_uri,
                   "keep metadata in etcd (etcd://HOST:PORT[,HOST:PORT...], the members of one "
                   "etcd cluster), or use the store of the dyadd at tcp://HOST:PORT, instead of "
                   "hosting one");
    app.add_option("--lease-ttl", lease_ttl,
                   "with etcd: seconds this service's registration outlives it (its consumers "
                   "learn it is gone within that time)")
        ->capture_default_str()
        ->check(CLI::Range(1.0, 3600.0));
    app.add_flag("--store-late", a.store_late,
                 "with etcd: be ready (listen, answer) before etcd answers, and reach it, "
                 "check this service id and register in the background; requests wait for it "
                 "meanwhile, each up to its deadline. A wrong password or another live dyadd "
                 "of this --node still ends dyadd (exit code 4, 1), said in its error log. "
                 "`dyad job` starts a job's dyadds so");
    app.add_option("--io-threads", o.io_threads, "threads for file reads")
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
    app.add_option(
           "--send-timeout", o.send_timeout,
           "seconds a transfer may make no progress (consumer not reading) before it is abandoned")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--transports", transports,
                   "serve only these transports, comma-separated (default: every one this build "
                   "has)");
    app.add_flag("!--transports-at-start", o.late_transports,
                 "set up every transport (UCX and libfabric too) before the service is ready; "
                 "by default they are set up right after, and AUTO picks them once they are");
    app.add_option("--memory", memory,
                   "memory for transfer buffers, all consumers together, e.g. 256M (default: "
                   "$DYAD_SERVICE_MEMORY or 256M)");
}

// The metadata store: rank, the embedded store's limits, its state.
void add_store_options(CLI::App& app, Args& a) {
    auto& o = a.o;
    auto& rank = a.rank;
    auto& store_max = a.store_max;
    auto& store_ns_bytes = a.store_ns_bytes;
    app.add_option("--rank", rank,
                   "this node's rank: owner_rank of its files, ctx->rank of its clients "
                   "(default: $DYAD_NODE_RANK, else the resource manager's node rank "
                   "($SLURM_NODEID, $FLUX_TASK_RANK, $PMIX_RANK), else the store assigns one in "
                   "registration order)");
    app.add_option("--store-max", store_max,
                   "bytes of memory the embedded store's records may hold (keys, values and "
                   "~200 bytes per record), e.g. 1G (default 1G); puts beyond it are refused");
    app.add_option("--store-max-records-per-namespace", o.store_max_records_per_ns,
                   "records (keys) one namespace of the embedded store may hold; a put of a new "
                   "key beyond it is refused (EDQUOT)")
        ->capture_default_str()
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
    app.add_option("--store-max-namespaces", o.store_max_namespaces,
                   "namespaces the embedded store may hold (the registry aside); a put in one "
                   "more is refused (EDQUOT)")
        ->capture_default_str()
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 32));
    app.add_option("--store-max-bytes-per-namespace", store_ns_bytes,
                   "bytes of keys and values one namespace of the embedded store may hold, e.g. "
                   "100M (default: --store-max); puts beyond it are refused (EDQUOT)");
    app.add_option("--state-dir", o.state_dir,
                   "where the embedded store keeps its epoch file (store-epoch), so that "
                   "generations never repeat across restarts, and this service its publish "
                   "ledger (published.sqlite), so that the store's host publishes its files "
                   "again when it restarts; keep it as long as consumers keep copies (default: "
                   "PRODUCER_DIR/.dyad)");
    app.add_flag("--no-publish-ledger", a.no_publish_ledger,
                 "keep what this service published in memory only: restarted, the store's host "
                 "then forgets its own files' records (produce them again)");
    app.add_option("--replicas", o.replicas,
                   "copies of every file published here kept by other services, unless its "
                   "producer sets DYAD_REPLICAS (0: none; docs/design.md, \"Replicas\")")
        ->capture_default_str()
        ->check(CLI::Range(uint64_t{0}, dyad::proto::kMaxReplicas));
    app.add_option("--replica-space", a.replica_space,
                   "bytes of other services' files this service keeps as replicas, e.g. 20G "
                   "(default 8G); beyond it new replicas are refused (warned, counted)");
}

// What one peer may hold (docs/security.md), and the key.
void add_cap_options(CLI::App& app, Args& a) {
    auto& o = a.o;
    auto& memory_per_peer = a.memory_per_peer;
    auto& request_bytes_per_peer = a.request_bytes_per_peer;
    auto& request_bytes = a.request_bytes;
    auto& allow_uids = a.allow_uids;
    app.add_option("--idle-timeout", o.idle_timeout,
                   "seconds a connection may stay without a request in flight and without "
                   "traffic before the service closes it (0: never)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--max-connections-per-peer", o.max_connections_per_peer,
                   "connections one peer (a host; on the Unix socket, a process) may have open; "
                   "one more is refused with an error (0: no cap)")
        ->capture_default_str();
    app.add_option("--max-fetches-per-peer", o.max_fetches_per_peer,
                   "fetches one peer may have in progress; one more is refused with EBUSY (0: no "
                   "cap)")
        ->capture_default_str();
    app.add_option("--max-local-per-peer", o.max_local_per_peer,
                   "LOCAL fetches one peer may have holding an open file of the producer "
                   "directory; one more is refused with EBUSY (0: no cap)")
        ->capture_default_str();
    app.add_option("--memory-per-peer", memory_per_peer,
                   "transfer memory the consumers of one peer may read ahead within while "
                   "others wait, e.g. 64M (default: a quarter of --memory); they hold at most "
                   "twice it (a connection holding nothing still gets its first buffer); also "
                   "its share of the MARGO pool");
    app.add_option("--max-request-bytes-per-peer", request_bytes_per_peer,
                   "bytes of arguments the requests in progress of one peer may hold, e.g. 32M "
                   "(default 32M; 0: no cap); one more request is refused with ENOBUFS");
    app.add_option("--max-request-bytes", request_bytes,
                   "bytes of arguments the requests in progress of all peers may hold, e.g. 256M "
                   "(default 256M; 0: no cap); one more request is refused with ENOBUFS");
    app.add_option("--max-wait", o.max_wait,
                   "seconds the service holds one wait for a record (kvs.get wait) before it "
                   "answers TIMEOUT (its client asks again, until its own deadline)")
        ->capture_default_str()
        ->check(CLI::Range(0.1, 86400.0));
    app.add_option("--auth-key", o.auth_key,
                   "the job's key file (dyad keygen FILE): peers must prove they hold it "
                   "(default: $DYAD_AUTH_KEY_FILE)");
    app.add_flag("--insecure", o.insecure,
                 "serve a non-loopback --listen without a key (anyone who reaches the port can "
                 "read every produced file)");
    // One uid per --allow-uid (repeat it for more): a vector option would
    // otherwise take the positional PRODUCER_DIR after it as a second uid.
    app.add_option("--allow-uid", allow_uids,
                   "also admit this uid on the Unix socket (default: dyadd's own uid and root; "
                   "'any' admits every local user); one per option, repeat it for more")
        ->allow_extra_args(false);
}

// --allow-uid and --transports, from their texts: -1, or the exit code.
int parse_lists(Args& a) {
    for (const auto& u : a.allow_uids) {
        if (u == "any") {
            a.o.allow_any_uid = true;
            continue;
        }
        char* end = nullptr;
        unsigned long v = std::strtoul(u.c_str(), &end, 10);
        if (u.empty() || *end != '\0' || v > 0xffffffffUL)
            return fail(kUsage, "--allow-uid '" + u + "' is not a uid or 'any'");
        a.o.allow_uids.push_back(static_cast<uint32_t>(v));
    }
    const std::string& t = a.transports;
    for (size_t pos = 0; pos < t.size();) {
        size_t comma = t.find(',', pos);
        if (comma == std::string::npos) comma = t.size();
        if (comma > pos) a.o.transports.push_back(t.substr(pos, comma - pos));
        pos = comma + 1;
    }
    return -1;
}

// Options given on the command line become settings (so `dyad service
// status` reports them as such), then every setting is checked; the SIZE
// options are parsed. -1, or the exit code.
int apply_settings(const CLI::App& app, Args& a) {
    namespace settings = dyad::settings;
    auto& o = a.o;
    if (!a.memory.empty()) settings::set_option("DYAD_SERVICE_MEMORY", a.memory);
    if (app.count("--mode")) settings::set_option("DYAD_DTL_MODE", o.mode);
    if (app.count("--namespace")) settings::set_option("DYAD_KVS_NAMESPACE", o.ns);
    if (app.count("--node")) settings::set_option("DYAD_NODE_ID", o.node);
    if (app.count("producer_dir")) settings::set_option("DYAD_PATH_PRODUCER", o.producer_dir);
    if (app.count("--auth-key")) settings::set_option("DYAD_AUTH_KEY_FILE", o.auth_key);
    if (app.count("--rank")) settings::set_option("DYAD_NODE_RANK", a.rank);
    if (app.count("--trace")) settings::set_option("DYAD_TRACE", a.trace);
    if (dyad::Status s = settings::check("dyadd"); !s) return fail(kUsage, s.message());
    auto m = settings::size("DYAD_SERVICE_MEMORY");
    if (!m) return fail(kUsage, m.status().message());
    o.memory = m.value();
    const std::pair<const char*, std::pair<const std::string*, uint64_t*>> sizes[] = {
        {"--store-max", {&a.store_max, &o.store_max}},
        {"--store-max-bytes-per-namespace", {&a.store_ns_bytes, &o.store_max_bytes_per_ns}},
        {"--memory-per-peer", {&a.memory_per_peer, &o.memory_per_peer}},
        {"--max-request-bytes-per-peer",
         {&a.request_bytes_per_peer, &o.max_request_bytes_per_peer}},
        {"--max-request-bytes", {&a.request_bytes, &o.max_request_bytes}},
        {"--replica-space", {&a.replica_space, &o.replica_space}}};
    for (const auto& [name, v] : sizes) {
        if (v.first->empty()) continue;
        auto n = dyad::parse_size(name, *v.first);
        if (!n) return fail(kUsage, n.status().message());
        *v.second = n.value();
    }
    return -1;
}

// This node's rank: --rank / DYAD_NODE_RANK, else the resource manager's
// node rank, else none (the store assigns one). -1, or the exit code.
int apply_rank(const CLI::App& app, dyad::service::Options& o) {
    namespace settings = dyad::settings;
    if (settings::lookup("DYAD_NODE_RANK").set()) {
        auto r = settings::count("DYAD_NODE_RANK", 0, UINT32_MAX - 1);
        if (!r) return fail(kUsage, r.status().message());
        o.rank = r.value();
        o.rank_source = app.count("--rank") ? "--rank" : "DYAD_NODE_RANK";
        return -1;
    }
    // One dyadd per node, started by the resource manager: its node rank.
    for (const char* var : {"SLURM_NODEID", "FLUX_TASK_RANK", "PMIX_RANK"}) {
        auto v = settings::foreign(var);
        if (!v || v->empty()) continue;
        auto r = dyad::parse_uint(var, *v, 0, UINT32_MAX - 1);
        if (!r) {
            std::fprintf(stderr, "dyadd: ignoring %s\n", r.status().message().c_str());
            continue;
        }
        o.rank = r.value();
        o.rank_source = var;
        break;
    }
    return -1;
}

// The log level and files. -1, or the exit code.
int apply_logging(const Args& a) {
    auto lv = dyad::log_level(dyad::log::Level::info);
    if (!lv) return fail(kUsage, lv.status().message());
    dyad::log::set_level(a.o.debug ? dyad::log::Level::debug : lv.value());
    if (!a.info_log.empty() && !dyad::log::set_info_file(a.info_log))
        return fail(kUsage, "cannot open info log '" + a.info_log + "'");
    if (!a.error_log.empty() && !dyad::log::set_error_file(a.error_log))
        return fail(kUsage, "cannot open error log '" + a.error_log + "'");
    return -1;
}

// --metrics-listen, checked before anything starts. -1, or the exit code.
int check_metrics_listen(Args& a) {
    if (a.metrics_listen.empty()) return -1;
    auto u = dyad::rpc::parse_uri("tcp://" + a.metrics_listen);
    if (!u) return fail(2, "--metrics-listen '" + a.metrics_listen + "' is not HOST:PORT");
    a.metrics_host = u->host;
    a.metrics_port = u->port;
    // Every listener of a keyless dyadd is on loopback (docs/security.md).
    if (a.o.auth_key.empty() && !a.o.insecure && !dyad::service::is_loopback_host(a.metrics_host))
        return fail(kUsage, "--metrics-listen " + a.metrics_listen +
                                " is reachable from other machines, and this dyadd has no key: "
                                "without one it serves loopback only. Give --metrics-listen "
                                "127.0.0.1:PORT (a local agent can scrape it), give --auth-key "
                                "FILE, or --insecure");
    return -1;
}

// --kvs etcd://...: connects (dyadd alone links the etcd client). -1, or
// the exit code.
int connect_etcd(Args& a) {
    auto& o = a.o;
    if (o.kvs_uri.rfind("etcd://", 0) != 0) {
        if (a.store_late) return fail(kUsage, "--store-late is for --kvs etcd://...");
        return -1;
    }
    auto eps = dyad::kvs::etcd::parse_uri(o.kvs_uri);
    if (!eps) return fail(kUsage, "--kvs: " + eps.status().message());
    dyad::kvs::etcd::Options eo;
    eo.endpoints = eps.value();
    if (auto sec = dyad::kvs::etcd::parse_uri_security(o.kvs_uri, &eo.security); !sec)
        return fail(kUsage, "--kvs: " + sec.message());
    eo.lease_ttl = a.lease_ttl;
    eo.limits.max_records_per_ns = o.store_max_records_per_ns;
    if (a.store_late) {  // reached once the service is ready
        std::string where;
        for (const auto& e : eo.endpoints) where += (where.empty() ? "" : ",") + e;
        o.late_store = std::make_shared<dyad::kvs::LateStore>("etcd", where, o.kvs_uri);
        o.connect_store = [eo](double seconds) { return dyad::kvs::etcd::connect(eo, seconds); };
        return -1;
    }
    auto st = dyad::kvs::etcd::connect(eo, 10);
    if (!st) return fail(kNetwork, st.status().to_string());
    o.external_store = st.value();
    return -1;
}

// The metrics endpoint: bound before the service starts (a taken port fails
// before the service registers anywhere), served once it runs.
dyad::Result<std::unique_ptr<dyad::service::MetricsHttp>> bind_metrics(
    Args& a, dyad::service::Service& svc) {
    auto metrics = std::make_unique<dyad::service::MetricsHttp>(dyad::service::MetricsSource{
        [&svc](std::function<void(std::string)> done) { svc.metrics(std::move(done)); },
        [&svc](std::function<void(bool, std::string)> done) { svc.health(std::move(done)); }});
    auto ep = metrics->listen(a.metrics_host, a.metrics_port);
    if (!ep) return ep.status();
    // Unauthenticated, like any Prometheus endpoint: it shows counts and
    // sizes, never a path, a file's bytes or a key (docs/security.md).
    if (!dyad::service::is_loopback_host(a.metrics_host))
        DYAD_WARN("dyadd",
                  "metrics and health on %s are served without authentication to anyone who "
                  "can reach that port (counters only: no paths, data or keys)",
                  ep.value().c_str());
    svc.set_metrics_endpoint("http://" + ep.value() + "/metrics");
    a.metrics_listen = ep.value();
    return metrics;
}

// Starts the service and runs it until SIGTERM/SIGINT; the exit code.
// `old`: the signal mask to restore once every transport is set up.
int serve(Args& a, const sigset_t& old) {
    // The service holds the only reference to an external store: it ends
    // the store's threads before its own loop goes (a wait answered after
    // that would post to a destroyed loop).
    if (!a.no_publish_ledger) a.o.open_journal = dyad::service::open_sqlite_journal;
    a.o.pull_replica = dyad::service::make_replica_puller(a.o.send_timeout);
    // Once every transport is set up (UCX and libfabric after the start):
    // our crash handler over theirs, and SIGTERM/SIGINT let through (they
    // wait, blocked, while a library may hold them: see main()).
    a.o.late_started = [old] {
        dyad::log::install_crash_handler();
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
    };
    dyad::service::Service svc(std::move(a.o));
    svc.catch_signals();  // (asio's handlers, kept over what the transports install)
    std::unique_ptr<dyad::service::MetricsHttp> metrics;
    if (!a.metrics_listen.empty()) {
        auto m = bind_metrics(a, svc);
        if (!m) return fail(1, m.status().message());
        metrics = std::move(m.value());
    }
    dyad::Status s = svc.start();
    if (!s) return fail(start_failure_code(s), s.to_string());
    if (a.ready_fd >= 0) {  // (whoever started us knows we are ready)
        const char r = 'r';
        ssize_t n;
        while ((n = ::write(a.ready_fd, &r, 1)) < 0 && errno == EINTR) {
        }
        ::close(a.ready_fd);
    }
    if (metrics) {
        metrics->start();
        DYAD_INFO("dyadd", "metrics on http://%s/metrics, health on http://%s/healthz",
                  a.metrics_listen.c_str(), a.metrics_listen.c_str());
    }
    // Last: these replace what transport libraries installed while loading
    // (UCX's backtrace printer; the plugin loader already undid PSM's
    // `.btr` file writer): a crash goes to our error log, nowhere else.
    dyad::log::install_crash_handler();
    svc.run(true);
    if (metrics) metrics->stop();
    // --store-late: the store refused this service for good (logged).
    if (auto f = svc.store_failure())
        return fail(f->connecting ? kNetwork : start_failure_code(f->why), f->why.to_string());
    DYAD_INFO("dyadd", "stopped");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::signal(SIGPIPE, SIG_IGN);
    Args a;
    defaults_from_settings(a.o);
    CLI::App app{
        "dyadd: the DYAD service of one node. Serves the files of its producer directory to\n"
        "consumers on any node and hosts the metadata store (unless --kvs is given)."};
    app.set_version_flag("--version", std::string("dyadd ") + dyad_version(),
                         "print the version and exit");
    add_service_options(app, a);
    add_store_options(app, a);
    add_cap_options(app, a);
    app.footer(kExitCodes);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);  // --help
        std::fprintf(stderr, "dyadd: %s (see 'dyadd --help')\n", e.what());
        return kUsage;
    }
    // Inherited descriptors go to no child of ours.
    for (int fd : {a.o.listen_fd, a.o.socket_fd, a.ready_fd})
        if (fd >= 0 && ::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
            return fail(kUsage, "descriptor " + std::to_string(fd) +
                                    " (--listen-fd, --socket-fd or --ready-fd) is not open");
    if (int rc = parse_lists(a); rc >= 0) return rc;
    if (int rc = apply_settings(app, a); rc >= 0) return rc;
    if (int rc = apply_rank(app, a.o); rc >= 0) return rc;
    if (int rc = apply_logging(a); rc >= 0) return rc;
    dyad::trace::start_from_settings("dyadd");  // DYAD_TRACE / --trace: a warning at worst
    if (int rc = check_metrics_listen(a); rc >= 0) return rc;
    // SIGTERM/SIGINT wait (blocked, in every thread the service starts)
    // until start-up is over: some transport libraries install handlers of
    // their own while they initialise, which end the process with exit code 1.
    // Ours go in last, then the signals are let through to this thread.
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGINT);
    sigaddset(&term, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &term, &old);
    if (int rc = connect_etcd(a); rc >= 0) return rc;
    return serve(a, old);
}
