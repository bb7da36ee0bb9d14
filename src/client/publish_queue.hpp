// SPDX-License-Identifier: Apache-2.0
// DYAD_ASYNC_PUBLISH: the calls that publish a closed file (dyad_produce,
// the wrapper's close, pydyad, the C++ streams) queue it and return; one
// thread of the process publishes the queued files in order with the
// synchronous publish (Client::produce), over the client's one pooled
// connection to its node's service (docs/user-guide.md, "Asynchronous
// publish"; docs/design.md).
//
// - A file is queued by its caller once it is closed. While its publish is
//   sent the thread holds a read lease on it: a writer opening it meanwhile
//   waits for the answer, so the service records the file as it was closed,
//   never half of a rewrite; a file open for writing again when its turn
//   comes waits for its writer's close (and is dropped if that close queued
//   it again), refused as a synchronous produce refuses it only if still
//   open after the timeout.
// - A failed publish is logged (file and reason) and counted at once, and
//   kept for the process's next DYAD call (take_failures) and finish().
// - The queue is bounded (files and bytes of paths): a full queue makes the
//   caller wait, up to DYAD_ASYNC_PUBLISH_TIMEOUT; nothing is dropped.
// - finish() (dyad_finalize, exit, the wrapper's destructor) and fork() wait
//   for the queue to empty within DYAD_ASYNC_PUBLISH_TIMEOUT and say what
//   was not published. A child after fork() starts with an empty queue and
//   no thread (the parent keeps publishing its own). A killed process loses
//   what it had queued and not yet sent.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.hpp"
#include "common/status.hpp"

namespace dyad::client {

class Client;

class PublishQueue : public std::enable_shared_from_this<PublishQueue> {
  public:
    struct Options {
        double timeout_s = 60;            // DYAD_ASYNC_PUBLISH_TIMEOUT
        size_t max_files = 1024;          // DYAD_ASYNC_PUBLISH_MAX_FILES
        uint64_t max_bytes = 4ull << 20;  // DYAD_ASYNC_PUBLISH_MAX_BYTES
        // Run first on the publishing thread (the wrapper marks it as its
        // own, so that its file accesses are not intercepted).
        std::function<void()> thread_init;
        // The settings' values (src/common/settings.cpp).
        static Result<Options> from_settings();
    };
    struct Counters {
        uint64_t queued = 0;       // files queued
        uint64_t published = 0;    // publishes that succeeded
        uint64_t failed = 0;       // publishes that failed (each logged)
        uint64_t coalesced = 0;    // queued again before sent: published once
        uint64_t batches = 0;      // times the thread took what was pending
        uint64_t full_waits = 0;   // calls that waited for room
        uint64_t unpublished = 0;  // left in the queue at a deadline (finish, fork)
    };

    static std::shared_ptr<PublishQueue> create(std::shared_ptr<Client> client, Options options);
    ~PublishQueue();
    PublishQueue(const PublishQueue&) = delete;
    PublishQueue& operator=(const PublishQueue&) = delete;

    // Queues `path` (closed by the caller). Waits while the queue is full,
    // up to the timeout (then DYAD_RC_TIMEOUT: not queued, say so); after
    // finish(), DYAD_RC_NOCTX.
    Status enqueue(const std::string& path);
    // The publishes that failed since the last call, as one error naming
    // them (the first few) and their count; OK when none.
    Status take_failures();
    // Waits until everything queued before the call has been sent and
    // answered, or `deadline`; false at the deadline.
    bool drain(Deadline deadline);
    // Drains within the timeout, stops the thread and refuses new files.
    // The failures not yet taken and the files left unpublished, as one
    // error; OK when everything queued was published. Idempotent.
    Status finish();
    Counters counters() const;

  private:
    struct Entry {
        std::string path;
        uint64_t seq = 0;
    };
    struct Busy {
        std::string path;
        Deadline until;
    };
    struct Failure {
        std::string path;
        Status why;
    };
    PublishQueue(std::shared_ptr<Client> client, Options options);
    static uint64_t cost(const std::string& path) { return path.size() + 64; }
    void start_locked();
    void run();
    // Publishes one file under a read lease held for the call.
    Status publish_one(const std::string& path);
    void note_failure_locked(const std::string& path, const Status& why);
    // A publish's outcome. Refused because the file is open for writing
    // again: dropped if it was queued again meanwhile (that one is
    // published), else retried until `until`, then a failure.
    void settle_locked(const std::string& path, const Status& result, Deadline until);
    bool requeued_locked(const std::string& path) const;
    // The files waiting for their writer to close them, tried again.
    void retry_busy(std::unique_lock<std::mutex>& lk);
    // What a drain that ran out of time leaves: the files not sent, said
    // and counted; they are dropped from the queue (`context`: "exit").
    Status abandon_locked(const char* context);
    // fork(): drain, then hold the lock over the fork; in the child, an
    // empty queue and no thread.
    void before_fork();
    void after_fork_parent();
    void after_fork_child();
    friend struct ForkHooks;

    std::shared_ptr<Client> client_;
    Options opt_;
    mutable std::mutex mu_;
    std::condition_variable work_cv_;  // the thread waits for files
    std::condition_variable room_cv_;  // callers wait for room
    std::condition_variable done_cv_;  // drains wait for answers
    std::deque<Entry> queue_;
    uint64_t bytes_ = 0;
    uint64_t next_seq_ = 1;  // of the next file queued
    uint64_t done_seq_ = 0;  // every file up to this one has been answered
    bool started_ = false, stop_ = false, finished_ = false;
    std::vector<std::string> in_flight_;  // the batch being sent
    std::vector<Busy> busy_;              // open for writing again when sent
    std::deque<Failure> failures_;        // not yet taken (at most kKeptFailures)
    uint64_t failures_untold_ = 0;        // beyond those kept
    Counters counters_;
    std::thread thread_;
};

}  // namespace dyad::client
