// FLUX_RPC / STREAM backend: file bytes travel as response frames of the
// fetch RPC, in bounded chunks, with reads pipelined ahead of socket writes
// (at most kStreamDepth chunks in memory per transfer).
#include <algorithm>
#include <cerrno>
#include <deque>
#include <unistd.h>

#include "common/checksum.hpp"
#include "common/log.hpp"
#include "dtl.hpp"

namespace dyad::dtl {
namespace {

Attributes stream_attributes() {
    Attributes a;
    a.name = "FLUX_RPC";
    a.latency_us = 40;
    a.bandwidth_gbps = 2.0;
    a.rma_native = false;
    a.max_message = kStreamChunk;
    return a;
}

class StreamTransfer : public std::enable_shared_from_this<StreamTransfer> {
  public:
    StreamTransfer(std::shared_ptr<FetchJob> job, SendDone done, size_t chunk, int depth)
        : job_(std::move(job)), done_(std::move(done)), chunk_(chunk), bufs_(depth) {
        for (int i = 0; i < depth; ++i) free_.push_back(i);
    }

    void start() {
        auto self = shared_from_this();
        watchdog_ = std::make_unique<asio::steady_timer>(job_->req->io());
        arm_watchdog();
        job_->req->on_cancel(
            [self] { self->fail(Status(DYAD_RC_BADFETCH, "consumer went away", ECONNRESET)); });
        // The first chunk travels with the first response (one frame, one
        // write for a small file); an empty file gets the meta alone.
        if (job_->size == 0) job_->req->respond(first_meta());
        first_ = job_->size > 0;
        pump();
    }

  private:
    // Runs on the loop: starts the next read when a buffer is free, finishes
    // when everything was read and written.
    void pump() {
        if (finished_) return;
        if (read_off_ == job_->size && writes_ == 0 && !reading_) {
            finish(Status::ok());
            return;
        }
        if (reading_ || read_off_ == job_->size || free_.empty()) return;
        reading_ = true;
        int idx = free_.front();
        free_.pop_front();
        uint64_t off = read_off_;
        size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_, job_->size - off));
        read_off_ += n;
        auto self = shared_from_this();
        asio::post(*job_->file_pool, [self, idx, off, n] {
            auto& buf = self->bufs_[idx];
            if (buf.size() < n) buf.resize(self->chunk_);
            Status st = self->read_chunk(buf.data(), n, off);
            if (st) self->hash_.update(buf.data(), n);
            asio::post(self->job_->req->io(), [self, idx, n, st] { self->on_read(idx, n, st); });
        });
    }

    Status read_chunk(char* p, size_t n, uint64_t off) {
        size_t got = 0;
        while (got < n) {
            ssize_t r = ::pread(job_->fd.get(), p + got, n - got, static_cast<off_t>(off + got));
            if (r < 0) {
                if (errno == EINTR) continue;
                return Status(DYAD_RC_BADFIO, "read of '" + job_->upath + "' failed", errno);
            }
            if (r == 0)
                return Status(DYAD_RC_BADFIO, "'" + job_->upath + "' shrank while being served",
                              EIO);
            got += static_cast<size_t>(r);
        }
        return Status::ok();
    }

    void on_read(int idx, size_t n, Status st) {
        reading_ = false;
        if (finished_) return report();  // a failure waited for this read
        if (!st) return fail(st);
        ++writes_;
        auto self = shared_from_this();
        nlohmann::json meta = first_ ? first_meta() : nlohmann::json(nullptr);
        first_ = false;
        job_->req->respond(
            std::move(meta), asio::buffer(bufs_[idx].data(), n), [self, idx, n](bool ok) {
                --self->writes_;
                self->free_.push_back(idx);
                if (ok) self->arm_watchdog();
                if (!ok)
                    return self->fail(
                        Status(DYAD_RC_BADFETCH, "connection to consumer lost", ECONNRESET));
                self->sent_ += n;
                self->pump();
            });
        pump();
    }

    // A consumer that stops reading must not hold the transfer (and the
    // file's shared lock) forever: no progress for idle_timeout_s ends it.
    void arm_watchdog() {
        if (finished_) return;
        double s = std::min(job_->idle_timeout_s, 1e9);  // no overflow for huge values
        watchdog_->expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(s)));
        std::weak_ptr<StreamTransfer> weak = shared_from_this();
        watchdog_->async_wait([weak](asio::error_code ec) {
            auto self = weak.lock();
            if (ec || !self || self->finished_) return;
            self->fail(Status(DYAD_RC_TIMEOUT,
                              "consumer made no progress for " +
                                  std::to_string(self->job_->idle_timeout_s) + " s",
                              ETIMEDOUT));
            self->job_->req->close_connection();
        });
    }

    nlohmann::json first_meta() const { return {{"size", job_->size}, {"transport", "FLUX_RPC"}}; }

    void fail(Status st) {
        if (finished_) return;
        finish(std::move(st));
    }

    void finish(Status st) {
        finished_ = true;
        result_ = std::move(st);
        if (watchdog_) watchdog_->cancel();
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
    std::vector<std::vector<char>> bufs_;
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
};

class StreamSender : public Sender {
  public:
    StreamSender() : attrs_(stream_attributes()) {}
    const Attributes& attributes() const override { return attrs_; }
    void send(std::shared_ptr<FetchJob> job, SendDone done) override {
        std::make_shared<StreamTransfer>(std::move(job), std::move(done), kStreamChunk,
                                         kStreamDepth)
            ->start();
    }

  private:
    Attributes attrs_;
};

class StreamReceiver : public Receiver {
  public:
    StreamReceiver() : attrs_(stream_attributes()) {}
    const Attributes& attributes() const override { return attrs_; }
    nlohmann::json describe() override { return nlohmann::json::object(); }

    Result<nlohmann::json> receive(rpc::Connection& conn, uint32_t tag, Sink& sink,
                                   double idle_s) override {
        for (;;) {
            Deadline deadline = Deadline::after(idle_s);
            auto f = conn.read_frame(deadline);
            if (!f) return f.status();
            const auto& h = f->header;
            if (h.type == rpc::Type::error && h.tag == 0)
                return rpc::Connection::error_status(f.value(), "fetch");
            if (h.tag != tag) {
                Status s = conn.skip_data(h.data_len, deadline);
                if (!s) return s;
                continue;
            }
            switch (h.type) {
                case rpc::Type::response: {
                    if (h.data_len == 0) break;
                    if (buf_.size() < h.data_len) buf_.resize(h.data_len);
                    Status s = conn.read_data(buf_.data(), h.data_len, deadline);
                    if (!s) return s;
                    s = sink.write(buf_.data(), h.data_len);
                    if (!s) return s;
                    break;
                }
                case rpc::Type::end:
                    return f->meta;
                case rpc::Type::error:
                    return rpc::Connection::error_status(f.value(), "fetch");
                default:
                    return Status(
                        DYAD_RC_BADRPC,
                        std::string("unexpected ") + rpc::type_name(h.type) + " frame in fetch",
                        EPROTO);
            }
        }
    }

  private:
    Attributes attrs_;
    std::vector<char> buf_;
};

}  // namespace

nlohmann::json Attributes::to_json() const {
    return {{"name", name},
            {"latency_us", latency_us},
            {"bandwidth_gbps", bandwidth_gbps},
            {"rma_native", rma_native},
            {"max_message", max_message}};
}

const std::vector<Backend>& backends() {
    static const std::vector<Backend> table = {
        {"FLUX_RPC",
         {"STREAM"},
         stream_attributes,
         []() -> Result<std::unique_ptr<Receiver>> {
             return std::unique_ptr<Receiver>(new StreamReceiver());
         },
         []() -> Result<std::unique_ptr<Sender>> {
             return std::unique_ptr<Sender>(new StreamSender());
         }},
    };
    return table;
}

}  // namespace dyad::dtl
