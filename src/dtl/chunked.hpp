// SPDX-License-Identifier: Apache-2.0
// The chunk pipeline shared by the sending side of every transport: file
// reads on the service's file pool run ahead of the transport's sends, at
// most `depth` chunks of `chunk` bytes in memory per transfer, an XXH3 of the
// bytes as they are read, and a watchdog for consumers that stop taking data.
// A transport supplies write_chunk(); everything else is here.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <unistd.h>

#include <asio.hpp>

#include "budget.hpp"
#include "common/checksum.hpp"
#include "dtl.hpp"

namespace dyad::dtl {

class ChunkedTransfer : public std::enable_shared_from_this<ChunkedTransfer> {
  public:
    ChunkedTransfer(std::shared_ptr<FetchJob> job, SendDone done, size_t chunk, int depth)
        : job_(std::move(job)), done_(std::move(done)), chunk_(chunk), bufs_(depth) {
        for (int i = 0; i < depth; ++i) free_.push_back(i);
        // Without the service's budget (tools, tests) the transfer gets one
        // of its own, as large as its depth.
        if (!job_->budget) {
            own_budget_ = std::make_unique<MemoryBudget>(chunk * static_cast<size_t>(depth));
            job_->budget = own_budget_.get();
        }
    }

    void start() {
        auto self = shared_from_this();
        watchdog_ = std::make_unique<asio::steady_timer>(job_->ch->io());
        arm_watchdog();
        job_->ch->on_cancel(
            [self] { self->fail(Status(DYAD_RC_BADFETCH, "consumer went away", ECONNRESET)); });
        // Transports that can, carry the first chunk in the first response
        // (one frame, one write for a small file); otherwise, or for an empty
        // file, the meta goes alone first.
        bool inline_first = inline_first_chunk() && job_->size > 0;
        if (!inline_first) job_->ch->send(first_meta());
        first_ = inline_first;
        pump();
    }
    virtual ~ChunkedTransfer() = default;

  protected:
    // How one chunk moves. `meta` is non-null only for an inlined first chunk.
    // `done(ok)` must be called on the service loop once `p` may be reused.
    virtual void write_chunk(const char* p, size_t n, nlohmann::json meta,
                             std::function<void(bool)> done) = 0;
    virtual bool inline_first_chunk() const = 0;
    virtual nlohmann::json first_meta() const = 0;
    // The transfer is over (success or failure): drop queued work that holds
    // references to it.
    virtual void on_finish() {}
    // The watchdog ended the transfer: the consumer took nothing for
    // idle_timeout_s (a transport counts it).
    virtual void on_stalled() {}
    // Zero-copy transports whose destination memory is mapped here (a
    // consumer's shared-memory window) have file reads land there directly:
    // direct_target(n) gives the address for the next chunk, or nullptr when
    // there is no room yet (then call resume() once there is). The chunk is
    // then handed to write_chunk() at that address; no buffer is used.
    virtual bool direct() const { return false; }
    virtual char* direct_target(size_t n) {
        (void)n;
        return nullptr;
    }
    // Transports that send file chunks from the page cache (sendfile):
    // reads only hash (through a small scratch buffer that stays in cache)
    // and write_file_chunk() sends; no chunk buffer is held.
    virtual bool file_send() const { return false; }
    virtual void write_file_chunk(uint64_t off, size_t n, nlohmann::json meta,
                                  std::function<void(bool)> done) {
        (void)off;
        (void)n;
        (void)meta;
        done(false);
    }
    void resume() { pump(); }
    // Ends the transfer with an error (on the loop).
    void abort(Status st) { fail(std::move(st)); }
    FetchJob& job() { return *job_; }
    const FetchJob& job() const { return *job_; }

  private:
    // Runs on the loop: starts the next read when a buffer is free, finishes
    // when everything was read and written.
    void pump() {
        if (finished_) return;
        if (read_off_ == job_->size && writes_ == 0 && !reading_) {
            finish(Status::ok());
            return;
        }
        if (reading_ || read_off_ == job_->size) return;
        uint64_t off = read_off_;
        size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_, job_->size - off));
        int idx = -1;
        char* target = nullptr;
        if (file_send()) {
            if (writes_ >= static_cast<int>(bufs_.size())) return;  // depth
        } else if (direct()) {
            target = direct_target(n);
            if (!target) return;  // resume() comes when there is room
        } else {
            if (free_.empty() || parked_ || backed_up()) return;
            Buffer b = granted_ ? std::move(granted_)
                                : job_->budget->try_get(job_->endpoint, chunk_, job_->peer);
            if (!b) return park();
            idx = free_.front();
            free_.pop_front();
            bufs_[idx] = std::move(b);
        }
        reading_ = true;
        read_off_ += n;
        auto self = shared_from_this();
        asio::post(*job_->file_pool, [self, idx, target, off, n] {
            if (self->file_send()) {
                Status st = self->hash_range(off, n);
                asio::post(self->job_->ch->io(),
                           [self, off, n, st] { self->on_read(-1, nullptr, off, n, st); });
                return;
            }
            char* p = target;
            if (!p) p = self->bufs_[idx].data();
            Status st = self->read_chunk(p, n, off);
            if (st) self->hash_.update(p, n);
            asio::post(self->job_->ch->io(),
                       [self, idx, p, off, n, st] { self->on_read(idx, p, off, n, st); });
        });
    }

    // Read-ahead only while the consumer keeps up: a transfer whose last
    // write took longer than kBackedUp, or whose oldest write has waited
    // that long, holds no further buffer while a write is under way
    // (written() pumps again). A consumer that reads slowly or not at all
    // then holds the one chunk on its way, not its whole pipeline, and the
    // memory goes to transfers that move. Writes complete in order, so the
    // oldest is the front of `write_started_`.
    bool backed_up() const {
        // (A buffer granted from the pending queue is used, not held idle.)
        if (write_started_.empty() || granted_) return false;
        return slow_writes_ ||
               std::chrono::steady_clock::now() - write_started_.front() > kBackedUp;
    }

    Status read_chunk(char* p, size_t n, uint64_t off) {
        return job_->fs->pread_all(job_->fd.get(), p, n, job_->offset + off,
                                   "'" + job_->upath + "'");
    }

    // File-send mode: the chunk's bytes, read through a 256 KiB scratch
    // buffer of the file thread (so memory is per thread, not per
    // transfer, and stays in cache), go into the checksum; the page cache
    // now holds them for sendfile.
    Status hash_range(uint64_t off, size_t n) {
        constexpr size_t kScratch = 256u << 10;
        thread_local std::vector<char> scratch(kScratch);
        for (size_t done = 0; done < n;) {
            size_t k = std::min(kScratch, n - done);
            Status st = read_chunk(scratch.data(), k, off + done);
            if (!st) return st;
            hash_.update(scratch.data(), k);
            done += k;
        }
        return Status::ok();
    }

    // A chunk is read (file-send mode: hashed; `p` is null): send it.
    void on_read(int idx, const char* p, uint64_t off, size_t n, Status st) {
        reading_ = false;
        if (finished_) return report();  // a failure waited for this read
        if (!st) return fail(st);
        ++writes_;
        write_started_.push_back(std::chrono::steady_clock::now());
        auto self = shared_from_this();
        nlohmann::json meta = first_ ? first_meta() : nlohmann::json(nullptr);
        first_ = false;
        auto done = [self, idx, n](bool ok) { self->written(idx, n, ok); };
        if (p)
            write_chunk(p, n, std::move(meta), std::move(done));
        else
            write_file_chunk(job_->offset + off, n, std::move(meta), std::move(done));
        pump();
    }

    void written(int idx, size_t n, bool ok) {
        --writes_;
        if (!write_started_.empty()) {
            slow_writes_ = std::chrono::steady_clock::now() - write_started_.front() > kBackedUp;
            write_started_.pop_front();
        }
        if (idx >= 0) {
            bufs_[idx].reset();  // back to the budget: may resume a parked transfer
            free_.push_back(idx);
        }
        if (!ok) return fail(Status(DYAD_RC_BADFETCH, "connection to consumer lost", ECONNRESET));
        progress_ = std::chrono::steady_clock::now();
        sent_ += n;
        pump();
    }

    // The budget is spent: wait on its pending queue. The grant comes back
    // through the loop; a transfer that ended meanwhile returns the buffer.
    void park() {
        parked_ = true;
        std::weak_ptr<ChunkedTransfer> weak = shared_from_this();
        asio::io_context* io = &job_->ch->io();
        ticket_ = job_->budget->wait(
            job_->endpoint, chunk_,
            [weak, io](Buffer b) {
                auto hold = std::make_shared<Buffer>(std::move(b));
                asio::post(*io, [weak, hold] {
                    auto self = weak.lock();
                    if (!self || self->finished_) return;  // `hold` returns the buffer
                    self->parked_ = false;
                    self->ticket_ = 0;
                    self->granted_ = std::move(*hold);
                    self->pump();
                });
            },
            job_->peer);
    }

    // A consumer that stops reading must not hold the transfer (and the
    // file's shared lock) forever: no progress for idle_timeout_s ends it.
    // One timer per transfer: a written chunk only stamps `progress_`, and
    // the timer, when it fires, waits again for what is left of the window
    // since the last stamp (re-arming a timer per chunk cost a timerfd_settime
    // per MiB).
    void arm_watchdog() {
        if (finished_) return;
        progress_ = std::chrono::steady_clock::now();
        wait_watchdog(idle_window());
    }

    std::chrono::steady_clock::duration idle_window() const {
        return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(std::min(job_->idle_timeout_s, 1e9)));
    }

    void wait_watchdog(std::chrono::steady_clock::duration wait) {
        watchdog_->expires_after(wait);
        std::weak_ptr<ChunkedTransfer> weak = shared_from_this();
        watchdog_->async_wait([weak](asio::error_code ec) {
            auto self = weak.lock();
            if (ec || !self || self->finished_) return;
            // Waiting for the service's memory is not the consumer's fault.
            if (self->parked_) return self->arm_watchdog();
            const auto window = self->idle_window();
            const auto since = std::chrono::steady_clock::now() - self->progress_;
            if (since < window) return self->wait_watchdog(window - since);
            self->on_stalled();
            self->fail(Status(DYAD_RC_TIMEOUT,
                              "consumer made no progress for " +
                                  std::to_string(self->job_->idle_timeout_s) + " s",
                              ETIMEDOUT));
            self->job_->ch->close();
        });
    }

    void fail(Status st) {
        if (finished_) return;
        finish(std::move(st));
    }

    void finish(Status st) {
        finished_ = true;
        result_ = std::move(st);
        if (watchdog_) watchdog_->cancel();
        if (parked_ && ticket_) job_->budget->cancel(job_->endpoint, ticket_);
        granted_.reset();
        on_finish();
        report();
    }

    // Completion is reported only when no read is running on a file thread:
    // the caller closes the file when told.
    void report() {
        if (reading_ || !done_) return;
        auto done = std::move(done_);
        done_ = nullptr;
        done(result_, sent_, result_.is_ok() ? hash_.hex() : std::string());
    }

    std::shared_ptr<FetchJob> job_;
    SendDone done_;
    size_t chunk_;
    std::unique_ptr<MemoryBudget> own_budget_;  // before bufs_: destroyed after them
    std::vector<Buffer> bufs_;
    Buffer granted_;  // from the pending queue, for the next read
    bool parked_ = false;
    uint64_t ticket_ = 0;
    std::deque<int> free_;
    uint64_t read_off_ = 0;
    uint64_t sent_ = 0;
    int writes_ = 0;
    bool reading_ = false;
    Status result_;
    bool finished_ = false;
    bool first_ = false;
    Xxh3 hash_;
    std::unique_ptr<asio::steady_timer> watchdog_;
    std::chrono::steady_clock::time_point progress_;                   // the last chunk written
    std::deque<std::chrono::steady_clock::time_point> write_started_;  // writes under way
    bool slow_writes_ = false;  // the last write took longer than kBackedUp
    static constexpr std::chrono::milliseconds kBackedUp{50};
};

}  // namespace dyad::dtl
