// SPDX-License-Identifier: Apache-2.0
// Write-behind for receivers of large files: the receiving thread fills
// buffers from the socket while a writer thread hashes and writes the
// previous ones into the sink, so receive and write overlap (issue 17,
// item 4). At most kSlots buffers are in use, each reused (no allocation per
// chunk in steady state); the sink is called from the writer thread only,
// in order. A write error stops the writer; the receiver sees it at its next
// take() or at finish(), and queued buffers are dropped (the transfer fails
// and its temporary file goes).
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "dtl.hpp"

namespace dyad::dtl {

class WriteBehind {
  public:
    static constexpr size_t kSlots = 4;

    explicit WriteBehind(Sink& sink) : sink_(sink), slots_(kSlots) {
        for (size_t i = 0; i < kSlots; ++i) free_.push_back(i);
        thread_ = std::thread([this] { run(); });
    }
    ~WriteBehind() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
    }
    WriteBehind(const WriteBehind&) = delete;
    WriteBehind& operator=(const WriteBehind&) = delete;

    // A free buffer of n bytes to fill (waits while every slot is queued),
    // or the writer's error. Hand it back with push(), filled or not.
    Result<char*> take(size_t n) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return !free_.empty() || !error_.is_ok(); });
        if (!error_.is_ok()) return error_;
        size_t i = free_.front();
        free_.pop_front();
        if (slots_[i].size() < n) slots_[i].resize(n);
        taken_ = i;
        return slots_[i].data();
    }
    // Queues the n bytes of the buffer last taken for the writer.
    void push(size_t n) {
        {
            std::lock_guard<std::mutex> lk(mu_);
            queue_.push_back({taken_, n});
        }
        cv_.notify_all();
    }
    // Gives the buffer last taken back unused (its read failed).
    void give_back() {
        std::lock_guard<std::mutex> lk(mu_);
        free_.push_back(taken_);
    }
    // Waits until every queued buffer is written; the first write error.
    Status finish() {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return (queue_.empty() && !writing_) || !error_.is_ok(); });
        return error_;
    }

  private:
    struct Queued {
        size_t slot;
        size_t n;
    };
    void run() {
        std::unique_lock<std::mutex> lk(mu_);
        for (;;) {
            cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
            if (stop_ || !error_.is_ok()) return;
            Queued q = queue_.front();
            queue_.pop_front();
            writing_ = true;
            lk.unlock();
            Status s = sink_.write(slots_[q.slot].data(), q.n);
            lk.lock();
            writing_ = false;
            free_.push_back(q.slot);
            if (!s.is_ok()) error_ = std::move(s);
            cv_.notify_all();
            if (!error_.is_ok()) return;
        }
    }

    Sink& sink_;
    std::vector<std::vector<char>> slots_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<size_t> free_;
    std::deque<Queued> queue_;
    size_t taken_ = 0;
    bool writing_ = false;
    bool stop_ = false;
    Status error_ = Status::ok();
    std::thread thread_;
};

}  // namespace dyad::dtl
