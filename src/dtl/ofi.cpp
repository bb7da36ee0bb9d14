// SPDX-License-Identifier: Apache-2.0
// libfabric transport (DYAD_DTL_MODE=MARGO, alias OFI): the pull model of
// DYAD's Margo backend, built directly on libfabric.
//
// Service: for each chunk, file bytes are read straight into a buffer of a
// pool registered once per protocol (FI_REMOTE_READ); the consumer is sent a
// descriptor {seq, addr, key, len} on the fetch RPC; it pulls with fi_read and
// acknowledges with an UPDATE frame {ack: seq}; the buffer goes back to the
// pool. At most kDepth chunks per transfer and kPoolBuffers per protocol are
// out, so the service's memory is bounded whatever the files and consumers.
// A progress thread per manual-progress provider waits in fi_cq_sread.
//
// Consumer: one endpoint per process and protocol, service addresses in an AV
// with LRU eviction. Reads land in a registered window of kDepth chunk slots
// written out with write(2), or, with DYAD_OFI_PLACEMENT=1, in the
// destination file itself (blocks reserved with fallocate, one mapping per
// chunk, hashed in place: class Placement; slower here). Waits sleep on the CQ's fd
// (fi_trywait + poll) within the inactivity deadline, and on the RPC socket
// for frames.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "chunked.hpp"
#include "common/base64.hpp"
#include "dtl/peer_address.hpp"
#include "common/config.hpp"
#include "common/rate_limit.hpp"
#include "common/settings.hpp"
#include "common/log.hpp"
#include "dtl.hpp"
#include "ofi.hpp"
#include "plugin.h"
#include "common/json_text.hpp"

namespace dyad::dtl {
namespace {

constexpr const char* kSub = "ofi";
// 1 MiB: the consumer's reads go through a registered window of kDepth
// chunks, which every process touches for the first time (docs/design.md,
// MARGO, "Where the reads land").
constexpr size_t kOfiChunk = 1u << 20;
constexpr int kDepth = 4;            // descriptors out per transfer
constexpr size_t kPoolBuffers = 16;  // registered chunk buffers per protocol (service)
constexpr size_t kAvCacheSize = 64;  // service addresses kept per consumer endpoint

// `probe` lists the protocols that work here: libfabric's first fi_getinfo
// in a process loads every provider (about 0.3 s here), so only `dyad
// config` pays for it, not every dyadd start.
Attributes ofi_attributes(bool probe) {
    Attributes a;
    a.name = "MARGO";
    a.latency_us = 400;
    a.bandwidth_gbps = 0.43;
    a.rma_native = true;  // the consumer reads the service's memory
    a.max_message = kOfiChunk;
    std::string list;
    if (probe)
        for (const auto& p : ofi::available_protocols()) list += (list.empty() ? "" : " ") + p;
    std::string proto = ofi::configured_protocol();
    std::string prov;
    for (const auto& p : ofi::protocols())
        if (proto == p.name) prov = std::string(" (") + p.provider + ")";
    a.info = "libfabric " + ofi::library_version() + ", DYAD_MARGO_PROTO=" + proto + prov;
    if (probe) a.info += ", available: " + (list.empty() ? std::string("none") : list);
    return a;
}

// ---------------- consumer side ----------------

struct ReadOp {
    fi_context2 ctx;  // first: libfabric hands it back in completions
    size_t slot = 0;
    char* dst = nullptr;  // where the bytes land: a window slot or the mapped file
    ofi::Region mr;       // the mapped file's run, registered while the read is out
    uint64_t seq = 0;
    size_t len = 0;
    bool posted = false;
    bool done = false;
    int err = 0;
};

class OfiConsumer {
  public:
    static Result<OfiConsumer*> instance(const std::string& proto_name) {
        static std::mutex mu;
        // Process-lifetime instances, reachable to the end (never destroyed:
        // threads may still use them while the process exits).
        static auto& insts = *new std::map<std::string, OfiConsumer*>();
        static pid_t owner = 0;
        std::lock_guard<std::mutex> lk(mu);
        if (owner != ::getpid()) {  // a forked child builds its own (not fork-safe)
            insts.clear();
            owner = ::getpid();
        }
        auto it = insts.find(proto_name);
        if (it != insts.end() && !it->second->poisoned_) return it->second;
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
        insts[proto_name] = c;
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
    // False (and no error) unless DYAD_OFI_PLACEMENT=1, or where the file
    // system cannot reserve blocks: the reads then go through the window.
    Result<bool> open(int fd, uint64_t size) {
        if (fd < 0 || size == 0) return false;
        auto on = settings::flag("DYAD_OFI_PLACEMENT");
        if (!on) return on.status();
        if (!on.value()) return false;
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

class OfiReceiver : public Receiver {
  public:
    OfiReceiver(OfiConsumer* c, std::string proto)
        : c_(c), proto_(std::move(proto)), attrs_(ofi_attributes(false)) {}
    const Attributes& attributes() const override { return attrs_; }
    nlohmann::json describe() override { return {{"ofi_proto", proto_}}; }

    Result<nlohmann::json> receive(FetchChannel& ch, Sink& sink) override {
        std::lock_guard<std::mutex> lk(c_->mutex());
        const double idle_s = ch.idle_s();
        auto f = ch.first("OFI");
        if (!f) return f.status();
        auto size_field = meta_u64(f->meta, "size");
        if (!size_field || f->data_len != 0)
            return Status(DYAD_RC_BADRPC,
                          "bad first answer in an OFI fetch: " +
                              f->meta.dump(-1, ' ', false, kBadUtf8Replaced),
                          EPROTO);
        uint64_t size = *size_field;
        if (meta_u64(f->meta, "chunk") != kOfiChunk)
            return Status(DYAD_RC_BADRPC, "OFI chunk size differs between service and consumer",
                          EPROTO);
        auto addr = base64_decode(meta_str(f->meta, "ofi_addr").value_or(""));
        if (!addr || addr->empty())
            return Status(DYAD_RC_BADRPC, "OFI fetch without the service's address", EPROTO);
        auto peer = c_->peer(std::string(addr->begin(), addr->end()));
        if (!peer) return peer.status();

        Placement place;
        if (sink.can_place()) {
            auto ok = place.open(sink.fd(), size);
            if (!ok) return ok.status();
        }
        std::deque<ReadOp> ops;  // in file order
        std::vector<bool> busy(kDepth, false);
        uint64_t received = 0, announced = 0;
        Status err;
        auto fail = [&](Status st) {
            // Reads that could not be cancelled may still land: their
            // mappings and registrations stay.
            if (cancel_all(ops))
                for (auto& op : ops) {
                    c_->ep().release(op.mr);
                    if (place && op.dst) Placement::unmap(op.dst, op.len);
                }
            if (place && received == 0) place.undo();
            return st;
        };
        while (received < size) {
            // 1. Take descriptors: block for one when nothing is in flight,
            //    otherwise only those already here.
            while (ops.size() < static_cast<size_t>(kDepth) && announced < size) {
                if (!ops.empty()) {
                    struct pollfd pf = {ch.fd(), POLLIN, 0};
                    if (!ch.buffered() && ::poll(&pf, 1, 0) <= 0) break;
                }
                auto g = ch.next();
                if (!g) return fail(g.status());
                if (g->kind != FetchChannel::Kind::data || g->data_len != 0)
                    return fail(Status(DYAD_RC_BADRPC, "unexpected frame in an OFI fetch", EPROTO));
                const nlohmann::json& d = g->meta;
                uint64_t seq = meta_u64(d, "seq").value_or(~0ull);
                uint64_t len = meta_u64(d, "len").value_or(0);
                uint64_t raddr = meta_u64(d, "addr").value_or(0);
                uint64_t key = meta_u64(d, "key").value_or(0);
                uint64_t expect = std::min<uint64_t>(kOfiChunk, size - announced);
                if (seq != announced / kOfiChunk || len != expect)
                    return fail(Status(DYAD_RC_BADFETCH, "out-of-order OFI descriptor", EPROTO));
                size_t slot = 0;
                while (busy[slot]) ++slot;
                busy[slot] = true;
                ops.emplace_back();
                ReadOp& op = ops.back();
                op.slot = slot;
                op.seq = seq;
                op.len = len;
                if (!place) op.dst = c_->slot(slot);
                if (place) {
                    auto m = place.map(announced, len);
                    if (!m) return fail(m.status());
                    op.dst = m.value();
                    auto mr = c_->ep().register_memory(op.dst, len, FI_READ);
                    if (!mr) return fail(mr.status());
                    op.mr = mr.value();
                }
                announced += len;
                Status st = post_read(ch, op, peer.value(), raddr, key, Deadline::after(idle_s));
                if (!st) return fail(st);
            }
            // 2. Wait for the oldest read; hand finished ones over in order.
            if (ops.empty()) continue;
            if (!ops.front().done) {
                Status st = wait_completion(ch, Deadline::after(idle_s));
                if (!st) return fail(st);
            }
            while (!ops.empty() && ops.front().done) {
                ReadOp& op = ops.front();
                if (op.err)
                    return fail(Status(
                        DYAD_RC_BADFETCH,
                        std::string("fi_read from the service failed: ") + fi_strerror(op.err),
                        EIO));
                c_->ep().release(op.mr);
                Status w = place ? sink.placed(op.dst, op.len) : sink.write(op.dst, op.len);
                if (place) Placement::unmap(op.dst, op.len);
                op.dst = nullptr;
                if (!w) return fail(w);
                received += op.len;
                busy[op.slot] = false;
                Status u = ch.ack(op.seq);
                if (!u) return fail(u);
                ops.pop_front();
            }
        }
        return ch.end("OFI");
    }

  private:
    // The service's connection hung up: it was killed or stopped, and its
    // memory went with it. Reads from it can then only fail or, with shm,
    // wait until the deadline (its command queue is never drained) or spin
    // on the lock of its region if it died holding it (libfabric 1.17's
    // shm takes the peer region's spin lock in fi_read). So no read is
    // posted, and no wait goes on, once it has: the error is the channel's
    // own (an error frame the service sent last, or its hang-up).
    static Status service_gone(FetchChannel& ch) {
        if (ch.buffered()) return Status::ok();
        struct pollfd pf = {ch.fd(), POLLRDHUP, 0};
        if (::poll(&pf, 1, 0) <= 0 || !(pf.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            return Status::ok();
        auto m = ch.next();
        if (!m) return m.status();
        return Status(DYAD_RC_CONNFAIL, "the service closed the connection during an OFI fetch",
                      ECONNRESET);
    }

    Status post_read(FetchChannel& ch, ReadOp& op, fi_addr_t peer, uint64_t raddr, uint64_t key,
                     Deadline d) {
        for (;;) {
            Status up = service_gone(ch);
            if (!up) return up;
            ssize_t ret = fi_read(c_->ep().ep(), op.dst, op.len, op.mr.mr ? op.mr.desc : c_->desc(),
                                  peer, raddr, key, &op.ctx);
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

    // Reads completions without waiting (timeout_ms 0) or waits for one.
    Status drain(int timeout_ms) {
        fi_cq_entry e[8];
        ssize_t n;
        // Read (which also drives progress); when there is nothing, sleep
        // on the CQ's fd rather than in fi_cq_sread, which for tcp;ofi_rxm
        // polls the provider in a loop and keeps a core busy.
        n = fi_cq_read(c_->ep().cq(), e, 8);
        if (n == -FI_EAGAIN && timeout_ms > 0 && c_->ep().can_wait()) {
            c_->ep().sleep(timeout_ms);
            n = fi_cq_read(c_->ep().cq(), e, 8);
        }
        if (n == -FI_EAGAIN) return Status::ok();
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry ee;
            std::memset(&ee, 0, sizeof ee);
            if (fi_cq_readerr(c_->ep().cq(), &ee, 0) == 1 && ee.op_context) {
                auto* op = static_cast<ReadOp*>(ee.op_context);
                op->done = true;
                op->err = ee.err ? ee.err : FI_EIO;
                ++completed_;
            }
            return Status::ok();
        }
        if (n < 0) return ofi::fi_error(DYAD_RC_BADFETCH, "fi_cq_read", n);
        for (ssize_t i = 0; i < n; ++i) static_cast<ReadOp*>(e[i].op_context)->done = true;
        completed_ += static_cast<size_t>(n);
        return Status::ok();
    }

    Status wait_completion(FetchChannel& ch, Deadline d) {
        size_t before = completed_;
        while (completed_ == before) {
            if (d.expired())
                return Status(DYAD_RC_TIMEOUT, "no OFI read completed in time", ETIMEDOUT);
            Status up = service_gone(ch);
            if (!up) return up;
            // Providers without a wait object are read in a loop bounded by
            // the deadline (none of the protocols here needs it). Sleeps are
            // short enough to notice the service's hang-up at once.
            Status st = drain(c_->ep().can_wait() ? std::clamp(d.poll_ms(), 1, 100) : 0);
            if (!st) return st;
            if (!c_->ep().can_wait()) std::this_thread::yield();
        }
        return Status::ok();
    }

    // False when some reads could not be cancelled (the endpoint is retired).
    bool cancel_all(std::deque<ReadOp>& ops) {
        bool pending = false;
        for (auto& op : ops)
            if (op.posted && !op.done) {
                fi_cancel(&c_->ep().ep()->fid, &op.ctx);
                pending = true;
            }
        Deadline d = Deadline::after(2.0);
        while (pending && !d.expired()) {
            (void)drain(50);  // already failing: only completions matter here
            pending = false;
            for (auto& op : ops) pending |= op.posted && !op.done;
        }
        if (pending) {
            DYAD_WARN(kSub, "OFI reads could not be cancelled; this endpoint is retired");
            c_->poison();
            return false;
        }
        return true;
    }

    OfiConsumer* c_;
    std::string proto_;
    Attributes attrs_;
    size_t completed_ = 0;  // completions seen, successful or not
};

}  // namespace
}  // namespace dyad::dtl

namespace dyad::dtl {
namespace {

// ---------------- service side ----------------

class OfiTransfer;

// One protocol served by this dyadd: its endpoint, the registered buffer
// pool (grown on demand up to kPoolBuffers, registered once) and the
// progress thread for providers whose data progress is manual.
class ServedProtocol {
  public:
    static Result<std::shared_ptr<ServedProtocol>> open(const ofi::Protocol& p,
                                                        const std::string& node, bool strict,
                                                        asio::io_context& io) {
        auto ep = ofi::Endpoint::open(p, node.empty() ? nullptr : node.c_str(), strict);
        if (!ep) return ep.status();
        auto sp = std::shared_ptr<ServedProtocol>(new ServedProtocol(std::move(ep.value()), io));
        auto no_thread = settings::flag("DYAD_OFI_NO_PROGRESS_THREAD");
        if (!no_thread) return no_thread.status();
        if (sp->ep_->manual_progress() && !no_thread.value())
            sp->progress_ = std::thread([raw = sp.get()] { raw->run(); });
        DYAD_INFO(kSub, "serving %s (provider %s): %s progress, CQ %s", p.name, p.provider,
                  sp->ep_->manual_progress() ? "manual" : "automatic",
                  sp->ep_->can_wait() ? "with a wait fd" : "without a wait object");
        return sp;
    }
    ~ServedProtocol() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        busy_cv_.notify_all();
        if (progress_.joinable()) progress_.join();
        for (auto& r : regions_) ep_->release(r);
        if (budget_) budget_->unreserve(reserved_);
    }

    const std::string& address() const { return ep_->address(); }
    const ofi::Protocol& protocol() const { return ep_->protocol(); }

    // A free registered buffer (index), -1 when none (then `waiter` is
    // resumed on the loop when one frees), or an error.
    // The pool grows within the service's memory budget (its first buffer
    // always: a protocol with no buffer could never serve).
    // A peer (FetchJob::peer) holds at most its share (PoolShares); beyond it
    // it waits, and a release wakes the first waiter under its share.
    Result<int> acquire(std::weak_ptr<OfiTransfer> waiter, MemoryBudget* budget, uint64_t peer);
    void release(int idx, uint64_t peer);
    uint64_t progress_interrupted() const { return interrupted_.load(); }
    uint64_t progress_failures() const { return failures_.load(); }
    uint64_t peer_waits() const {
        std::lock_guard<std::mutex> lk(mu_);
        return shares_.waits;
    }
    char* buffer(int idx) { return bufs_[static_cast<size_t>(idx)].get(); }
    const ofi::Region& region(int idx) const { return regions_[static_cast<size_t>(idx)]; }
    size_t pool_size() const {
        std::lock_guard<std::mutex> lk(mu_);
        return bufs_.size();
    }

  private:
    ServedProtocol(std::unique_ptr<ofi::Endpoint> ep, asio::io_context& io)
        : ep_(std::move(ep)), io_(io) {}
    void wait_for_buffer(std::weak_ptr<OfiTransfer> t, uint64_t peer);  // under mu_

    // Drives the provider so consumers' reads of our memory complete. The
    // service posts no operations itself, so completions are not expected;
    // the wait (with a timeout, to notice shutdown) is what makes progress.
    // A CQ without a wait object (shm) is read in a yielding loop, but only
    // while buffers are out to consumers; otherwise the thread sleeps.
    void run() {
        fi_cq_entry e[8];
        while (!stop_) {
            if (!ep_->can_wait()) {
                std::unique_lock<std::mutex> lk(mu_);
                busy_cv_.wait(lk, [this] { return stop_ || out_ > 0; });
                if (stop_) break;
            }
            ssize_t n = ep_->can_wait() ? fi_cq_sread(ep_->cq(), e, 8, nullptr, 200)
                                        : fi_cq_read(ep_->cq(), e, 8);
            if (n == -FI_EAVAIL) {
                fi_cq_err_entry ee;
                std::memset(&ee, 0, sizeof ee);
                fi_cq_readerr(ep_->cq(), &ee, 0);
                static log::RateLimit limit(kSub, "completion errors");  // peers cause them
                if (limit.allow()) DYAD_WARN(kSub, "completion error: %s", fi_strerror(ee.err));
            } else if (n == -FI_EINTR) {
                // The wait was interrupted: dyadd stopped and continued
                // (SIGSTOP/SIGCONT, a batch system's suspend and resume, a
                // debugger attaching). Wait again: without this thread no
                // consumer's read would ever complete.
                ++interrupted_;
            } else if (n < 0 && n != -FI_EAGAIN) {
                // Not expected; the thread keeps going (once a second at
                // most), as every consumer of this protocol depends on it.
                uint64_t f = ++failures_;
                if (f == 1 || f % 100 == 0)
                    DYAD_ERROR(kSub, "fi_cq_sread: %s (%llu times); retrying",
                               fi_strerror(static_cast<int>(-n)),
                               static_cast<unsigned long long>(f));
                std::unique_lock<std::mutex> lk(mu_);
                busy_cv_.wait_for(lk, std::chrono::seconds(1), [this] { return stop_.load(); });
            } else if (!ep_->can_wait()) {
                std::this_thread::yield();
            }
        }
    }

    std::unique_ptr<ofi::Endpoint> ep_;
    asio::io_context& io_;
    mutable std::mutex mu_;
    std::vector<std::unique_ptr<char[]>> bufs_;
    std::vector<ofi::Region> regions_;
    std::vector<int> free_;
    struct Waiter {
        std::weak_ptr<OfiTransfer> t;
        uint64_t peer;
    };
    std::deque<Waiter> waiters_;
    PoolShares shares_;               // buffers each peer holds, against its share
    MemoryBudget* budget_ = nullptr;  // the service's (loop thread); its bytes we hold
    size_t reserved_ = 0;
    std::atomic<bool> stop_{false};  // set under mu_ (for busy_cv_)
    size_t out_ = 0;                 // buffers not in the free list (under mu_)
    // Written by the progress thread, read by `dyad service status`.
    std::atomic<uint64_t> interrupted_{0};  // waits interrupted (EINTR), then resumed
    std::atomic<uint64_t> failures_{0};     // waits that failed, then retried
    std::condition_variable busy_cv_;
    std::thread progress_;
};

// Chunks are read straight into pool buffers (the direct mode of the chunk
// pipeline); each is announced by a descriptor and returned on the
// consumer's acknowledgement.
class OfiTransfer : public ChunkedTransfer {
  public:
    OfiTransfer(std::shared_ptr<FetchJob> job, SendDone done, std::shared_ptr<ServedProtocol> sp)
        : ChunkedTransfer(std::move(job), std::move(done), kOfiChunk, kDepth), sp_(std::move(sp)) {}
    ~OfiTransfer() override {
        for (int idx : reading_) sp_->release(idx, job().peer);
        pending_.drain([this](Pending& p) { sp_->release(p.idx, job().peer); });
    }

    void start_ofi() {
        std::weak_ptr<ChunkedTransfer> weak = shared_from_this();
        job().ch->on_update([weak](const nlohmann::json& m) {
            auto self = std::static_pointer_cast<OfiTransfer>(weak.lock());
            if (self) self->on_ack(m);
        });
        start();
    }
    void wake() { resume(); }

  protected:
    bool inline_first_chunk() const override { return false; }
    nlohmann::json first_meta() const override {
        return {{"size", job().size},
                {"transport", "MARGO"},
                {"chunk", kOfiChunk},
                {"proto", sp_->protocol().name},
                {"ofi_addr", base64_encode(sp_->address())}};
    }
    bool direct() const override { return true; }
    char* direct_target(size_t) override {
        if (over_ || reading_.size() + pending_.outstanding() >= static_cast<size_t>(kDepth))
            return nullptr;  // resumed by an acknowledgement
        auto idx = sp_->acquire(std::static_pointer_cast<OfiTransfer>(shared_from_this()),
                                job().budget, job().peer);
        if (!idx) {
            auto self = std::static_pointer_cast<OfiTransfer>(shared_from_this());
            asio::post(job().ch->io(), [self, st = idx.status()] { self->abort(st); });
            return nullptr;
        }
        if (idx.value() < 0) return nullptr;  // resumed when a buffer frees
        reading_.push_back(idx.value());
        return sp_->buffer(idx.value());
    }
    void write_chunk(const char*, size_t n, nlohmann::json,
                     std::function<void(bool)> done) override {
        int idx = reading_.front();
        reading_.pop_front();
        uint64_t seq = pending_.push(Pending{idx, std::move(done)});
        const auto& r = sp_->region(idx);
        job().ch->send({{"seq", seq}, {"addr", r.base}, {"key", r.key}, {"len", n}});
    }
    void on_finish() override {
        over_ = true;
        // Announced buffers go back (the consumer has failed or is gone);
        // a buffer still being read from the file goes back in the destructor.
        pending_.drain([this](Pending& p) { sp_->release(p.idx, job().peer); });
    }

  private:
    struct Pending {
        int idx;
        std::function<void(bool)> done;
    };
    void on_ack(const nlohmann::json& m) {
        auto p = pending_.ack(m);
        if (!p) return;
        sp_->release(p->idx, job().peer);
        p->done(true);
    }

    std::shared_ptr<ServedProtocol> sp_;
    std::deque<int> reading_;  // buffers being filled from the file, in order
    AckWindow<Pending> pending_{static_cast<size_t>(kDepth)};  // announced, not yet read
    bool over_ = false;
};

Result<int> ServedProtocol::acquire(std::weak_ptr<OfiTransfer> waiter, MemoryBudget* budget,
                                    uint64_t peer) {
    std::unique_lock<std::mutex> lk(mu_);
    shares_.set_share(budget, kPoolBuffers);
    if (shares_.full(peer)) {
        ++shares_.waits;
        wait_for_buffer(std::move(waiter), peer);
        return -1;
    }
    if (!free_.empty()) {
        int idx = free_.back();
        free_.pop_back();
        if (out_++ == 0) busy_cv_.notify_all();
        shares_.take(peer);
        return idx;
    }
    bool may_grow = bufs_.size() < kPoolBuffers;
    if (may_grow && budget) {
        budget_ = budget;
        if (!budget->try_reserve(kOfiChunk)) {
            may_grow = bufs_.empty();
            if (may_grow) budget->force_reserve(kOfiChunk);
        }
        if (may_grow) reserved_ += kOfiChunk;
    }
    if (may_grow) {
        std::unique_ptr<char[]> b(new char[kOfiChunk]);
        auto r = ep_->register_memory(b.get(), kOfiChunk, FI_REMOTE_READ);
        if (!r) {
            if (budget) {
                budget->unreserve(kOfiChunk);
                reserved_ -= kOfiChunk;
            }
            return r.status();
        }
        bufs_.push_back(std::move(b));
        regions_.push_back(r.value());
        if (out_++ == 0) busy_cv_.notify_all();
        shares_.take(peer);
        return static_cast<int>(bufs_.size() - 1);
    }
    wait_for_buffer(std::move(waiter), peer);
    return -1;
}

void ServedProtocol::wait_for_buffer(std::weak_ptr<OfiTransfer> t, uint64_t peer) {
    // Once per transfer: a transfer asks again on each of its events.
    for (const auto& w : waiters_)
        if (!w.t.owner_before(t) && !t.owner_before(w.t)) return;
    waiters_.push_back({std::move(t), peer});
}

void ServedProtocol::release(int idx, uint64_t peer) {
    std::vector<std::weak_ptr<OfiTransfer>> wake;
    {
        std::lock_guard<std::mutex> lk(mu_);
        free_.push_back(idx);
        --out_;
        shares_.give(peer);
        // Every waiter whose peer is under its share is woken, in order (gone
        // ones dropped); each tries again and those that lose wait again.
        // Waking only the first lost buffers: a woken transfer may no longer
        // want one (it is reading, at its depth, or done) and then never
        // takes it, while the next waiter sleeps with a free buffer beside
        // it until its consumer's deadline.
        for (auto w = waiters_.begin(); w != waiters_.end();) {
            if (w->t.expired()) {
                w = waiters_.erase(w);
            } else if (shares_.full(w->peer)) {
                ++w;
            } else {
                wake.push_back(std::move(w->t));
                w = waiters_.erase(w);
            }
        }
    }
    if (!wake.empty())
        asio::post(io_, [wake = std::move(wake)] {
            for (const auto& w : wake)
                if (auto t = w.lock()) t->wake();
        });
}

class OfiSender : public Sender {
  public:
    OfiSender(asio::io_context& io, ServiceBind bind)
        : io_(io), bind_(std::move(bind)), attrs_(ofi_attributes(false)) {}
    const Attributes& attributes() const override { return attrs_; }
    nlohmann::json stats() const override {
        nlohmann::json served = nlohmann::json::object();
        for (const auto& [k, sp] : *served_)
            served[k] = {{"provider", sp->protocol().provider},
                         {"pool_buffers", sp->pool_size()},
                         {"peer_waits", sp->peer_waits()},
                         {"progress_interrupted", sp->progress_interrupted()},
                         {"progress_failures", sp->progress_failures()}};
        return {{"protocols", served}, {"pool_limit_bytes", kPoolBuffers * kOfiChunk}};
    }

    void send(std::shared_ptr<FetchJob> job, SendDone done) override {
        auto it = job->transport_args.find("ofi_proto");
        if (it == job->transport_args.end() || !it->is_string()) {
            done(Status(DYAD_RC_BADUNPACK, "OFI fetch without ofi_proto", EINVAL), 0, "");
            return;
        }
        std::string name = it->get<std::string>();
        // The service's listen policy decides where the endpoint binds;
        // without one (a keyed service on a wildcard), the address the
        // consumer reached.
        const bool strict = !bind_.host.empty();
        std::string node = strict ? bind_.host : job->local_host;
        std::string key = name + "@" + node;
        auto found = served_->find(key);
        if (found != served_->end()) {
            std::make_shared<OfiTransfer>(std::move(job), std::move(done), found->second)
                ->start_ofi();
            return;
        }
        // Opening a protocol probes libfabric's providers (0.3 s for the
        // first one in a process): off the event loop, on the file pool.
        std::weak_ptr<Served> weak = served_;
        asio::io_context& io = io_;
        asio::thread_pool& pool = *job->file_pool;
        asio::post(pool, [weak, &io, name, key, node, strict, job = std::move(job),
                          done = std::move(done)]() mutable {
            Result<std::shared_ptr<ServedProtocol>> sp = Status::ok();
            auto p = ofi::validate_protocol(name);
            if (!p)
                sp = p.status();
            else
                sp = ServedProtocol::open(*p.value(), node, strict, io);
            asio::post(io, [weak, key, sp = std::move(sp), job = std::move(job),
                            done = std::move(done)]() mutable {
                auto served = weak.lock();
                if (!served) return;  // the service is shutting down
                if (!sp) {
                    done(sp.status(), 0, "");
                    return;
                }
                // Two first fetches may both have opened it: keep the first.
                auto ins = served->emplace(key, sp.value()).first->second;
                std::make_shared<OfiTransfer>(std::move(job), std::move(done), ins)->start_ofi();
            });
        });
    }

  private:
    using Served = std::map<std::string, std::shared_ptr<ServedProtocol>>;

    asio::io_context& io_;
    ServiceBind bind_;
    Attributes attrs_;
    std::shared_ptr<Served> served_ = std::make_shared<Served>();
};

}  // namespace

Backend ofi_backend() {
    return {"MARGO",
            {"OFI"},
            [] { return ofi_attributes(true); },
            []() -> Result<std::unique_ptr<Receiver>> {
                std::string proto = ofi::configured_protocol();
                auto c = OfiConsumer::instance(proto);
                if (!c) return c.status();
                return std::unique_ptr<Receiver>(new OfiReceiver(c.value(), proto));
            },
            [](asio::io_context& io, const ServiceBind& bind) -> Result<std::unique_ptr<Sender>> {
                return std::unique_ptr<Sender>(new OfiSender(io, bind));
            },
            []() -> Status { return OfiConsumer::instance(ofi::configured_protocol()).status(); }};
}

}  // namespace dyad::dtl

// The plugin's entry point (plugin.h; registry.cpp loads it with dlopen and
// checks the ABI version and build id before calling backend()).
namespace {
// The build id, after a marker that registry.cpp can find in the file when
// the plugin cannot be loaded at all (symbols of another DYAD missing).
constexpr char kBuildIdRecord[] = DYAD_DTL_BUILD_ID_MARKER DYAD_DTL_BUILD_ID;

void* make_ofi_backend() {
    static dyad::dtl::Backend* backend = new dyad::dtl::Backend(dyad::dtl::ofi_backend());
    return backend;
}
}  // namespace

extern "C" __attribute__((visibility("default"))) const dyad_dtl_plugin_t* dyad_dtl_plugin_v1() {
    static const dyad_dtl_plugin_t plugin = {
        DYAD_DTL_PLUGIN_ABI_VERSION,
        static_cast<uint32_t>(sizeof(dyad_dtl_plugin_t)),
        kBuildIdRecord + sizeof(DYAD_DTL_BUILD_ID_MARKER) - 1,
        "MARGO",
        make_ofi_backend,
    };
    return &plugin;
}
