// SPDX-License-Identifier: Apache-2.0
// The libfabric transport, consumer side (overview in ofi.cpp): one
// endpoint per process and protocol, service addresses in an AV with LRU
// eviction; reads into a registered window of kDepth chunk slots, or into
// the destination file itself (Placement), run by the consumer's chunk
// window (receive_window.hpp).
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
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
#include "dtl/peer_address.hpp"
#include "proto/transfer.hpp"
#include "ofi.hpp"
#include "ofi_transport.hpp"
#include "per_process.hpp"
#include "receive_window.hpp"

namespace dyad::dtl::ofi {
namespace {

class OfiConsumer {
  public:
    static Result<OfiConsumer*> instance(const std::string& proto_name) {
        // Process-lifetime instances, reachable to the end (never destroyed:
        // threads may still use them while the process exits).
        static auto& state = *new PerProcess<std::map<std::string, OfiConsumer*>>();
        auto insts = state.lock();
        auto it = insts->find(proto_name);
        if (it != insts->end() && !it->second->poisoned_) return it->second;
        // A poisoned instance (reads that could not be cancelled) is leaked:
        // the provider may still write into its window.
        auto proto = ofi::validate_protocol(proto_name);
        if (!proto) return proto.status();
        auto ep = ofi::Endpoint::open(*proto.value(), nullptr);
        if (!ep) return ep.status();
        auto* c = new OfiConsumer(std::move(ep.value()));
        // Mapped, not allocated: its pages are touched only by reads that
        // use it (files that cannot be written in place).
        void* w =
            ::mmap(nullptr, kWindow, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (w == MAP_FAILED) {
            delete c;
            return Status(DYAD_RC_SYSFAIL, "cannot map the OFI read window", errno);
        }
        c->window_ = static_cast<char*>(w);
        auto r = c->ep_->register_memory(c->window_, kWindow, FI_READ);
        if (!r) {
            delete c;
            return r.status();
        }
        c->region_ = r.value();
        (*insts)[proto_name] = c;
        if (std::strcmp(proto.value()->provider, "shm") == 0) unlink_at_exit(c->ep_->address());
        return c;
    }
    ~OfiConsumer() {
        for (auto& [k, v] : av_) fi_av_remove(ep_->av(), &v->second, 1, 0);
        ep_->release(region_);
        if (window_) ::munmap(window_, kWindow);
    }

    std::mutex& mutex() { return mu_; }
    ofi::Endpoint& ep() { return *ep_; }
    char* slot(size_t i) { return window_ + i * kOfiChunk; }
    void* desc() { return region_.desc; }
    void poison() { poisoned_ = true; }

    // The service's address in the AV (inserted once; LRU eviction).
    Result<fi_addr_t> peer(const std::string& addr) {
        auto it = av_.find(addr);
        if (it != av_.end()) {
            lru_.splice(lru_.begin(), lru_, it->second);
            return it->second->second;
        }
        // fi_av_insert reads an address of our format's length, whatever
        // the blob's: one of another length or family never gets there.
        Status fits = check_ofi_peer_address(addr, ep_->address(), ep_->sockaddr_format());
        if (!fits) return fits;
        fi_addr_t fa = FI_ADDR_UNSPEC;
        int n = fi_av_insert(ep_->av(), addr.data(), 1, &fa, 0, nullptr);
        if (n != 1) return ofi::fi_error(DYAD_RC_BADFETCH, "fi_av_insert of the service", n);
        lru_.emplace_front(addr, fa);
        av_[addr] = lru_.begin();
        while (lru_.size() > kAvCacheSize) {
            auto& old = lru_.back();
            fi_av_remove(ep_->av(), &old.second, 1, 0);
            av_.erase(old.first);
            lru_.pop_back();
        }
        return fa;
    }

  private:
    explicit OfiConsumer(std::unique_ptr<ofi::Endpoint> ep) : ep_(std::move(ep)) {}
    // libfabric's shm provider names its region in /dev/shm after the
    // endpoint (fi_getname) and unlinks it when the endpoint closes or on a
    // fatal signal, never at a plain exit; consumers' endpoints live to the
    // end of the process, so without this every consumer process left a
    // 16 MiB file in /dev/shm. Only the name goes at exit: threads and
    // peers that mapped the region keep it until they unmap it.
    static void unlink_at_exit(const std::string& address) {
        static std::mutex mu;
        static auto& names = *new std::vector<std::pair<pid_t, std::string>>();
        std::lock_guard<std::mutex> lk(mu);
        if (names.empty())
            std::atexit([] {
                std::lock_guard<std::mutex> l(mu);
                for (const auto& [pid, name] : names)
                    if (pid == ::getpid()) ::shm_unlink(name.c_str());  // not a fork's parent's
            });
        // "fi_shm://PID:N:N": the region's name is what follows the scheme.
        std::string name = address.substr(0, address.find('\0'));
        size_t scheme = name.find("://");
        if (scheme != std::string::npos) name.erase(0, scheme + 3);
        names.emplace_back(::getpid(), name);
    }
    std::unique_ptr<ofi::Endpoint> ep_;
    static constexpr size_t kWindow = kDepth * kOfiChunk;
    char* window_ = nullptr;
    ofi::Region region_;
    std::mutex mu_;
    bool poisoned_ = false;
    std::list<std::pair<std::string, fi_addr_t>> lru_;
    std::unordered_map<std::string, std::list<std::pair<std::string, fi_addr_t>>::iterator> av_;
};

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
    ReadMover(OfiConsumer& c, FetchChannel& ch, fi_addr_t peer, Placement& place)
        : c_(c), ch_(ch), peer_(peer), place_(place), ops_(static_cast<size_t>(kDepth)) {}

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
        ReadOp& op = ops_[s.index];
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
        ReadOp& op = ops_[s.index];
        c_.ep().release(op.mr);
        Status st = op.mapped ? sink.placed(s.buf, s.got) : sink.write(s.buf, s.got);
        release(op);
        return st;
    }
    Status handed_over(const ReceiveWindow&, const ChunkSlot& s) override { return ch_.ack(s.seq); }
    Result<nlohmann::json> end(ReceiveWindow&) override { return ch_.end(kWhat); }

    void cancel(ChunkSlot& s) override {
        ReadOp& op = ops_[s.index];
        if (op.posted) fi_cancel(&c_.ep().ep()->fid, &op.ctx);
    }
    void settle() override { (void)drain(50); }  // already failing: only completions matter
    int cancel_rounds() const override { return INT_MAX; }
    // Reads that could not be cancelled may still land: their mappings and
    // registrations stay, and the endpoint is retired.
    void cancelled(ReceiveWindow& w, bool clean) override {
        if (!clean) {
            DYAD_WARN(kSub, "OFI reads could not be cancelled; this endpoint is retired");
            c_.poison();
            return;
        }
        for (auto& s : w.slots()) release(ops_[s.index]);
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
            ssize_t ret = fi_read(c_.ep().ep(), s.buf, s.len, op.mr.mr ? op.mr.desc : c_.desc(),
                                  peer_, raddr, key, &op.ctx);
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

    // Reads completions without waiting (timeout_ms 0) or waits for one.
    Status drain(int timeout_ms) {
        fi_cq_entry e[8];
        // Read (which also drives progress); when there is nothing, sleep
        // on the CQ's fd rather than in fi_cq_sread, which for tcp;ofi_rxm
        // polls the provider in a loop and keeps a core busy.
        ssize_t n = fi_cq_read(c_.ep().cq(), e, 8);
        if (n == -FI_EAGAIN && timeout_ms > 0 && c_.ep().can_wait()) {
            c_.ep().sleep(timeout_ms);
            n = fi_cq_read(c_.ep().cq(), e, 8);
        }
        if (n == -FI_EAGAIN) return Status::ok();
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry ee;
            std::memset(&ee, 0, sizeof ee);
            if (fi_cq_readerr(c_.ep().cq(), &ee, 0) == 1 && ee.op_context) {
                completed(*static_cast<ReadOp*>(ee.op_context), ee.err ? ee.err : FI_EIO);
                ++completed_;
            }
            return Status::ok();
        }
        if (n < 0) return ofi::fi_error(DYAD_RC_BADFETCH, "fi_cq_read", n);
        for (ssize_t i = 0; i < n; ++i) completed(*static_cast<ReadOp*>(e[i].op_context), 0);
        completed_ += static_cast<size_t>(n);
        return Status::ok();
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
    std::vector<ReadOp> ops_;  // by slot
    size_t completed_ = 0;     // completions seen, successful or not
};

class OfiReceiver : public Receiver {
  public:
    OfiReceiver(OfiConsumer* c, OfiOptions o)
        : c_(c), opts_(std::move(o)), attrs_(ofi_attributes(opts_, false)) {}
    const Attributes& attributes() const override { return attrs_; }
    nlohmann::json describe() override { return proto::OfiRequest{opts_.proto}.build(); }

    Result<nlohmann::json> receive(FetchChannel& ch, Sink& sink) override {
        std::lock_guard<std::mutex> lk(c_->mutex());
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
        auto peer = c_->peer(std::string(addr->begin(), addr->end()));
        if (!peer) return peer.status();
        Placement place;
        if (sink.can_place()) {
            auto ok = place.open(opts_.placement, sink.fd(), start->start.size);
            if (!ok) return ok.status();
        }
        WindowShape shape;
        shape.size = start->start.size;
        shape.chunk = kOfiChunk;
        shape.slots = shape.depth = static_cast<size_t>(kDepth);
        shape.memory = place ? nullptr : c_->slot(0);
        shape.idle_s = ch.idle_s();
        shape.what = kWhat;
        ReceiveWindow w(shape);
        ReadMover reads(*c_, ch, peer.value(), place);
        auto r = w.run(reads, sink);
        // Nothing was placed: the file goes back to empty.
        if (!r && place && w.received() == 0) place.undo();
        return r;
    }

  private:
    OfiConsumer* c_;
    OfiOptions opts_;
    Attributes attrs_;
};

}  // namespace

Result<std::unique_ptr<Receiver>> make_receiver(const OfiOptions& o) {
    auto c = OfiConsumer::instance(o.proto);
    if (!c) return c.status();
    return std::unique_ptr<Receiver>(new OfiReceiver(c.value(), o));
}

Status warmup(const OfiOptions& o) {
    return OfiConsumer::instance(o.proto).status();
}

}  // namespace dyad::dtl::ofi
