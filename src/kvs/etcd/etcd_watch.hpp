// SPDX-License-Identifier: Apache-2.0
// Wait-for-create on etcd: one Watch stream per service carries every key its
// consumers wait for. Each waited key has one watcher on that stream (shared
// by all of the key's waiters), from etcd's revision when it is created; when
// that revision is past the one of the lookup that missed the key (other
// writes came in between), the key is looked up once more, so no put in
// between is lost. (A watcher asked to start at an earlier revision would be
// one etcd "unsynced": its events wait for etcd's catch-up pass, every
// 100 ms.) When the stream breaks (an etcd restart, a failover), the
// watchers are created again on the next stream, each checked the same way;
// waiters keep waiting until their own deadlines.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "etcd_client.hpp"
#include "kvs/service_store.hpp"

namespace dyad::kvs::etcd {

class Watcher {
  public:
    using Done = ServiceStore::Done;
    // lookup: the entry of an etcd key now, and the revision it was read at
    // (used when etcd compacted the revision a watcher asked for).
    using Lookup =
        std::function<Result<std::pair<std::optional<Entry>, int64_t>>(const std::string& key)>;
    Watcher(Client& c, Lookup lookup);
    ~Watcher();
    void start();
    void stop();
    // Calls done once: with the key's entry when it is put after revision
    // `seen` (the revision of the lookup that did not find it), or TIMEOUT
    // at `d`. Returns an id for cancel().
    uint64_t add(const std::string& key, int64_t seen, Deadline d, Done done);
    void cancel(uint64_t id);
    nlohmann::json status() const;
    uint64_t waiters() const;  // waits held now

  private:
    struct KeyWatch {
        int64_t watch_id = 0;
        int64_t start = 0;  // first revision to report: after the lookup's
        bool sent = false;  // created on the current stream
        std::set<uint64_t> waiters;
    };
    struct Waiter {
        std::string key;
        Deadline deadline;
        Done done;
    };
    using Stream = grpc::ClientReaderWriter<pb::WatchRequest, pb::WatchResponse>;
    void run();                          // the reader: (re)opens the stream, dispatches events
    void write();                        // the writer: the only thread that writes to the stream
    void sweep();                        // deadlines
    void send_cancel(int64_t watch_id);  // queued for the writer
    void handle(const pb::WatchResponse& a);
    // Removes `key`'s watcher (locked); returns its waiters' callbacks.
    std::vector<Done> take(const std::string& key, int64_t* watch_id, bool* sent);
    void renew(const std::string& key);  // after compaction: look again, re-create
    // A watcher etcd created at revision `at`: if puts may have come
    // between its start and `at`, its key is looked up (by the checker).
    void created(int64_t watch_id, int64_t at);
    void check();  // the checker: looks up keys queued by created()

    Client& c_;
    Lookup lookup_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::string, KeyWatch> keys_;
    std::map<int64_t, std::string> by_id_;
    std::map<uint64_t, Waiter> waiters_;
    int64_t next_watch_ = 1;
    uint64_t next_waiter_ = 1;
    bool stop_ = false;
    Stream* stream_ = nullptr;            // the current stream, or none
    bool writing_ = false;                // the writer is in stream_->Write
    grpc::ClientContext* ctx_ = nullptr;  // to cancel the stream
    std::deque<std::string> creates_;     // keys whose watcher is to be sent
    std::deque<int64_t> cancels_;         // watchers to cancel on the stream

    // (key, watch id) whose key the checker looks up (created()).
    std::deque<std::pair<std::string, int64_t>> checks_;
    uint64_t reconnects_ = 0, fired_ = 0, expired_ = 0, compacted_ = 0, checked_ = 0;
    std::thread reader_, writer_, sweeper_, checker_;
};

}  // namespace dyad::kvs::etcd
