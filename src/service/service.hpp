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
#include "proto/identity.hpp"
#include "kvs/serve.hpp"
#include "kvs/service_store.hpp"
#include "core.hpp"
#include "file_server.hpp"
#include "metrics.hpp"
#include "options.hpp"
#include "peer_caps.hpp"
#include "publisher.hpp"
#include "replica_holder.hpp"
#include "status_reporter.hpp"
#include "rpc/server.hpp"

namespace dyad::proto {
struct FetchRequest;
}

namespace dyad::service {

using kvs::kServicesNamespace;

// True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost).
bool is_loopback_host(const std::string& host);
// One live dyadd per service id: `held` (the registry's entry for `id`, if
// any) must not name a dyadd that still answers as `id` (other than this
// one); one nobody answers for is stale and may be replaced. EBUSY naming
// it otherwise; `store` names the store in the message.
Status refuse_if_live(const std::string& id, const Result<kvs::Entry>& held,
                      std::shared_ptr<const auth::Key> key, const std::string& store);

// The service of one node: its life cycle (start, run, stop) and its
// identity (id, rank, endpoints, transports). What it does is in its parts,
// each of one concept: the file server (file_server.hpp), the publisher
// (publisher.hpp), the replica holder (replica_holder.hpp) and the status
// reporter (status_reporter.hpp); they share what the Service owns through
// its Core (core.hpp). A new request or feature goes into a part, or a new
// part; not here.
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
    void set_metrics_endpoint(std::string url);
    // A --store-late service that could not reach its store, or register
    // in it, for good stops (run() returns): why, and whether reaching the
    // store failed (else the registration). None otherwise.
    struct StoreFailure {
        Status why;
        bool connecting = false;
    };
    std::optional<StoreFailure> store_failure() const;

  private:
    // Registers again in the remote store and has the publisher publish
    // again every file still as published, counting them in `republished`;
    // false: not finished (the store's kvs::Rejoin).
    bool rejoin(const std::function<bool()>& stopping, uint64_t& republished);
    // The parts of start(), in order: the producer directory (and its
    // lock), the transports' senders, the rpc server (listeners bound,
    // handlers), the metadata store (--kvs: built, served, registered in).
    Status open_producer_dir();
    Status start_senders(const std::string& mode);
    Status start_server();
    Status start_store();
    // What it registers in the store and says in its hello and status.
    proto::Identity identity() const;

    // ---- the store reached once the service is ready (--store-late;
    // late_store.cpp): a thread connects it, registers the service and
    // attaches it to opts_.late_store ----
    void start_reaching_store();
    void reach_store();
    // The store, once connected (null: stopping, or failed for good).
    std::shared_ptr<kvs::ServiceStore> connect_late();
    // The one-live-dyadd check and the registration; false: failed (said).
    bool register_late(kvs::ServiceStore& real);
    void store_failed(const Status& why, bool connecting);
    void stop_reaching_store();  // first thing of ~Service
    std::thread store_thread_;
    std::atomic<bool> store_stop_{false};
    mutable std::mutex store_failure_mu_;
    std::optional<StoreFailure> store_failure_;

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
    StoreCalls calls_{store_, id_};
    bool act_as_users_ = false;  // can take consumers' credentials (root): access.hpp
    std::vector<std::string> endpoints_;
    std::map<std::string, std::unique_ptr<dtl::Sender>> senders_;
    std::map<std::string, std::string> unavailable_;  // transport -> why it is not served
    std::vector<dtl::TransportRecord> records_;       // published for the AUTO selector
    std::optional<asio::signal_set> signals_;

    // The parts (after everything they see).
    Core core_{opts_, id_,        rank_,  endpoints_, prod_dir_, prod_fd_, key_, act_as_users_,
               io_,   file_pool_, store_, calls_,     *metrics_, budget_,  caps_};
    ReplicaHolder replicas_{core_};
    Publisher publisher_{core_, replicas_};
    FileServer files_{core_, senders_, unavailable_, publisher_, replicas_};
    StatusReporter status_{core_,      server_,   files_,
                           publisher_, replicas_, [this] { return identity(); }};

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
    // A fetch asking for a transport still being set up: held (true) until
    // it is (the file server asks, FileServer::set_hold).
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
