// SPDX-License-Identifier: Apache-2.0
// The DYAD client: produce, look up, consume. Thread-safe: one Client may be
// used from any number of threads. The C API is a thin layer over this.
#pragma once

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.hpp"
#include "common/paths.hpp"
#include "common/status.hpp"
#include "dtl/dtl.hpp"
#include "kvs/store.hpp"
#include "proto/fetch.hpp"
#include "proto/replica.hpp"
#include "rpc/client.hpp"
#include "record.hpp"
#include "cache.hpp"
#include "consumer_store.hpp"
#include "origin.hpp"
#include "proto/origin_claim.hpp"

namespace dyad::client {

// Identity of the node's service, from its hello.
struct ServiceInfo {
    std::string id, node, ns, producer_dir, kvs;
    std::vector<std::string> endpoints;
    uint32_t rank = UINT32_MAX;  // the node's rank (DYAD_RANK_UNKNOWN if it did not say)
    nlohmann::json raw;
};

// How far a transfer is, for a progress display.
struct TransferProgress {
    uint64_t bytes = 0;    // received so far
    uint64_t total = 0;    // the file's size
    double elapsed_s = 0;  // since the transfer started
};

// What a consume did (for the CLI, the demo and tests).
struct ConsumeReport {
    // In: if set, called on the consuming thread while a file's bytes
    // arrive: on the first bytes, then at most every progress_interval_s
    // (a clock read per received block, no system call).
    std::function<void(const TransferProgress&)> progress;
    double progress_interval_s = 0.25;
    // Out:
    std::string action;  // "fetched", "present", "in-place"
    std::string transport;
    std::string endpoint;
    uint64_t bytes = 0;
    double wait_s = 0;      // waiting for the file to be produced
    double transfer_s = 0;  // moving and storing its bytes
    std::string explain;    // DYAD_DTL_MODE=AUTO: why this transport (scores)
    // The same, as data (shared with the client's plan cache: a report is
    // per file, and copying the document for each was a tenth of the CPU of
    // a small file's consume).
    std::shared_ptr<const nlohmann::json> selection;
};

// A byte range of a file in memory (Client::consume_range). The bytes are
// malloc'd: the C API hands them to its caller, who frees them with free().
struct RangeBytes {
    std::unique_ptr<char, void (*)(void*)> data{nullptr, &std::free};
    size_t size = 0;
};

// Client::consume_many's options.
struct ConsumeManyOptions {
    // Files in flight (lookups and fetches overlapped); 0: DYAD_CONSUME_WINDOW.
    unsigned window = 0;
    // Called once per file as it finishes (any order), one call at a time,
    // on one of the pipeline's threads: the file's index in the list, its
    // outcome and what happened.
    std::function<void(size_t index, const Status& status, const ConsumeReport& report)> done;
};

// Client::sync's options.
struct SyncOptions {
    // Relative path prefix: "" (or ".") for everything; "a/b" for a/b and
    // what is under it; "a/b/" for what is under a/b; "a/f" also matches
    // neither "a/fx" nor "a/f.txt" (whole components), except with a
    // trailing "*" ("a/f*"): a plain string prefix.
    std::string prefix;
    bool follow = false;  // keep looking for new files (and new generations)
    uint64_t count = 0;   // with follow: stop after this many files consumed (0: no limit)
    unsigned window = 0;  // as ConsumeManyOptions::window
    // Polled between passes: true ends a follow.
    std::function<bool()> stop;
    // Per file, as it finishes (one call at a time).
    std::function<void(const std::string& path, const Status& status, const ConsumeReport& report)>
        done;
};

// Does `upath` fall under a SyncOptions::prefix?
bool under_prefix(const std::string& upath, const std::string& prefix);

// Seconds a fetch of this thread may spend connecting to a record's owner
// (0: the usual 30 s); set while a replica could serve the file instead
// (failover.cpp).
extern thread_local double t_connect_limit;

class Client {
  public:
    // `fs`: the file-system seam for the consumer store (tests inject
    // faults through it); null is the real one.
    static Result<std::unique_ptr<Client>> create(Config cfg, FileSystem* fs = nullptr);

    const Config& config() const { return cfg_; }
    const ManagedDir& producer_dir() const { return prod_; }
    const ManagedDir& consumer_dir() const { return cons_; }

    // Relative path of a consumer/producer path, if managed.
    std::optional<std::string> consumer_upath(const std::string& path) const;
    std::optional<std::string> producer_upath(const std::string& path) const;

    // Publishes a file of the producer directory. Unmanaged paths: UNTRACKED.
    Status produce(const std::string& path);
    // Removes the record of a file this node's service published (dyad
    // rm): later lookups wait for it again, fetches of it are refused; the
    // file stays. Another node's file: NOAUTH naming its owner; not
    // published: NOTFOUND.
    Status unpublish(const std::string& path);
    // Metadata of a consumer path; should_wait blocks until produced.
    Result<Record> get_metadata(const std::string& path, bool should_wait);
    // Waits for the file, then makes it appear whole in the consumer directory.
    Status consume(const std::string& path, ConsumeReport* report = nullptr);
    // The same with its record known already (dyad_consume_w_metadata):
    // refused if the record is not the path's; produced again meanwhile, it
    // is looked up and fetched again, as consume does.
    Status consume_with(const std::string& path, const Record& rec,
                        ConsumeReport* report = nullptr);
    // Bytes [offset, offset + length) of a consumer path, in memory: no
    // file is written here (src/client/consume.cpp). Waits for the file as
    // consume does. Read with pread when the file is on this node already
    // (in place, or a copy of this produce consumed here: no transfer);
    // else only the range is fetched from its owner, over the transport
    // consume would use, and checked against the END's size and checksum.
    // A range past the end of the file is BADFIO / ERANGE; length 0 (within
    // the file) is an empty result. The bytes are always of one produce: a
    // file produced again meanwhile is read again from its newest produce.
    // `into`: where the bytes go instead (room for `length`); the result's
    // data then stays empty.
    Result<RangeBytes> consume_range(const std::string& path, uint64_t offset, uint64_t length,
                                     ConsumeReport* report = nullptr, char* into = nullptr);
    // Consumes many files with several in flight (src/client/pipeline.cpp):
    // the ones produced already are found with batched lookups
    // (kvs.get_many) and fetched by a window of workers, the others waited
    // for meanwhile; each file is still installed whole and checked. Every
    // file waits at most DYAD_WAIT_TIMEOUT from the start of the call. One
    // Status per path, in the order given.
    std::vector<Status> consume_many(const std::vector<std::string>& paths,
                                     const ConsumeManyOptions& options = ConsumeManyOptions());

    // The metadata of a path in the consumer or the producer directory
    // (whichever holds it: a node with only one of them set), without waiting.
    Result<Record> stat(const std::string& path);
    // The replicas of `rec` (the record of `upath`, as stat() gave it): the
    // entries of `<ns>.replicas` under `<key>@` that failover would use (the
    // same path, owner, generation, size and mtime; failover.cpp).
    Result<std::vector<proto::ReplicaEntry>> replicas(const std::string& upath, const Record& rec);
    // The records whose relative path starts with `prefix`, in key order,
    // fetched page by page (kvs.list): `each` sees every one as its page
    // arrives and returns false to stop.
    Status list(const std::string& prefix, const std::function<bool(const Record&)>& each);
    Result<std::vector<Record>> list();
    Result<nlohmann::json> service_status(const std::string& uri = "");
    Result<ServiceInfo> service();
    // Has this client reached its node's service (service() succeeded)?
    bool reached_service();
    std::string key_of(const std::string& upath) const;
    // In a child after fork(): drop the connections shared with the parent.
    void reset_after_fork();

    // Consumes every file produced under a relative path prefix
    // (src/client/sync.cpp): once, or with follow as they appear. The
    // first error of a file is its result; the return value is the first
    // failure of a pass, or of listing the store.
    Status sync(const SyncOptions& options, uint64_t* consumed = nullptr);

    // The node-local cache of this consumer directory (DYAD_CACHE_*): its
    // bytes and counters, shared by every process consuming into it.
    Result<CacheStats> cache_stats();

  private:
    friend class Pipeline;  // consume_many's (pipeline.cpp)
    Client(Config cfg, FileSystem& fs, rpc::Credentials creds);
    // Idle connections the pool keeps per URI: at least the window.
    size_t idle_per_owner() const;
    // The relative path of a consumer path: BADMANAGEDPATH without a
    // consumer directory, UNTRACKED outside it, refused under the reserved
    // directory.
    Result<std::string> consumer_relative(const std::string& path) const;
    // get_metadata with its own deadline for the wait (an expired one:
    // one look, TIMEOUT if absent).
    Result<Record> lookup(const std::string& path, bool should_wait, Deadline deadline);
    // The same for the relative path `upath`.
    Result<Record> lookup_upath(const std::string& upath, bool should_wait, Deadline deadline);
    // consume_once, then, if the file was produced again meanwhile, again
    // with its newest record (a few times at most); if it changed and is
    // not produced again yet, waits for that produce until `wait` (the
    // call's DYAD_WAIT_TIMEOUT deadline).
    Status consume_record(const std::string& path, Record rec, ConsumeReport* report,
                          Deadline wait);
    // once(rec), then as consume_record does when it fails with ESTALE.
    Status retry_stale(const std::string& path, Record rec, Deadline wait,
                       const std::function<Status(const Record&)>& once);
    // One attempt at consume_range's work with the record `rec` (into
    // out->data if it is set on entry, else into memory it allocates).
    Status range_once(const std::string& upath, const Record& rec, uint64_t offset, uint64_t length,
                      RangeBytes* out, ConsumeReport* rep);
    // [offset, offset + length) of the open file `fd` into dst. With
    // `rec`, the file must be that produce (size and mtime) before and
    // after the read: else ESTALE.
    Status read_range(int fd, const std::string& upath, uint64_t offset, uint64_t length,
                      const Record* rec, char* dst);
    // One attempt at consuming `path` with its record, waiting for the
    // file's lock until `deadline`.
    Status consume_once(const std::string& path, const Record& rec, ConsumeReport* report,
                        Deadline deadline);

    // ---- The consume core (consume.cpp): the steps every consume takes,
    // one file alone or many in one dyad.fetch_many ----
    // The in-place rule: same node and same directory, or storage shared by
    // all nodes (DYAD_SHARED_STORAGE): the file is already where it is wanted.
    bool in_place(const Record& rec, const ServiceInfo& svc) const;
    // Nothing to move: in place, or a copy of this produce present (said in
    // *rep: action, transport "none", no bytes). No lock is needed to see a
    // whole file.
    bool settled(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                 ConsumeReport* rep);
    // Under the file's lock (waited for until `deadline`; one consumer per
    // file per node moves it, the others wait, then find it present): done
    // if present by then, else move(lock_fd).
    using MoveFn = std::function<Status(int lock_fd)>;
    Status under_lock(const std::string& upath, const Record& rec, Deadline deadline,
                      ConsumeReport* rep, const MoveFn& move);
    // Stages the file (beside its target, under lock_fd), lets `fill`
    // write its bytes into the sink and give the END trailer, checks and
    // commits it, and says "fetched" in *rep.
    using FillFn = std::function<Result<nlohmann::json>(FileSink& sink)>;
    Status stage_commit(const std::string& upath, const Record& rec, int lock_fd,
                        ConsumeReport* rep, const FillFn& fill);
    // What every fetch asks for a file: its path, its generation, where its
    // record is.
    proto::FetchRequest request_of(const std::string& upath, const Record& rec,
                                   const std::string& nspace) const;
    Result<kvs::Store*> store();
    // The metadata store the node's service uses.
    std::string store_uri(const ServiceInfo& svc) const;
    // A store operation that could not reach the store, said so (others
    // unchanged).
    Status store_failure(const Status& e, const ServiceInfo& svc) const;
    std::string ns(const ServiceInfo& svc) const;
    // lock_fd: the file's lock (ConsumerStore::lock), held meanwhile.
    // From the owner, then, if it is gone or the fetch fails mid-way, from a
    // replica of the same generation (failover.cpp; docs/design.md,
    // "Replicas").
    Status fetch(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                 ConsumeReport* report, int lock_fd);
    Status fetch_owner(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                       ConsumeReport* report, int lock_fd);
    Status fetch_replica(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                         ConsumeReport* report, int lock_fd, const Status& why);
    // The matching replica entries (replicas() with the service known).
    Result<std::vector<proto::ReplicaEntry>> replicas(const std::string& upath, const Record& rec,
                                                      const ServiceInfo& svc);
    // Owners whose endpoint could not be reached lately (failover.cpp):
    // their files go to a replica first for a few seconds.
    bool owner_down(const std::string& owner);
    void note_owner_down(const std::string& owner);
    // One attempt over one transport; *retry says another may still work
    // (nothing was received and the failure is this transport's).
    Status fetch_via(const dtl::Backend& b, const std::string& upath, const Record& rec,
                     const std::string& ep, const std::string& nspace, ConsumeReport* rep,
                     int lock_fd, bool* retry);
    // fetch_via's transfer into the staged file's sink (or a range's
    // memory): the END trailer. `req` says what to fetch (request_of, maybe
    // with a range); `received` the bytes the sink has taken.
    Result<nlohmann::json> receive_via(const dtl::Backend& b, proto::FetchRequest req,
                                       const Record& rec, const std::string& ep, dtl::Sink& sink,
                                       const std::function<uint64_t()>& received, bool* retry);
    // The owner's endpoint to fetch `rec` from: its Unix socket when on
    // this node, else its TCP address ("" if it lists neither).
    std::string owner_endpoint(const Record& rec, const ServiceInfo& svc) const;
    // consume_many's batches (fetch_many.cpp). The endpoint to ask for
    // `rec` with many others in one dyad.fetch_many, if it may travel so: a
    // small file, to be fetched (not in place), over the stream transport.
    std::optional<std::string> batch_endpoint(const Record& rec, const ServiceInfo& svc);
    // Fetches the files `which` (indices into upaths and records) from the
    // owner at `ep` in one request; calls finish for each file it installs
    // or finds present, and returns those left to fetch alone (refused by
    // the owner, or not answered).
    using FinishFn = std::function<void(size_t, Status, const ConsumeReport&)>;
    std::vector<size_t> consume_batch(const std::vector<size_t>& which,
                                      const std::vector<std::string>& upaths,
                                      const std::vector<Record>& records, const ServiceInfo& svc,
                                      const std::string& ep, const FinishFn& finish,
                                      std::chrono::steady_clock::time_point t0);
    // The dyad.fetch_many request for the files `which`.
    proto::FetchManyRequest batch_request(const std::vector<size_t>& which,
                                          const std::vector<std::string>& upaths,
                                          const std::vector<Record>& records,
                                          const ServiceInfo& svc) const;
    // One served file of a dyad.fetch_many, all its bytes here: installed
    // whole without a lock where the file system allows, else under its
    // lock, staged and committed as a lone fetch's.
    Status install_answer(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                          const Sent& sent, const std::string& bytes, ConsumeReport* rep);
    std::atomic<bool> no_fetch_many_{false};  // an owner did not know dyad.fetch_many
    // AUTO: the transports to try for this file, best first.
    std::vector<const dtl::Backend*> plan(const Record& rec, const ServiceInfo& svc,
                                          ConsumeReport* rep);
    // The owner service's registry entry (transport records, host), cached.
    Result<nlohmann::json> owner_info(const std::string& owner, const ServiceInfo& svc);
    Deadline wait_deadline() const;
    // ---- Read-through (origin.cpp) ----
    // A waiting lookup with DYAD_PATH_ORIGIN set: the record if there is
    // one now, else the origin's file (a record whose owner is
    // kOriginOwner), else the wait for a produce.
    Result<Record> lookup_with_origin(const std::string& upath, Deadline deadline);
    // fetch() of an origin record: copied from the origin (and, with
    // DYAD_ORIGIN_PUBLISH, published from the producer directory first).
    Status read_through(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                        ConsumeReport* rep, int lock_fd);
    // Its reads of the origin (a few times while the file changes), and
    // with DYAD_ORIGIN_PUBLISH the copy's publish.
    Status read_origin(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                       ConsumeReport* rep, int lock_fd);
    // ---- Claims of origin files (origin_claim.cpp) ----
    // With DYAD_ORIGIN_PUBLISH, before reading `upath` from the origin:
    // claims it through this node's dyadd. Another node's claim: waits for
    // that node's publish and consumes it (*done: the status returned is
    // the consume's), or takes the claim over once its holder is gone or
    // past DYAD_TRANSFER_TIMEOUT. *held: this node holds a claim to release.
    Status claim_or_wait(const std::string& upath, const Record& origin_rec,
                         const ServiceInfo& svc, ConsumeReport* rep, int lock_fd, bool* done,
                         bool* held);
    void release_claim(const std::string& upath, const ServiceInfo& svc);
    Result<proto::OriginClaimAnswer> claim_call(const std::string& upath, const ServiceInfo& svc,
                                                uint64_t takes, bool release);
    // What waiting for a claim's holder ended with: its publish, or the
    // claim's version to take over (0: released, claim anew).
    struct ClaimWait {
        std::optional<Record> record;
        uint64_t takes = 0;
    };
    Result<ClaimWait> await_holder(const std::string& upath, const ServiceInfo& svc,
                                   const proto::OriginClaimAnswer& claim);
    // Whether the service that holds a claim (its record `value`) no
    // longer answers.
    bool claim_holder_gone(const std::string& value, uint64_t version, const ServiceInfo& svc);
    // A published record of an origin file: in place, or fetched from its owner.
    Status consume_published(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                             ConsumeReport* rep, int lock_fd);

    Config cfg_;
    ManagedDir prod_;
    ManagedDir cons_;
    ConsumerStore cstore_;
    Origin origin_;
    Cache cache_;
    const dtl::Backend* backend_ = nullptr;  // fixed mode; null for AUTO
    // False when `owner` is no longer in the registry (stopped, or its
    // lease in etcd ran out); drops what was cached of it.
    bool owner_registered(const std::string& owner);
    std::map<std::string, nlohmann::json> owners_;  // under mu_
    std::map<std::string, std::string> unusable_;   // transport -> why (under mu_)
    std::map<std::string, std::chrono::steady_clock::time_point> down_;  // owner -> when (mu_)
    // AUTO's choice for an (owner, size): many files of one size from one
    // owner are chosen for once (the scores' arithmetic and the
    // explanation's formatting cost as much as a small file's transfer).
    // Under mu_; emptied when owners_ or unusable_ change.
    struct Plan {
        std::vector<const dtl::Backend*> order;
        std::string explain;
        std::shared_ptr<const nlohmann::json> selection;
    };
    std::map<std::pair<std::string, uint64_t>, Plan> plans_;
    rpc::Credentials creds_;  // DYAD_AUTH_KEY_FILE
    std::shared_ptr<rpc::ConnectionPool> pool_;
    std::mutex mu_;
    std::optional<ServiceInfo> svc_;
    std::unique_ptr<kvs::Store> store_;
};

}  // namespace dyad::client
