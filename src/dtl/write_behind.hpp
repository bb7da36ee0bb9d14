// SPDX-License-Identifier: Apache-2.0
// Write-behind for receivers of large files: the receiving thread fills
// buffers while a writer thread hashes and writes the previous ones into the
// sink, so receive and write overlap (issue 17, item 4).
//
// BackgroundWriter writes buffers its caller owns, in order, on its own
// thread; each write has a number, and written() says how many are done, so
// the caller knows when a buffer may be filled again (the consumer's chunk
// window, receive_window.hpp, hands it the UCX receiver's slots). WriteBehind adds kSlots buffers
// of its own, each reused (no allocation per chunk in steady state), for the stream receiver.
//
// The sink is called from the writer thread only. A write error stops the
// writer; the receiver sees it at its next submit, take, wait or finish, and
// buffers still queued are dropped (the transfer fails and its temporary file
// goes). Going away drops what is queued and waits only for the write under
// way.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "dtl.hpp"

namespace dyad::dtl {

class BackgroundWriter {
  public:
    explicit BackgroundWriter(Sink& sink) : sink_(sink) {
        thread_ = std::thread([this] { run(); });
    }
    ~BackgroundWriter() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
    }
    BackgroundWriter(const BackgroundWriter&) = delete;
    BackgroundWriter& operator=(const BackgroundWriter&) = delete;

    // Queues the n bytes at p, which must stay as they are until written()
    // exceeds the number returned (writes are numbered from 0); or the
    // writer's error.
    Result<uint64_t> submit(const char* p, size_t n) {
        uint64_t k;
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (!error_.is_ok()) return error_;
            queue_.push_back({p, n});
            k = submitted_++;
        }
        cv_.notify_all();
        return k;
    }
    // Writes done so far (in order: the first written() buffers are free).
    uint64_t written() {
        std::lock_guard<std::mutex> lk(mu_);
        return written_;
    }
    // Waits until at least k writes are done, or the writer's error.
    Status wait_written(uint64_t k) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return written_ >= k || !error_.is_ok(); });
        return error_;
    }
    // Waits until every queued buffer is written; the first write error.
    Status finish() { return wait_written(submitted()); }
    uint64_t submitted() {
        std::lock_guard<std::mutex> lk(mu_);
        return submitted_;
    }

  private:
    struct Queued {
        const char* p;
        size_t n;
    };
    void run() {
        std::unique_lock<std::mutex> lk(mu_);
        for (;;) {
            cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
            if (stop_) return;
            Queued q = queue_.front();
            queue_.pop_front();
            lk.unlock();
            Status s = sink_.write(q.p, q.n);
            lk.lock();
            if (!s.is_ok()) {
                error_ = std::move(s);
                queue_.clear();
            } else {
                ++written_;
            }
            cv_.notify_all();
            if (!error_.is_ok()) return;
        }
    }

    Sink& sink_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Queued> queue_;
    uint64_t submitted_ = 0;
    uint64_t written_ = 0;
    bool stop_ = false;
    Status error_ = Status::ok();
    std::thread thread_;
};

class WriteBehind {
  public:
    static constexpr size_t kSlots = 4;

    explicit WriteBehind(Sink& sink) : slots_(kSlots), writer_(sink) {}

    // A free buffer of n bytes to fill (waits while every slot is queued),
    // or the writer's error. Hand it back with push(), filled or not.
    Result<char*> take(size_t n) {
        // Buffers are used in turn: the next one is free once the write
        // kSlots before it is done.
        if (pushed_ >= kSlots) {
            Status s = writer_.wait_written(pushed_ - kSlots + 1);
            if (!s) return s;
        }
        std::vector<char>& b = slots_[pushed_ % kSlots];
        if (b.size() < n) b.resize(n);
        return b.data();
    }
    // Queues the first n bytes of the buffer last taken for the writer.
    Status push(size_t n) {
        auto k = writer_.submit(slots_[pushed_ % kSlots].data(), n);
        if (!k) return k.status();
        ++pushed_;
        return Status::ok();
    }
    // Gives the buffer last taken back unused (its read failed).
    void give_back() {}
    // Waits until every queued buffer is written; the first write error.
    Status finish() { return writer_.finish(); }

  private:
    std::vector<std::vector<char>> slots_;
    uint64_t pushed_ = 0;
    BackgroundWriter writer_;  // last: stopped before the slots go
};

}  // namespace dyad::dtl
