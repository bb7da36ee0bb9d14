// SPDX-License-Identifier: Apache-2.0
// The libfabric transport, consumer side (overview in ofi.cpp): one
// endpoint per process and protocol, service addresses in an AV with LRU
// eviction; reads into a registered window of kDepth chunk slots, or into
// the destination file itself (Placement), run by the consumer's chunk
// window (receive_window.hpp).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/base64.hpp"
#include "common/json_text.hpp"
#include "common/log.hpp"
#include "common/settings.hpp"
#include "dtl/peer_address.hpp"
#include "proto/transfer.hpp"
#include "ofi_consumer.hpp"
#include "ofi_transport.hpp"
#include "dtl/per_process.hpp"
#include "dtl/receive_window.hpp"

namespace dyad::dtl::ofi {
namespace {

// The destination file, for the reads to land in directly (no copy through
// the window and no write(2)). Its blocks are reserved first with fallocate,
// so a full disk is an error here, never a SIGBUS in the middle of a read;
// each read maps its own chunk of the file, unmapped once hashed, so the
// consumer's footprint does not grow with the file.
class Placement {
  public:
    // False (and no error) unless `on` (DYAD_OFI_PLACEMENT=1), or where the
    // file system cannot reserve blocks: the reads then go through the window.
    Result<bool> open(bool on, int fd, uint64_t size) {
        if (!on || fd < 0 || size == 0) return false;
        // fallocate(2), not posix_fallocate: where the file system cannot
        // reserve, glibc's emulation would write the whole file with zeros.
        int r = 0;
        while (::fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0 && (r = errno) == EINTR) r = 0;
        if (r == EOPNOTSUPP || r == ENOSYS || r == EINVAL) return false;
        if (r != 0)
            return Status(DYAD_RC_BADFIO,
                          "cannot reserve " + std::to_string(size) +
                              " bytes for the copy in the consumer's directory",
                          r);
        fd_ = fd;
        return true;
    }
    explicit operator bool() const { return fd_ >= 0; }
    // Chunk offsets are multiples of the chunk size, so page-aligned.
    Result<char*> map(uint64_t off, size_t len) {
        void* m =
            ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, static_cast<off_t>(off));
        if (m == MAP_FAILED)
            return Status(DYAD_RC_BADFIO, "cannot map the file for OFI reads", errno);
        return static_cast<char*>(m);
    }
    static void unmap(char* p, size_t len) { ::munmap(p, len); }
    // Nothing was placed: the file goes back to empty (another transport may
    // write it from the start).
    void undo() { ::ftruncate(fd_, 0); }

  private:
    int fd_ = -1;
};

// One read of the window, by slot: its completion context (first:
// libfabric hands it back) and what the read holds.
struct ReadOp {
    fi_context2 ctx;
    ReceiveWindow* w = nullptr;
    ChunkSlot* slot = nullptr;
    ofi::Region mr;          // the mapped file's run, registered while the read is out
    char* mapped = nullptr;  // that run's mapping (placement), until handed over
    bool posted = false;
};

// How chunks move: the service announces each ({seq, addr, key, len}, in
// order); the consumer reads it with fi_read into the slot (or the mapped
// file) and acknowledges it once handed over.
class ReadMover : public ChunkMover {
  public:
    ReadMover(OfiConsumer& c, FetchChannel& ch, fi_addr_t peer, Placement& place, void* desc,
              bool& uncancelled)
        : c_(c),
          ch_(ch),
          peer_(peer),
          place_(place),
          desc_(desc),
          uncancelled_(uncancelled),
          ops_(new std::vector<ReadOp>(static_cast<size_t>(kDepth))) {
        for (auto& op : *ops_) c_.attach(&op.ctx, &inbox_);
    }
    ~ReadMover() override {
        for (auto& op : *ops_) c_.detach(&op.ctx);
        // Reads that could not be cancelled may still complete: their
        // contexts stay allocated (never reused by a later read, whose
        // completion could be mistaken for theirs).
        if (!uncancelled_) delete ops_;
    }
    ReadMover(const ReadMover&) = delete;
    ReadMover& operator=(const ReadMover&) = delete;

    // Takes the next descriptor: blocks for one when nothing is in flight
    // (`must`), otherwise only one already here.
    Result<bool> start(ReceiveWindow& w, ChunkSlot& s, bool must) override {
        if (!must) {
            struct pollfd pf = {ch_.fd(), POLLIN, 0};
            if (!ch_.buffered() && ::poll(&pf, 1, 0) <= 0) return false;
        }
        auto g = ch_.next();
        if (!g) return g.status();
        if (g->kind != FetchChannel::Kind::data || g->data_len != 0)
            return Status(DYAD_RC_BADRPC, "unexpected frame in an OFI fetch", EPROTO);
        const auto d = proto::OfiChunk::parse(g->meta);
        if (d.seq != s.seq || d.len != s.len)
            return Status(DYAD_RC_BADFETCH, "out-of-order OFI descriptor", EPROTO);
        w.progressed();
        ReadOp& op = (*ops_)[s.index];
        op = ReadOp();
        op.w = &w;
        op.slot = &s;
        if (place_) {
            Status st = map(op, s);
            if (!st) return st;
        }
        Status st = post_read(op, d.addr, d.key, Deadline::after(w.shape().idle_s));
        if (!st) {
            release(op);
            return st;
        }
        return true;
    }

    // Any completion is progress (the oldest read may not be the one).
    Status wait(ReceiveWindow& w) override {
        Status st = wait_completion(w.idle());
        if (st) w.progressed();
        return st;
    }

    Status deliver(ChunkSlot& s, Sink& sink) override {
        ReadOp& op = (*ops_)[s.index];
        c_.ep().release(op.mr);
        Status st = op.mapped ? sink.placed(s.buf, s.got) : sink.write(s.buf, s.got);
        release(op);
        return st;
    }
    Status handed_over(const ReceiveWindow&, const ChunkSlot& s) override { return ch_.ack(s.seq); }
    Result<nlohmann::json> end(ReceiveWindow&) override { return ch_.end(kWhat); }

    void cancel(ChunkSlot& s) override {
        ReadOp& op = (*ops_)[s.index];
        if (op.posted) fi_cancel(&c_.ep().ep()->fid, &op.ctx);
    }
    void settle() override { (void)drain(50); }  // already failing: only completions matter
    int cancel_rounds() const override { return INT_MAX; }
    // Reads that could not be cancelled may still land: their mappings and
    // registrations stay, and the endpoint is retired.
    void cancelled(ReceiveWindow& w, bool clean) override {
        if (!clean) {
            DYAD_WARN(kSub, "OFI reads could not be cancelled; this endpoint is retired");
            uncancelled_ = true;
            c_.poison();
            return;
        }
        for (auto& s : w.slots()) release((*ops_)[s.index]);
    }

  private:
    // The chunk's run of the destination file, mapped and registered.
    Status map(ReadOp& op, ChunkSlot& s) {
        auto m = place_.map(s.offset, s.len);
        if (!m) return m.status();
        op.mapped = s.buf = m.value();
        auto mr = c_.ep().register_memory(s.buf, s.len, FI_READ);
        if (!mr) {
            release(op);
            return mr.status();
        }
        op.mr = mr.value();
        return Status::ok();
    }
    void release(ReadOp& op) {
        c_.ep().release(op.mr);
        if (op.mapped && op.slot) Placement::unmap(op.mapped, op.slot->len);
        op.mapped = nullptr;
    }

    // The service's connection hung up: it was killed or stopped, and its
    // memory went with it. Reads from it can then only fail or, with shm,
    // wait until the deadline (its command queue is never drained) or spin
    // on the lock of its region if it died holding it (libfabric 1.17's
    // shm takes the peer region's spin lock in fi_read). So no read is
    // posted, and no wait goes on, once it has: the error is the channel's
    // own (an error frame the service sent last, or its hang-up).
    Status service_gone() {
        if (ch_.buffered()) return Status::ok();
        struct pollfd pf = {ch_.fd(), POLLRDHUP, 0};
        if (::poll(&pf, 1, 0) <= 0 || !(pf.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            return Status::ok();
        auto m = ch_.next();
        if (!m) return m.status();
        return Status(DYAD_RC_CONNFAIL, "the service closed the connection during an OFI fetch",
                      ECONNRESET);
    }

    Status post_read(ReadOp& op, uint64_t raddr, uint64_t key, Deadline d) {
        const ChunkSlot& s = *op.slot;
        for (;;) {
            Status up = service_gone();
            if (!up) return up;
            ssize_t ret = fi_read(c_.ep().ep(), s.buf, s.len, op.mr.mr ? op.mr.desc : desc_, peer_,
                                  raddr, key, &op.ctx);
            if (ret == 0) {
                op.posted = true;
                return Status::ok();
            }
            if (ret != -FI_EAGAIN) return ofi::fi_error(DYAD_RC_BADFETCH, "fi_read", ret);
            // Queue full: completions (and progress) make room.
            Status st = drain(0);
            if (!st) return st;
            if (d.expired()) return Status(DYAD_RC_TIMEOUT, "fi_read queue stayed full", ETIMEDOUT);
        }
    }

    static void completed(ReadOp& op, int err) {
        op.w->complete(
            *op.slot,
            err ? Status(DYAD_RC_BADFETCH,
                         std::string("fi_read from the service failed: ") + fi_strerror(err), EIO)
                : Status::ok(),
            op.slot->len);
    }

    // Applies this receive's completions (read from the CQ by whichever
    // thread polls it), without waiting (timeout_ms 0) or waiting for some.
    Status drain(int timeout_ms) {
        Status st = c_.poll(inbox_, timeout_ms, got_);
        for (const auto& d : got_) {
            completed(*static_cast<ReadOp*>(d.op), d.err);
            ++completed_;
        }
        got_.clear();
        return st;
    }

    Status wait_completion(const Deadline& d) {
        size_t before = completed_;
        while (completed_ == before) {
            if (d.expired())
                return Status(DYAD_RC_TIMEOUT, "no OFI read completed in time", ETIMEDOUT);
            Status up = service_gone();
            if (!up) return up;
            // Providers without a wait object are read in a loop bounded by
            // the deadline (none of the protocols here needs it). Sleeps are
            // short enough to notice the service's hang-up at once.
            Status st = drain(c_.ep().can_wait() ? std::clamp(d.poll_ms(), 1, 100) : 0);
            if (!st) return st;
            if (!c_.ep().can_wait()) std::this_thread::yield();
        }
        return Status::ok();
    }

    OfiConsumer& c_;
    FetchChannel& ch_;
    fi_addr_t peer_;
    Placement& place_;
    void* desc_;                // the read window's descriptor
    bool& uncancelled_;         // reads were left out: the window and contexts stay
    std::vector<ReadOp>* ops_;  // by slot
    OfiConsumer::Inbox inbox_;
    std::vector<OfiConsumer::Done> got_;
    size_t completed_ = 0;  // completions seen, successful or not
};

class OfiReceiver : public Receiver {
  public:
    explicit OfiReceiver(OfiOptions o)
        : opts_(std::move(o)), attrs_(ofi_attributes(opts_, false)) {}
    ~OfiReceiver() override { ReceiveTokens::get().give(); }
    OfiReceiver(const OfiReceiver&) = delete;
    OfiReceiver& operator=(const OfiReceiver&) = delete;
    const Attributes& attributes() const override { return attrs_; }
    nlohmann::json describe() override { return proto::OfiRequest{opts_.proto}.build(); }

    Result<nlohmann::json> receive(FetchChannel& ch, Sink& sink) override {
        auto f = ch.first(kWhat);
        if (!f) return f.status();
        auto start = proto::OfiStart::parse(f->meta);
        if (!start) return start.status();
        if (f->data_len != 0)
            return Status(DYAD_RC_BADRPC,
                          "bad first answer in an OFI fetch: " +
                              f->meta.dump(-1, ' ', false, kBadUtf8Replaced),
                          EPROTO);
        if (start->chunk != kOfiChunk)
            return Status(DYAD_RC_BADRPC, "OFI chunk size differs between service and consumer",
                          EPROTO);
        auto addr = base64_decode(start->address);
        if (!addr || addr->empty())
            return Status(DYAD_RC_BADRPC, "OFI fetch without the service's address", EPROTO);
        std::string service(addr->begin(), addr->end());
        // The endpoint that reaches the service's address.
        auto c = OfiConsumer::instance(opts_.proto, source_towards(service));
        if (!c) return c.status();
        OfiConsumer* cons = c.value();
        auto peer = cons->peer(service);
        if (!peer) return peer.status();
        auto win = cons->take_window(Deadline::after(ch.idle_s()));
        if (!win) {
            cons->give_peer(service);
            return win.status();
        }
        bool uncancelled = false;
        auto r = receive_with(ch, sink, *start, *cons, peer.value(), win.value(), uncancelled);
        cons->give_peer(service);
        // A window that reads may still land in is never handed out again.
        if (!uncancelled) cons->give_window(win.value());
        return r;
    }

  private:
    Result<nlohmann::json> receive_with(FetchChannel& ch, Sink& sink, const proto::OfiStart& start,
                                        OfiConsumer& c, fi_addr_t peer, int window,
                                        bool& uncancelled) {
        Placement place;
        if (sink.can_place()) {
            auto ok = place.open(opts_.placement, sink.fd(), start.start.size);
            if (!ok) return ok.status();
        }
        WindowShape shape;
        shape.size = start.start.size;
        shape.chunk = kOfiChunk;
        shape.slots = shape.depth = static_cast<size_t>(kDepth);
        shape.memory = place ? nullptr : c.window(window);
        shape.idle_s = ch.idle_s();
        shape.what = kWhat;
        ReceiveWindow w(shape);
        ReadMover reads(c, ch, peer, place, c.window_desc(window), uncancelled);
        auto r = w.run(reads, sink);
        // Nothing was placed: the file goes back to empty.
        if (!r && place && w.received() == 0) place.undo();
        return r;
    }

    OfiOptions opts_;
    Attributes attrs_;
};

}  // namespace

Result<std::unique_ptr<Receiver>> make_receiver(const OfiOptions& o) {
    auto p = validated(o.proto);
    if (!p) return p.status();
    // A receive takes its token before its fetch is requested
    // (ReceiveTokens), waiting at most the transfer deadline.
    auto t = settings::seconds("DYAD_TRANSFER_TIMEOUT");
    double wait_s = t && t.value() ? *t.value() : 60.0;
    Status st = ReceiveTokens::get().take(Deadline::after(wait_s));
    if (!st) return st;
    return std::unique_ptr<Receiver>(new OfiReceiver(o));
}

// Loads libfabric and its providers (the first fi_getinfo of the process)
// before the first fetch; endpoints are opened per service address family.
Status warmup(const OfiOptions& o) {
    return validated(o.proto).status();
}

}  // namespace dyad::dtl::ofi
