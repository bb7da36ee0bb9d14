// SPDX-License-Identifier: Apache-2.0
// FLUX_RPC / STREAM backend: file bytes travel as response frames of the
// fetch RPC, in bounded chunks, with reads pipelined ahead of socket writes
// (at most kStreamDepth chunks in memory per transfer).
#include <algorithm>
#include <cerrno>
#include <deque>
#include <memory>
#include <unistd.h>

#include "common/checksum.hpp"
#include "common/log.hpp"
#include "dtl/chunked.hpp"
#include "dtl/dtl.hpp"
#include "dtl/options.hpp"
#include "proto/transfer.hpp"
#include "dtl/write_behind.hpp"

namespace dyad::dtl {
namespace {

Attributes stream_attributes() {
    Attributes a;
    a.name = name_of(Kind::stream);
    a.latency_us = 100;
    a.bandwidth_gbps = 1.2;
    a.rma_native = false;
    a.max_message = kStreamChunk;
    return a;
}

// The chunk of a large file: bigger chunks cost fewer hand-offs between the
// loop and the file threads per GiB (each chunk is one read job, one post
// back, one queued frame). Two of 2 MiB keep 4 MiB in flight, as four of
// 1 MiB did (4 MiB chunks: fewer switches still, but not faster in the
// benches here; docs/design.md, "Chunk size"). Only where the peer's share
// holds 8 such pipelines, so shares stay as fine-grained as before on a
// small budget (--memory 16M keeps 1 MiB chunks).
constexpr size_t kStreamBigChunk = 2u << 20;
constexpr uint64_t kStreamBigFrom = 32u << 20;  // files from this size

struct ChunkPlan {
    size_t chunk;
    int depth;
};

ChunkPlan stream_chunks(const FetchJob& job, bool sendfile) {
    const MemoryBudget* b = job.budget;
    const uint64_t share = b ? (b->per_peer() ? b->per_peer() : b->limit()) : 0;
    if (sendfile || job.size < kStreamBigFrom || share < 8 * 2 * kStreamBigChunk)
        return {kStreamChunk, kStreamDepth};
    return {kStreamBigChunk, 2};
}

class StreamTransfer : public ChunkedTransfer {
  public:
    StreamTransfer(std::shared_ptr<FetchJob> job, SendDone done, bool sendfile,
                   std::shared_ptr<uint64_t> stalled, ChunkPlan plan)
        : ChunkedTransfer(std::move(job), std::move(done), plan.chunk, plan.depth),
          sendfile_(sendfile),
          stalled_(std::move(stalled)) {}

  protected:
    void write_chunk(const char* p, size_t n, nlohmann::json meta,
                     std::function<void(bool)> done) override {
        job().ch->send(std::move(meta), asio::buffer(p, n), std::move(done));
    }
    void write_file_chunk(uint64_t off, size_t n, nlohmann::json meta,
                          std::function<void(bool)> done) override {
        job().ch->send_file(std::move(meta), job().fd.get(), off, n, std::move(done));
    }
    // Files of more than one chunk go by sendfile(2); a single chunk is
    // read and sent from one buffer (one read of the file, not two).
    bool file_send() const override { return sendfile_ && job().size > kStreamChunk; }
    bool inline_first_chunk() const override { return true; }
    void on_stalled() override { ++*stalled_; }
    nlohmann::json first_meta() const override {
        return proto::FetchStart{job().size, name_of(Kind::stream)}.build();
    }

  private:
    bool sendfile_;
    std::shared_ptr<uint64_t> stalled_;  // the sender's count (on the loop)
};

class StreamSender : public Sender {
  public:
    explicit StreamSender(const StreamOptions& o)
        : attrs_(stream_attributes()), sendfile_(o.sendfile) {}
    const Attributes& attributes() const override { return attrs_; }
    nlohmann::json stats() const override {
        return {{"sendfile", sendfile_},
                {"sendfile_transfers", by_sendfile_},
                {"stalled_consumers", *stalled_},
                {"big_chunk_transfers", big_chunks_}};
    }
    void send(std::shared_ptr<FetchJob> job, SendDone done) override {
        if (sendfile_ && job->size > kStreamChunk) ++by_sendfile_;
        const ChunkPlan plan = stream_chunks(*job, sendfile_);
        if (plan.chunk != kStreamChunk) ++big_chunks_;
        std::make_shared<StreamTransfer>(std::move(job), std::move(done), sendfile_, stalled_, plan)
            ->start();
    }

  private:
    Attributes attrs_;
    // DYAD_STREAM_SENDFILE=1 on the service turns it on. Off by default:
    // measured slower here (docs/design.md), because the end-to-end
    // checksum reads every byte anyway.
    bool sendfile_ = false;
    uint64_t by_sendfile_ = 0;
    uint64_t big_chunks_ = 0;  // transfers in kStreamBigChunk chunks
    // Transfers ended because their consumer took nothing for --send-timeout.
    std::shared_ptr<uint64_t> stalled_ = std::make_shared<uint64_t>(0);
};

// Files above this size are written behind (write_behind.hpp): below it, a
// thread costs more than the overlap gains.
constexpr uint64_t kWriteBehindFrom = kStreamDepth * kStreamChunk;

class StreamReceiver : public Receiver {
  public:
    explicit StreamReceiver(WriteBehindOption write_behind)
        : attrs_(stream_attributes()), write_behind_(std::move(write_behind)) {}
    const Attributes& attributes() const override { return attrs_; }
    nlohmann::json describe() override { return nlohmann::json::object(); }

    Result<nlohmann::json> receive(FetchChannel& ch, Sink& sink) override {
        // The answer and each data frame carry file bytes, in order. Files
        // of more than kStreamDepth chunks are written behind (a writer
        // thread hashes and writes while the next chunks arrive).
        std::unique_ptr<WriteBehind> behind;
        for (;;) {
            auto m = ch.next();
            if (!m) return m.status();
            if (m->kind == FetchChannel::Kind::end) {
                if (behind) {
                    Status s = behind->finish();
                    if (!s) return s;
                }
                return m->meta;
            }
            if (m->kind == FetchChannel::Kind::answer &&
                proto::start_size(m->meta).value_or(0) > kWriteBehindFrom) {
                const auto& on = write_behind_.on;
                if (!on) return on.status();
                if (on.value()) behind = std::make_unique<WriteBehind>(sink);
            }
            if (m->data_len == 0) continue;
            if (behind) {
                auto b = behind->take(m->data_len);
                if (!b) return b.status();
                Status s = ch.read(b.value(), m->data_len);
                if (!s) {
                    behind->give_back();
                    return s;
                }
                s = behind->push(m->data_len);
                if (!s) return s;
                continue;
            }
            if (buf_.size() < m->data_len) buf_.resize(m->data_len);
            Status s = ch.read(buf_.data(), m->data_len);
            if (!s) return s;
            s = sink.write(buf_.data(), m->data_len);
            if (!s) return s;
        }
    }

  private:
    Attributes attrs_;
    WriteBehindOption write_behind_;
    std::vector<char> buf_;
};

}  // namespace

nlohmann::json Attributes::to_json() const {
    return {{"name", name},
            {"info", info},
            {"latency_us", latency_us},
            {"bandwidth_gbps", bandwidth_gbps},
            {"rma_native", rma_native},
            {"max_message", max_message}};
}

Backend stream_backend() {
    return {name_of(Kind::stream), aliases_of(Kind::stream), stream_attributes,
            []() -> Result<std::unique_ptr<Receiver>> {
                return std::unique_ptr<Receiver>(
                    new StreamReceiver(WriteBehindOption::from_settings()));
            },
            [](asio::io_context&, const ServiceBind&) -> Result<std::unique_ptr<Sender>> {
                auto o = StreamOptions::from_settings();
                if (!o) return o.status();
                return std::unique_ptr<Sender>(new StreamSender(o.value()));
            }};
}

}  // namespace dyad::dtl
