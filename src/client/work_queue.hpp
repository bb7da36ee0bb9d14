// SPDX-License-Identifier: Apache-2.0
// A fixed set of worker threads running jobs (the consume pipeline's
// fetches, src/client/pipeline.cpp). Jobs run first in, first out. When
// none is queued, a worker may take the owner's idle work instead (the
// pipeline: wait for a file not produced yet), at most idle_limit() workers
// at once. Thread-safe: push, wake and cancel may be called from any thread,
// the jobs included.
//
//   bounded:     push waits while `bound` jobs are queued (0: no bound); a
//                job must not push into a full queue of its own (it would
//                wait for itself);
//   cancel:      queued jobs are dropped, push refuses, running jobs end on
//                their own; the workers end;
//   first error: the first failure a job returns, kept (first_error()).
// The destructor cancels and joins; finish() runs what is queued first.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.hpp"

namespace dyad::client {

class WorkQueue {
  public:
    using Job = std::function<Status()>;
    struct Options {
        unsigned workers = 1;  // at least 1
        size_t bound = 0;      // queued jobs at most (0: no bound)
        // Idle work: called (under no lock of the queue's) by a worker
        // that finds no job queued, while fewer than idle_limit() workers
        // run idle work; an empty Job: none now (wake() says when there
        // may be some).
        std::function<Job()> idle;
        std::function<unsigned()> idle_limit;
    };

    explicit WorkQueue(Options options);
    ~WorkQueue();
    WorkQueue(const WorkQueue&) = delete;
    WorkQueue& operator=(const WorkQueue&) = delete;

    // Queues a job (waiting for room while the queue is full); false, and
    // the job dropped, once cancelled or finishing.
    bool push(Job job);
    // There may be idle work now: idle workers ask again.
    void wake();
    // Drops the queued jobs and refuses new ones; the workers end once their
    // running jobs return.
    void cancel();
    bool cancelled() const;
    // No more jobs: runs the queued ones (and the idle work there is), then
    // joins the workers. The first error of a job, or OK.
    Status finish();
    Status first_error() const;

  private:
    void work();
    // Next job for a worker, under lk; empty once it should end.
    Job next(std::unique_lock<std::mutex>& lk, bool* idle);
    void record(const Status& s);

    Options opt_;
    mutable std::mutex mu_;
    std::condition_variable work_cv_;  // jobs, idle work, the end
    std::condition_variable room_cv_;  // room in a bounded queue
    std::deque<Job> jobs_;
    unsigned idle_running_ = 0;
    unsigned long wakes_ = 0;  // counts wake() calls (an idle worker's check)
    bool closing_ = false;     // finish(): no more jobs
    bool cancelled_ = false;
    Status first_error_;
    std::vector<std::thread> workers_;
};

}  // namespace dyad::client
