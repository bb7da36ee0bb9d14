// SPDX-License-Identifier: Apache-2.0
// The DYAD client: produce, look up, consume. Thread-safe: one Client may be
// used from any number of threads. The C API is a thin layer over this.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache.hpp"
#include "common/config.hpp"
#include "common/paths.hpp"
#include "common/status.hpp"
#include "consumer_store.hpp"
#include "fetcher.hpp"
#include "lookup.hpp"
#include "origin.hpp"
#include "origin_memory.hpp"
#include "owners.hpp"
#include "planner.hpp"
#include "producer.hpp"
#include "proto/replica.hpp"
#include "record.hpp"
#include "report.hpp"
#include "service_link.hpp"
#include "proto/origin_claim.hpp"

namespace dyad::client {

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
    // file is written here (src/client/range.cpp). Waits for the file as
    // consume does. Read with pread when the file is on this node already
    // (in place, or a copy of this produce consumed here: no transfer);
    // else only the range is fetched from its owner, over the transport
    // consume would use, and checked against the END's size and checksum.
    // A range past the end of the file is BADFIO / ERANGE; length 0 (within
    // the file) is an empty result. The bytes are always of one produce: a
    // file produced again meanwhile is read again from its newest produce.
    // `into`: where the bytes go instead (room for `length`); the result's
    // data then stays empty. A path only in the origin (DYAD_PATH_ORIGIN):
    // its blocks kept on the node (origin_blocks.hpp), and the lookup's
    // answer used for DYAD_ORIGIN_RECHECK seconds (origin_memory.hpp).
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
    friend class Syncer;    // sync's (sync.cpp)
    Client(Config cfg, FileSystem& fs, rpc::Credentials creds, const dtl::Backend* fixed);
    // get_metadata with its own deadline for the wait (an expired one:
    // one look, TIMEOUT if absent); with DYAD_PATH_ORIGIN, through it.
    Result<Record> lookup(const std::string& path, bool should_wait, Deadline deadline);
    // consume_once, then, if the file was produced again meanwhile, again
    // with its newest record (a few times at most); if it changed and is
    // not produced again yet, waits for that produce until `wait` (the
    // call's DYAD_WAIT_TIMEOUT deadline).
    Status consume_record(const std::string& path, Record rec, ConsumeReport* report,
                          Deadline wait);
    // One attempt at consuming `path` with its record, waiting for the
    // file's lock until `deadline`.
    Status consume_once(const std::string& path, const Record& rec, ConsumeReport* report,
                        Deadline deadline);
    // The bytes of `rec` under its lock: an origin record's from the origin
    // (read_through), any other's from its owner or a replica (the fetcher).
    Status fetch(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                 ConsumeReport* report, int lock_fd);

    // ---- Read-through (origin.cpp), over the parts below ----
    // A waiting lookup with DYAD_PATH_ORIGIN set: the record if there is
    // one now, else the origin's file (a record whose owner is
    // kOriginOwner), else the wait for a produce.
    Result<Record> lookup_with_origin(const std::string& upath, Deadline deadline);
    // fetch() of an origin record: copied from the origin (and, with
    // DYAD_ORIGIN_PUBLISH, published from the producer directory first).
    Status read_through(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                        ConsumeReport* rep, int lock_fd);
    Result<Record> lookup_upath(const std::string& upath, bool should_wait, Deadline deadline) {
        return lookup_.find(upath, should_wait, deadline);
    }
    bool in_place(const Record& rec, const ServiceInfo& svc) const {
        return fetcher_.in_place(rec, svc);
    }
    Status stage_commit(const std::string& upath, const Record& rec, int lock_fd,
                        ConsumeReport* rep, const Fetcher::FillFn& fill) {
        return fetcher_.stage_commit(upath, rec, lock_fd, rep, fill);
    }
    Deadline wait_deadline() const { return lookup_.wait_deadline(); }
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
    Status claim_or_wait(const std::string& upath, const Record& origin_rec, const ServiceInfo& svc,
                         ConsumeReport* rep, int lock_fd, bool* done, bool* held);
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
    // consume_range's lookup and read of a range into `out`, or, within
    // DYAD_ORIGIN_RECHECK of the last, its remembered origin record.
    Status range_of(const std::string& path, const std::string& upath, uint64_t offset,
                    uint64_t length, RangeBytes* out, ConsumeReport* rep);

    Config cfg_;
    ManagedDir prod_;
    ManagedDir cons_;
    ConsumerStore cstore_;
    Origin origin_;
    // Range reads' answers of origin lookups, kept DYAD_ORIGIN_RECHECK.
    OriginMemory origin_seen_;
    Cache cache_;
    // The parts, each one concept (each file says what it holds).
    ServiceLink link_;          // the node's service: hello, store, connections
    OwnerDirectory owners_;     // owners' registry entries, endpoints, down marks
    TransportPlanner planner_;  // which transports, best first
    Lookup lookup_;             // records, stat, listing, stale retry
    Producer producer_;         // produce, unpublish
    Fetcher fetcher_;           // the path of bytes, from a source
};

}  // namespace dyad::client
