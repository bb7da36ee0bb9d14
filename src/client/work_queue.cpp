// SPDX-License-Identifier: Apache-2.0
#include "work_queue.hpp"

#include <cerrno>
#include <exception>

namespace dyad::client {

WorkQueue::WorkQueue(Options options) : opt_(std::move(options)) {
    if (opt_.workers == 0) opt_.workers = 1;
    workers_.reserve(opt_.workers);
    for (unsigned i = 0; i < opt_.workers; ++i) workers_.emplace_back([this] { work(); });
}

WorkQueue::~WorkQueue() {
    cancel();
    for (auto& t : workers_)
        if (t.joinable()) t.join();
}

bool WorkQueue::push(Job job) {
    std::unique_lock<std::mutex> lk(mu_);
    room_cv_.wait(lk, [&] { return cancelled_ || opt_.bound == 0 || jobs_.size() < opt_.bound; });
    if (cancelled_) return false;
    jobs_.push_back(std::move(job));
    work_cv_.notify_one();
    return true;
}

void WorkQueue::wake() {
    std::lock_guard<std::mutex> lk(mu_);
    ++wakes_;
    work_cv_.notify_all();
}

void WorkQueue::cancel() {
    std::lock_guard<std::mutex> lk(mu_);
    cancelled_ = true;
    jobs_.clear();
    work_cv_.notify_all();
    room_cv_.notify_all();
}

bool WorkQueue::cancelled() const {
    std::lock_guard<std::mutex> lk(mu_);
    return cancelled_;
}

Status WorkQueue::finish() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        closing_ = true;
        work_cv_.notify_all();
    }
    for (auto& t : workers_)
        if (t.joinable()) t.join();
    return first_error();
}

Status WorkQueue::first_error() const {
    std::lock_guard<std::mutex> lk(mu_);
    return first_error_;
}

void WorkQueue::record(const Status& s) {
    if (!s && first_error_.is_ok()) first_error_ = s;
}

WorkQueue::Job WorkQueue::next(std::unique_lock<std::mutex>& lk, bool* idle) {
    for (;;) {
        if (cancelled_) return {};
        if (!jobs_.empty()) {
            Job j = std::move(jobs_.front());
            jobs_.pop_front();
            room_cv_.notify_one();
            return j;
        }
        const unsigned long seen = wakes_;
        const unsigned limit = opt_.idle_limit ? opt_.idle_limit() : opt_.workers;
        if (opt_.idle && idle_running_ < limit) {
            ++idle_running_;
            lk.unlock();
            Job j = opt_.idle();
            lk.lock();
            if (j) {
                *idle = true;
                return j;
            }
            --idle_running_;
            if (!jobs_.empty() || wakes_ != seen) continue;
        }
        if (closing_) return {};
        work_cv_.wait(lk,
                      [&] { return cancelled_ || closing_ || !jobs_.empty() || wakes_ != seen; });
    }
}

void WorkQueue::work() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        bool idle = false;
        Job job = next(lk, &idle);
        if (!job) return;
        lk.unlock();
        Status s;
        try {
            s = job();
        } catch (const std::exception& e) {
            s = Status(DYAD_RC_SYSFAIL, std::string("a job threw: ") + e.what(), EIO);
        } catch (...) {
            s = Status(DYAD_RC_SYSFAIL, "a job threw", EIO);
        }
        job = nullptr;  // its captures go before the next job
        lk.lock();
        record(s);
        if (idle) {
            // Another worker may take idle work now.
            --idle_running_;
            ++wakes_;
            work_cv_.notify_all();
        }
    }
}

}  // namespace dyad::client
