// SPDX-License-Identifier: Apache-2.0
// Replicas of produced files on other services (docs/design.md,
// "Replicas"). Both sides of one mechanism live here:
//
//   owner   after a publish, push(): a bounded queue, one worker thread;
//           for each file the k services of the rendezvous rule
//           (proto::replica_holders), asked in turn (dyad.replicate) until
//           k hold a copy or none is left to ask;
//   holder  hold(): the file pulled from its owner the normal way (a
//           consumer of the owner: the client's fetch path, checksum and
//           generation stamp, into <state dir>/replicas/<ns>/), then its
//           entry written in the store (only once the copy is durable);
//           check(): whether a replica fetch may be served (the copy held
//           is of the generation asked for and unchanged).
//
// Every resource a peer can make a holder keep is capped: bytes held
// (--replica-space), pulls in progress, entries of the table.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.hpp"
#include "kvs/record.hpp"
#include "kvs/store.hpp"
#include "metrics.hpp"
#include "proto/replica.hpp"
#include "rpc/client.hpp"

namespace dyad::service {

// Pulls (holder side), for the puller dyadd's main supplies (it links the
// client): fetch every record of `records` from its owner into the
// consumer directory `dir`, as a consumer of the key scheme (depth, bins)
// would; several files in one batch (dyad.fetch_many where the owner serves
// it). One Status per record, in order.
struct PullJob {
    std::string dir;  // the replica directory of the namespace (exists)
    std::string ns;
    std::vector<kvs::Record> records;
    std::string service_uri;  // this service (the puller's client says hello to it)
};
using PullFn = std::function<std::vector<Status>(const PullJob&)>;

// The endpoint other services reach `eps`'s service at for replicas: its
// first tcp:// one, else its first.
std::string tcp_endpoint(const std::vector<std::string>& eps);

struct ReplicaOptions {
    uint64_t k = 0;               // --replicas: copies per file unless the producer says
    uint64_t space = 8ull << 30;  // --replica-space: bytes of replicas this service holds
    size_t queue = 1024;          // files waiting to be pushed
    double queue_wait = 1.0;      // seconds a publish waits for room in a full queue
    unsigned max_pulls = 8;       // dyad.replicate in progress at once
    size_t max_held = 1000000;    // replicas in the table
    std::string root;             // <state dir>/replicas
};

class Replicas {
  public:
    // What the service lends: its metadata store (as its own writer) and
    // the registry.
    struct Hooks {
        std::function<Result<kvs::Entry>(const std::string& ns, const std::string& key)> get;
        std::function<Result<uint64_t>(const std::string& ns, const std::string& key,
                                       const std::string& value)>
            put;
        // Registered services: id -> endpoints.
        std::function<Result<std::map<std::string, std::vector<std::string>>>()> services;
        // This service's own entry removed (dyad.unreplicate).
        std::function<Status(const std::string& ns, const std::string& key)> remove;
        // The entries of `ns` under `prefix` (one page: a file has at most
        // one entry per service).
        std::function<Result<std::vector<std::pair<std::string, kvs::Entry>>>(
            const std::string& ns, const std::string& prefix)>
            list;
    };
    struct Counters {
        std::atomic<uint64_t> pushed{0}, push_failed{0}, short_of_services{0}, queue_full{0},
            queued{0}, pulled{0}, pull_failed{0}, refused_space{0}, refused_busy{0}, served{0},
            refused_generation{0}, unreplicated{0}, unreplicate_failed{0}, dropped{0}, batches{0};
    };
    Replicas(std::string self, std::string node, std::vector<std::string> endpoints,
             ReplicaOptions opts, Hooks hooks, rpc::Credentials creds, PullFn pull);
    ~Replicas();
    Replicas(const Replicas&) = delete;
    Replicas& operator=(const Replicas&) = delete;

    // Owner: the file just published (its record, generation set) gets `k`
    // replicas. `done` (may be empty) is called once, from the worker, with
    // how many holders took it (or the queue's refusal, at once).
    using Done = std::function<void(Result<uint64_t> copies)>;
    void push(const std::string& ns, const std::string& key, const kvs::Record& rec, uint64_t k,
              Done done);
    uint64_t default_k() const { return opts_.k; }
    // Owner: the record `rec` (of `key` in `ns`) was just removed (dyad
    // rm). Asynchronously (the same queue and worker as the pushes), every
    // holder whose entry names this service as the owner, at the record's
    // generation or an older one, is asked to drop its replica
    // (dyad.unreplicate, a deadline each). A holder that cannot be reached
    // keeps its entry; it never matches again (generations never repeat).
    void forget(const std::string& ns, const std::string& key, const kvs::Record& rec);

    // Holder: dyad.replicate from service `from` (blocks: a file thread of
    // its own). The answer: {"holder", "generation", "bytes"}.
    Result<nlohmann::json> hold(const proto::ReplicateRequest& req, const std::string& from);
    // Holder: dyad.replicate_many: each file as hold() takes one, all the
    // accepted ones pulled in one batch. One item per file, in order.
    proto::ReplicateBatchAnswer hold_many(const proto::ReplicateBatch& batch,
                                          const std::string& from);
    // A pull slot for a dyad.replicate (EBUSY when all are taken), released
    // by the returned holder.
    Result<std::shared_ptr<void>> take_pull_slot();
    // Holder: dyad.unreplicate from service `from`: the replica of
    // req.upath is dropped (its file, its entry, its bytes) if `from` is the
    // owner recorded for it and it is of req.generation. The answer:
    // {"holder", "dropped": true}; ENOENT when nothing of that generation is
    // held, EPERM when `from` is not its owner.
    Result<nlohmann::json> unhold(const proto::UnreplicateRequest& req, const std::string& from);

    // Holder: the directory a replica fetch of `ns` opens files beneath
    // ("" if none was made).
    std::string dir_of(const std::string& ns) const;
    // Holder: whether the file `sb` (opened beneath dir_of(ns)) is the
    // replica of `upath` at `generation`. ENOENT naming what is held
    // otherwise.
    Status check(const std::string& ns, const std::string& upath, uint64_t generation,
                 const struct stat& sb);

    nlohmann::json status() const;
    // The dyad_replica_* metrics.
    void metrics(PromText& t) const;

  private:
    struct Job {
        std::string ns, key;
        kvs::Record rec;
        uint64_t k = 0;
        Done done;
        bool drop = false;  // forget(), not push()
    };
    struct Held {
        uint64_t generation = 0, size = 0, ino = 0;
        int64_t mtime_ns = 0;
        std::string of;
    };
    void run();
    // Waits (queue lock held) while a burst of pushes is still arriving.
    void linger(std::unique_lock<std::mutex>& lk);
    // Owner (replica_push.cpp): the copies each job of `jobs` got. The
    // files are asked of their holders in rounds, each round one
    // dyad.replicate_many per holder (a holder that does not know it: one
    // dyad.replicate per file), until every file has its k copies or no
    // holder is left to ask.
    std::vector<uint64_t> push_batch(const std::vector<Job>& jobs);
    // Owner: asks holder `id` (at `ep`) for the files `which` of `jobs`; the
    // ones it took are counted in copies, the refusals added to why.
    void ask_holder(const std::string& id, const std::string& ep, const std::vector<Job>& jobs,
                    const std::vector<size_t>& which, std::vector<uint64_t>& copies,
                    std::vector<std::string>& why);
    // Owner: the registry, read again when older than kRegistryAge (false:
    // unreadable, warned).
    bool fresh_services();
    // One placement of every file still short of holders: each file's
    // candidates in rendezvous order, skipping those already `asked`.
    void place(const std::vector<Job>& jobs, std::vector<uint64_t>& copies,
               std::vector<std::set<std::string>>& asked, std::vector<std::string>& why,
               std::vector<size_t>& candidates);
    // Holder, the steps of a hold: reserve the file's bytes (refused when
    // out of --replica-space or table entries), read its record from the
    // store (its owner must be `from`, its generation the one asked for),
    // and, once pulled, check the copy and record it (held_, the entry).
    Status reserve(const proto::ReplicateRequest& req, const std::string& from);
    void release(uint64_t size);
    Result<kvs::Record> verify(const proto::ReplicateRequest& req, const std::string& from);
    Status install(const proto::ReplicateRequest& req, const kvs::Record& rec,
                   const std::string& dir, const std::string& from);
    void drop_one(const Job& j);
    Result<std::string> make_dir(const std::string& ns);

    const std::string self_, node_;
    const std::vector<std::string> endpoints_;
    const ReplicaOptions opts_;
    const Hooks hooks_;
    const PullFn pull_;
    rpc::ConnectionPool pool_;
    Counters n_;

    std::mutex qmu_;
    std::condition_variable qcv_, room_;
    std::deque<Job> queue_;
    bool stopping_ = false;

    mutable std::mutex mu_;
    std::map<std::string, Held> held_;  // ns '\0' upath
    uint64_t bytes_held_ = 0, bytes_reserved_ = 0;
    std::atomic<unsigned> pulls_{0};
    // The registry as the worker last read it (at most kRegistryAge old):
    // one store listing per file would cost the owner more than the push.
    std::map<std::string, std::vector<std::string>> services_;
    std::chrono::steady_clock::time_point services_at_{};
    // When this service started: a job's services register while it starts
    // (dyadd --store-late), so a file short of holders then waits for more.
    std::chrono::steady_clock::time_point born_ = std::chrono::steady_clock::now();
    std::thread worker_;
};

}  // namespace dyad::service
