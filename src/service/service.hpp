// SPDX-License-Identifier: Apache-2.0
// dyadd: the per-node DYAD service. Serves the files of its producer
// directory (dyad.fetch) over every transport it has, hosts the embedded
// metadata store (unless --kvs points at another service's), registers
// itself in the store's service registry, and reports status.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>

#include <shared_mutex>

#include <signal.h>
#include <sys/stat.h>

#include <asio.hpp>
#include <nlohmann/json.hpp>

#include "common/auth.hpp"
#include "common/fd.hpp"
#include "common/status.hpp"
#include "dtl/budget.hpp"
#include "dtl/dtl.hpp"
#include "kvs/record.hpp"
#include "proto/fetch.hpp"
#include "kvs/serve.hpp"
#include "kvs/service_store.hpp"
#include "metrics.hpp"
#include "peer_caps.hpp"
#include "publish_ledger.hpp"
#include "replicas.hpp"
#include "rpc/server.hpp"

namespace dyad::proto {
struct FetchRequest;
}

namespace dyad::service {

using kvs::kServicesNamespace;
class ServedFile;  // serve_file.hpp

struct Options {
    std::string producer_dir;
    std::string mode = "AUTO";
    std::string ns = "dyad";
    std::string node;                       // default: host name
    std::string listen = "127.0.0.1:7627";  // HOST:PORT, "" for none
    std::string socket_path;                // unix socket, "" for none
    std::string kvs_uri;                    // "" hosts the embedded store
    // The store the service talks to itself (--kvs etcd://...; made by
    // dyadd's main, which alone links the etcd client): kvs_uri names it.
    std::shared_ptr<kvs::ServiceStore> external_store;
    // Where the embedded store keeps its epoch (--state-dir; "": the
    // producer directory's .dyad/).
    std::string state_dir;
    // Opens the publish ledger's durable copy in the state directory (dyadd:
    // SQLite, ledger_journal.hpp; unset: the ledger is in memory only).
    std::function<Result<std::unique_ptr<LedgerJournal>>(
        const std::string& state_dir, const std::string& id, const std::string& producer_dir)>
        open_journal;
    unsigned io_threads = 4;
    double send_timeout = 60;             // seconds without progress before a transfer is abandoned
    std::vector<std::string> transports;  // serve only these (empty: every built one)
    std::string figures;                  // DYAD_DTL_FIGURES: overrides of the selector's figures
    uint64_t memory =
        256ull << 20;  // transfer buffers, all consumers together (DYAD_SERVICE_MEMORY)
    bool debug = false;
    std::string auth_key;              // key file (--auth-key, DYAD_AUTH_KEY_FILE); "" for none
    bool insecure = false;             // allow a non-loopback listener without a key
    std::vector<uint32_t> allow_uids;  // more uids allowed on the Unix socket
    bool allow_any_uid = false;
    uint64_t store_max = 1ull << 30;  // bytes the embedded store may hold (--store-max)
    // Quotas of one namespace of the embedded store
    // (--store-max-records-per-namespace, --store-max-bytes-per-namespace; 0: store_max).
    uint64_t store_max_records_per_ns = 1000000;
    uint64_t store_max_namespaces = 4096;  // --store-max-namespaces
    uint64_t store_max_bytes_per_ns = 0;
    // Seconds an authenticated connection may stay idle (--idle-timeout; 0: never).
    double idle_timeout = 120;
    // Caps per peer (docs/security.md, "Caps per peer"; 0: none):
    // connections, fetches in progress, LOCAL fetches holding an open file,
    // and bytes of the memory budget (0: a quarter of it).
    uint64_t max_connections_per_peer = 512;
    uint64_t max_fetches_per_peer = 1024;
    uint64_t max_local_per_peer = 256;
    uint64_t memory_per_peer = 0;
    // Bytes of arguments requests in progress may hold, of one peer and of
    // all (--max-request-bytes-per-peer, --max-request-bytes; 0: no cap).
    uint64_t max_request_bytes_per_peer = 32ull << 20;
    uint64_t max_request_bytes = 256ull << 20;
    // Seconds one kvs.get wait is held before it answers TIMEOUT (--max-wait).
    double max_wait = 60;
    // This node's rank (--rank, DYAD_NODE_RANK, the resource manager's node
    // rank); unset: the store assigns one in registration order.
    std::optional<uint32_t> rank;
    std::string rank_source;  // where `rank` came from, for status and logs
    // Replicas (docs/design.md, "Replicas"): copies per file unless the
    // producer says (--replicas), bytes of others' replicas this service
    // keeps (--replica-space), and how it pulls one (dyadd's main: the
    // client's fetch path; empty: this service holds no replicas).
    uint64_t replicas = 0;
    uint64_t replica_space = 8ull << 30;
    PullFn pull_replica;
    // Start-up (late_transports.cpp): UCX and libfabric are set up on a
    // thread of their own once the service is ready, unless they are
    // --mode or this is false (dyadd --transports-at-start).
    bool late_transports = true;
    // Called on the loop once every transport is set up (at once when none
    // is set up late): dyadd installs its crash handler again and lets
    // SIGTERM/SIGINT through. Meanwhile the late thread keeps the handlers
    // of SIGTERM and SIGINT as they were before (a library's own would end
    // the process).
    std::function<void()> late_started;
};

// True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost).
bool is_loopback_host(const std::string& host);

class Service {
  public:
    explicit Service(Options opts);
    ~Service();
    // Opens the directory, listeners, transports; registers the service.
    Status start();
    // From now on SIGTERM/SIGINT stop the service once its loop runs (call
    // before start(), so a signal during start-up is not lost).
    void catch_signals();
    // Runs the loop until stop() (or SIGTERM/SIGINT when handle_signals).
    void run(bool handle_signals);
    void stop();

    const std::string& id() const { return id_; }
    const std::vector<std::string>& endpoints() const { return endpoints_; }

    // For the metrics endpoint (dyadd --metrics-listen), from any thread.
    // Calls done on the service's loop with the Prometheus text (format
    // 0.0.4) of every metric, taken in one turn of the loop: a consistent
    // snapshot. done is never called once the loop has stopped.
    void metrics(std::function<void(std::string text)> done);
    // Calls done (on the loop, or on the thread probing a remote metadata
    // store) with whether the service runs and its metadata store answers;
    // why says what is wrong otherwise.
    void health(std::function<void(bool ok, std::string why)> done);
    // Where the metrics are served ("" for nowhere), for status. Before run().
    void set_metrics_endpoint(std::string url) { metrics_endpoint_ = std::move(url); }

  private:
    // The fetch counters `dyad service status` shows (and the metrics, which
    // read the same ones). total_.requests stays 0: all fetch requests are
    // counted by metrics_ (kind fetch), per transport here.
    struct Counters {
        uint64_t requests = 0;
        uint64_t served = 0;
        uint64_t errors = 0;
        uint64_t bytes_sent = 0;
        uint64_t bytes_received = 0;
        uint64_t in_flight = 0;  // transfers sending now
    };

    // The served file as the transfer started.
    struct Snapshot {
        uint64_t ino = 0, size = 0;
        int64_t mtime_ns = 0, ctime_ns = 0;
        static Snapshot of(const struct stat& sb) {
            auto ns = [](const struct timespec& t) {
                return static_cast<int64_t>(t.tv_sec) * 1000000000LL + t.tv_nsec;
            };
            return {static_cast<uint64_t>(sb.st_ino), static_cast<uint64_t>(sb.st_size),
                    ns(sb.st_mtim), ns(sb.st_ctim)};
        }
        bool operator==(const Snapshot& o) const {
            return ino == o.ino && size == o.size && mtime_ns == o.mtime_ns &&
                   ctime_ns == o.ctime_ns;
        }
    };

    // ---- serving files (fetch.cpp, fetch_many.cpp, whole_file.cpp, serve_file.cpp) ----
    struct PendingFetch;  // a dyad.fetch waiting for its file (fetch.cpp)
    struct ManyFile;      // one file of a dyad.fetch_many (fetch_many.cpp)
    void on_fetch(std::shared_ptr<rpc::Request> r);
    // The served transport a fetch asks for (canonical name; the universal
    // backend when it names none), or why it is not served.
    Result<std::string> transport_served(const nlohmann::json& args);
    // Many small files of this service in one request, over the stream
    // (fetch_many.cpp).
    void on_fetch_many(std::shared_ptr<rpc::Request> r);
    // One of them (file thread): taken as a fetch takes it, but a file its
    // producer holds is EBUSY, not waited for; read whole (read_whole),
    // `front` bytes kept free before it.
    struct Whole;
    Result<Whole> read_small(const proto::FetchRequest& req, const rpc::Peer& who, uint64_t owner,
                             uint64_t peer, size_t front);
    // Their answers and END, on the loop.
    void answer_many(const std::shared_ptr<rpc::Request>& r,
                     const std::shared_ptr<std::vector<ManyFile>>& files,
                     const std::string& transport, std::chrono::steady_clock::time_point t0,
                     bool raw);
    // The steps both requests share once the file is open (file thread,
    // serve_file.hpp): ServedFile::take (lock without waiting, stat, a
    // regular file), then check_served and readable_by. EAGAIN: its
    // producer holds it. *snap: the file as it is now.
    Status take_served(ServedFile& f, const proto::FetchRequest& req, const rpc::Peer& peer,
                       Snapshot* snap);
    void on_publish(std::shared_ptr<rpc::Request> r);
    // Replicas (replicas.hpp): the holder's dyad.replicate; the owner's
    // pushes after a publish (answers r, at once or once k copies are
    // durable with `sync`).
    void on_replicate(std::shared_ptr<rpc::Request> r);
    void on_replicate_many(std::shared_ptr<rpc::Request> r);
    void on_unreplicate(std::shared_ptr<rpc::Request> r);
    void replicate_then_answer(const std::shared_ptr<rpc::Request>& r, nlohmann::json answer,
                               const std::string& ns, uint64_t k, bool sync);
    Status start_replicas();
    // A replica fetch's file, beneath the namespace's replica directory.
    Result<ServedFile> open_replica(const proto::FetchRequest& req);
    void on_unpublish(std::shared_ptr<rpc::Request> r);
    Result<nlohmann::json> unpublish(const std::string& upath, const std::string& ns,
                                     unsigned depth, unsigned bins);
    Result<nlohmann::json> publish(const std::string& upath, const std::string& ns, unsigned depth,
                                   unsigned bins, uint64_t replaces, const rpc::Request& from);
    // Whether `from` may publish `up` (open as `sb`): access.hpp.
    Status may_publish(const rpc::Request& from, const std::string& up, const struct stat& sb);
    // The record publish() writes for the file `up` as `sb` says it is.
    kvs::Record record_of(const std::string& up, const struct stat& sb) const;
    // Registers again in the remote store and publishes again every file
    // still as published, counting them in `republished`; false: not
    // finished (the store's kvs::Rejoin).
    bool rejoin(const std::function<bool()>& stopping, uint64_t& republished);
    // The parts of start(), in order: the producer directory (and its
    // lock), the transports' senders, the rpc server (listeners bound,
    // handlers), the metadata store (--kvs: built, served, registered in).
    Status open_producer_dir();
    Status start_senders(const std::string& mode);
    Status start_server();
    Status start_store();
    // After start_store, before serving: opens the ledger's durable copy;
    // the store's host publishes again what it published before it
    // restarted (docs/design.md, "The embedded store across restarts").
    Status restore_published();
    // Without a key, a peer that is not this service's uid nor root is
    // served only a file its own uid could read (docs/security.md,
    // "Keyless peers read what their uid may read").
    // Where the file was opened as the peer (opens_as_peer), the kernel
    // decided; otherwise (a dyadd that cannot take other users'
    // credentials) the file's permission classes decide. A replica is
    // served to such a peer only by a service that opens as itself for it
    // (the holder cannot tell who may read the original).
    Status readable_by(const rpc::Peer& peer, const struct stat& sb, const std::string& up,
                       bool replica = false);
    // Whether a file served to `peer` is opened with its credentials
    // (access.hpp): no key, a peer other than dyadd's uid and root, and a
    // dyadd that can (root).
    bool opens_as_peer(const rpc::Peer& peer) const;
    // `up` in the producer directory, opened as `peer` would open it when
    // opens_as_peer(peer), else as the service (file thread).
    Result<ServedFile> open_for(const rpc::Peer& peer, const std::string& up);
    // A keyless publish or unpublish of `up` by `peer`: allowed to dyadd's
    // uid and root, else only for the uid that published it (access.cpp);
    // `absent_ok`: also when this service has not published it.
    Status may_change(const rpc::Peer& peer, const std::string& up, const char* what,
                      bool absent_ok);
    // Whether the file as `sb` (its fstat under the lock) says it is, is `up`
    // as this service published it (`req`: the fetch's ns, key and
    // generation): its snapshot if so.
    Status check_served(const proto::FetchRequest& req, const struct stat& sb,
                        const std::string& up, Snapshot* snap);
    // The metadata store, timed (from a file thread).
    Result<uint64_t> store_put(const std::string& ns, const std::string& key,
                               const std::string& value, uint64_t replaces = 0);
    Result<kvs::Entry> store_get(const std::string& ns, const std::string& key);
    void on_status(std::shared_ptr<rpc::Request> r);
    // Opens a regular file beneath the producer directory (errors say why
    // not), for a publish or a re-join (serve_file.cpp).
    Result<UniqueFd> open_served_file(const std::string& upath);
    // Takes the file of a fetch (take_served), waiting while its producer
    // holds it locked, then starts the transfer (file thread, fetch.cpp).
    void try_lock(std::shared_ptr<PendingFetch> p, int attempt);
    // The transfer's job, with the file taken from `p`.
    std::shared_ptr<dtl::FetchJob> fetch_job(PendingFetch& p);
    // A byte range that starts inside the file `sb` (or no range): ok; else
    // BADFIO / ERANGE naming the file and its size.
    static Status range_within(const proto::FetchRequest& req, const struct stat& sb);
    // A small file over the stream: read, hashed and checked on this file
    // thread, then sent with its END in one go (whole_file.cpp). False: not
    // taken (too large, another transport, no memory now): start_send.
    bool send_whole(const std::shared_ptr<rpc::Request>& r, const std::string& transport,
                    const std::shared_ptr<dtl::FetchJob>& job, const Snapshot& snap);
    // A small file (`n` bytes, at most dtl::kFetchManyFileMax) read whole
    // into a buffer of the budget (owner, peer), hashed, and checked still
    // as `snap` (file thread). EAGAIN: no memory now; ESTALE: it changed.
    // `front` bytes are kept free before the file's bytes in buf (the
    // header of a compact dyad.fetch_many answer). `from`: where the `n`
    // bytes start in the file (a byte range).
    struct Whole {
        uint64_t size = 0;  // of the file (buf may be larger)
        dtl::Buffer buf;
        uint64_t digest = 0;
        std::string xxh3;  // the digest in hex
    };
    Result<Whole> read_whole(int fd, const std::string& upath, size_t n, const Snapshot& snap,
                             uint64_t owner, uint64_t peer, size_t front = 0, uint64_t from = 0);
    // Closes r's connection if what was queued for it is not written within
    // --send-timeout (a consumer that takes nothing); cancel once written.
    std::shared_ptr<asio::steady_timer> send_watchdog(const std::shared_ptr<rpc::Request>& r);
    // The END of a sent file, or the error if it changed while being read.
    void end_send(const std::shared_ptr<rpc::Request>& r, const std::string& transport,
                  const dtl::FetchJob& job, bool unchanged, const std::string& xxh);
    void start_send(std::shared_ptr<rpc::Request> r, std::string transport,
                    std::shared_ptr<dtl::FetchJob> job, std::shared_ptr<const Snapshot> snap);
    void release_fd(const std::shared_ptr<dtl::FetchJob>& job);
    nlohmann::json identity() const;
    nlohmann::json status_json() const;
    // The metadata store this service uses: backend, endpoint, reachable.
    nlohmann::json store_json(bool reachable, const std::string& why) const;
    std::string metrics_text() const;  // loop only
    void fail(const std::shared_ptr<rpc::Request>& r, const std::string& transport,
              const Status& st);

    Options opts_;
    // Before the loop and the pool: handlers still queued there when the
    // service is destroyed may hold buffers, which return to the budget.
    std::unique_ptr<dtl::MemoryBudget> budget_;
    std::shared_ptr<PeerCaps> caps_;
    std::string id_;
    std::optional<uint32_t> rank_;  // known once registered
    std::string rank_source_;
    std::string prod_dir_;  // canonical
    UniqueFd prod_fd_;
    UniqueFd prod_lock_;     // flock on <producer dir>/.dyad/service.lock: one dyadd per dir
    dtl::ServiceBind bind_;  // where every listener binds (the listen policy)
    asio::io_context io_;
    asio::thread_pool file_pool_;
    // Sees every request of server_ (counts by kind, store and wait
    // histograms, request log lines); requests keep a reference.
    std::shared_ptr<RequestMetrics> metrics_ = std::make_shared<RequestMetrics>();
    std::unique_ptr<rpc::Server> server_;
    std::shared_ptr<const auth::Key> key_;
    // The metadata store (embedded, another dyadd's, or etcd), and its
    // topics served to this service's clients (unless they ask its host).
    std::shared_ptr<kvs::ServiceStore> store_;
    std::unique_ptr<kvs::StoreServer> store_server_;
    PublishLedger ledger_;  // what this service published
    std::unique_ptr<Replicas> replicas_;
    // Pulls of replicas (they block for a whole transfer: not file_pool_).
    asio::thread_pool replica_pool_{2};
    std::atomic<uint64_t> published_count_{0}, refused_unproduced_{0}, refused_stale_{0};
    std::atomic<uint64_t> refused_unreadable_{0};    // keyless peers refused a file (readable_by)
    std::atomic<uint64_t> refused_not_producer_{0};  // keyless publishes/unpublishes refused
    bool act_as_users_ = false;  // can take consumers' credentials (root): access.hpp
    std::vector<std::string> endpoints_;
    std::map<std::string, std::unique_ptr<dtl::Sender>> senders_;
    std::map<std::string, std::string> unavailable_;  // transport -> why it is not served
    std::vector<dtl::TransportRecord> records_;       // published for the AUTO selector
    std::map<std::string, Counters> per_transport_;
    Counters total_;
    std::map<std::string, std::unique_ptr<Histogram>> transfer_seconds_;             // by transport
    Histogram store_calls_[2] = {Histogram(kFastBuckets), Histogram(kFastBuckets)};  // put, get
    std::string metrics_endpoint_;
    std::chrono::system_clock::time_point started_wall_;
    uint64_t rejected_ = 0;
    std::chrono::steady_clock::time_point started_;
    std::optional<asio::signal_set> signals_;

    // ---- transports set up after the service is ready (late_transports.cpp) ----
    // Keeps the handlers of SIGTERM and SIGINT (asio's) across transport
    // set-ups: a library's own would end the process at the next signal.
    struct KeepSignalHandlers {
        KeepSignalHandlers();
        ~KeepSignalHandlers();
        struct sigaction before[2];
    };
    // Whether backend `b` is set up late (not the universal one, not LOCAL,
    // not --mode `mode`).
    bool starts_late(const dtl::Backend& b, const std::string& mode) const;
    // DYAD_DTL_FIGURES items naming a late transport: put aside (applied
    // once it is set up), checked now against placeholders.
    Status set_aside_late_figures();
    // Starts the thread; its senders are installed on the loop
    // (install_late), then the service registers again with their records.
    void start_late_transports();
    void install_late(const std::string& name, Result<std::unique_ptr<dtl::Sender>> made,
                      double seconds);
    // A fetch asking for a transport still being set up: held (true) until it is.
    bool held_for_late(const std::shared_ptr<rpc::Request>& r);
    void stop_late_transports();             // first thing of ~Service
    std::vector<const dtl::Backend*> late_;  // to set up (start_senders)
    std::string late_figures_;               // their DYAD_DTL_FIGURES items
    std::set<std::string> starting_;         // loop: not yet installed
    std::map<std::string, std::vector<std::shared_ptr<rpc::Request>>> held_;  // loop
    std::thread late_thread_;
    std::atomic<bool> late_stop_{false};
    // records_ grows on the late thread; identity() reads it from any thread.
    mutable std::mutex records_mu_;
};

}  // namespace dyad::service
