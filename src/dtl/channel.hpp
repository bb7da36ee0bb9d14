// SPDX-License-Identifier: Apache-2.0
// The fetch channel: what a transport sees of one fetch conversation, on each
// side. The conversation itself (the request, the first answer, error
// frames, the END trailer with size and checksum, cancellation, deadlines)
// belongs to the channel's implementation over the rpc layer
// (client/fetch_channel.cpp on the consumer, service/send_channel.cpp on the
// service); transports only move bytes and exchange their own fields.
//
//   consumer                                   service
//   Client::fetch_via                          Service::on_fetch
//     RpcFetchChannel::open --- request ---->    open, lock, Sender::send(job)
//     Receiver::receive(ch, sink)                  job->ch: SendChannel
//       ch.first()        <---- answer -------       ch.send(first meta)
//       ch.take_fd()      <-- (fd, LOCAL) ----       ch.send_fd(first meta, fd)
//       ch.next()/read()  <---- data/notices --      ch.send(meta, bytes)
//       ch.ack(seq)       ----- update ------>       AckWindow::ack
//     RpcFetchChannel::finish <- END {size,xxh3}   SendDone -> end / error
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include <asio/buffer.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <nlohmann/json.hpp>

#include "common/fd.hpp"
#include "common/log.hpp"
#include "common/rate_limit.hpp"
#include "common/status.hpp"
#include "common/json_text.hpp"
#include "proto/transfer.hpp"

namespace dyad::dtl {

// ---- consumer side ----

class FetchChannel {
  public:
    enum class Kind { answer, data, end };
    struct Message {
        Kind kind = Kind::answer;
        nlohmann::json meta = nlohmann::json::object();  // always an object
        size_t data_len = 0;  // bytes to take with read() before the next next()
    };
    virtual ~FetchChannel() = default;

    // The next message of this fetch, within the transfer's idle deadline.
    // Error frames become their Status; frames of other requests are
    // skipped; anything out of protocol is DYAD_RC_BADRPC.
    [[nodiscard]] virtual Result<Message> next() = 0;
    // Data of the last message (all of it, before the next next()).
    [[nodiscard]] virtual Status read(void* p, size_t n) = 0;
    // A transport's message back to the service (credits, acknowledgements).
    [[nodiscard]] virtual Status update(const nlohmann::json& meta) = 0;
    // Readable when next() has something to read (to poll with other fds);
    // poll it only when buffered() is false.
    virtual int fd() const = 0;
    // next() has bytes already read: it needs no wait (fd() may not poll
    // readable then).
    virtual bool buffered() const { return false; }
    // Seconds without progress before the fetch fails.
    virtual double idle_s() const = 0;
    // The file descriptor the service passed with this fetch's first answer
    // (SCM_RIGHTS, over a Unix socket: LOCAL), once; else an invalid one.
    virtual UniqueFd take_fd() { return UniqueFd(); }

    // The first answer: `what` names the transport in errors.
    [[nodiscard]] Result<Message> first(const char* what) {
        auto m = next();
        if (!m) return m;
        if (m->kind != Kind::answer)
            return Status(DYAD_RC_BADRPC,
                          std::string("unexpected first frame in a ") + what +
                              " fetch: " + m->meta.dump(-1, ' ', false, kBadUtf8Replaced),
                          EPROTO);
        return m;
    }
    // The END trailer, which must come next (nothing more is expected).
    [[nodiscard]] Result<nlohmann::json> end(const char* what) {
        auto m = next();
        if (!m) return m.status();
        if (m->kind != Kind::end)
            return Status(DYAD_RC_BADRPC, std::string("expected the end of a ") + what + " fetch",
                          EPROTO);
        return m->meta;
    }
    // Returns chunk `seq` to the service's window (AckWindow).
    [[nodiscard]] Status ack(uint64_t seq) { return update(proto::ChunkAck{seq}.build()); }
};

// ---- service side ----

class SendChannel {
  public:
    using WriteDone = std::function<void(bool ok)>;
    virtual ~SendChannel() = default;
    virtual asio::io_context& io() = 0;
    // One message of the answer (the first carries the size and the
    // transport's fields). `data` must stay valid until `done` runs (with
    // ok=false if the consumer went away first).
    virtual void send(nlohmann::json meta, asio::const_buffer data = {}, WriteDone done = {}) = 0;
    // The same with `len` bytes of file `fd` from `off` as data (sendfile).
    virtual void send_file(nlohmann::json meta, int fd, uint64_t off, size_t len,
                           WriteDone done) = 0;
    // Called once, on the loop, if the fetch is cancelled (consumer gone,
    // cancel frame, deadline) before it finished.
    virtual void on_cancel(std::function<void()> fn) = 0;
    // Called on the loop for each update the consumer sends.
    virtual void on_update(std::function<void(const nlohmann::json&)> fn) = 0;
    // Drops the consumer's connection (it stopped reading).
    virtual void close() = 0;
    // Whether send_fd can work: the consumer is connected over a Unix socket.
    virtual bool can_send_fd() const { return false; }
    // A message (no data) that hands the consumer the open file `fd`
    // (SCM_RIGHTS); the fd is duplicated, the caller keeps its own. Where
    // descriptors cannot pass, nothing is sent and `done` gets ok=false.
    virtual void send_fd(nlohmann::json meta, int fd, WriteDone done) {
        (void)meta;
        (void)fd;
        if (done) asio::post(io(), [done] { done(false); });
    }
};

// The window of chunks a consumer has not yet acknowledged, for transports
// whose chunks occupy a resource until the consumer has taken them (a slot
// of its UCX window, a registered libfabric buffer). Chunks are numbered in
// order from 0; the consumer acknowledges each by its number, in any order,
// or, with in_order (a ring of slots, reused k + capacity after k), oldest
// first. Acknowledgements of numbers not outstanding (or out of order) are
// counted and ignored.
template <class T>
class AckWindow {
  public:
    explicit AckWindow(size_t capacity, bool in_order = false)
        : capacity_(capacity), in_order_(in_order) {}
    size_t capacity() const { return capacity_; }
    size_t outstanding() const { return live_; }
    bool full() const { return live_ >= capacity_; }
    uint64_t next_seq() const { return base_ + items_.size(); }
    uint64_t oldest_seq() const { return base_; }
    uint64_t bogus() const { return bogus_; }

    // Records chunk next_seq() as outstanding; returns its number.
    uint64_t push(T v) {
        uint64_t seq = next_seq();
        items_.push_back(std::move(v));
        ++live_;
        return seq;
    }
    // An update from the consumer: the acknowledged chunk's value, or
    // nothing (malformed, unknown, or already acknowledged).
    std::optional<T> ack(const nlohmann::json& update) {
        auto seq = proto::ChunkAck::seq_of(update);
        if (!seq || *seq < base_ || *seq >= next_seq() || !items_[*seq - base_] ||
            (in_order_ && *seq != base_)) {
            ++bogus_;
            // (A peer sends these: rate-limited.)
            static log::RateLimit limit("dtl", "bogus acknowledgements");
            if (limit.allow())
                DYAD_WARN("dtl", "ignored an acknowledgement of no outstanding chunk: %s",
                          update.dump(-1, ' ', false, kBadUtf8Replaced).c_str());
            return std::nullopt;
        }
        std::optional<T> out = std::move(items_[*seq - base_]);
        items_[*seq - base_].reset();
        --live_;
        while (!items_.empty() && !items_.front()) {
            items_.pop_front();
            ++base_;
        }
        return out;
    }
    // Every outstanding value, oldest first (the transfer is over).
    template <class F>
    void drain(F&& fn) {
        for (auto& v : items_)
            if (v) fn(*v);
        base_ += items_.size();
        items_.clear();
        live_ = 0;
    }

  private:
    size_t capacity_;
    bool in_order_;
    std::deque<std::optional<T>> items_;  // from base_; reset once acknowledged
    uint64_t base_ = 0;
    size_t live_ = 0;
    uint64_t bogus_ = 0;
};

}  // namespace dyad::dtl
