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
#include "ofi.hpp"
#include "ofi_transport.hpp"
#include "per_process.hpp"
#include "receive_window.hpp"

namespace dyad::dtl::ofi {
namespace {

// The protocols validated in this process (fi_getinfo once each).
Result<const ofi::Protocol*> validated(const std::string& name) {
    static auto& state = *new PerProcess<std::map<std::string, const ofi::Protocol*>>();
    auto known = state.lock();
    auto it = known->find(name);
    if (it != known->end()) return it->second;
    auto p = ofi::validate_protocol(name);
    if (p) (*known)[name] = p.value();
    return p;
}

// At most kMaxWindows receives of a process run at once (each holds a read
// window of its endpoint); more wait for a token. A receive takes it before
// its fetch is requested, so that every transfer an owner starts for this
// process has a receive reading it: a request sent first would make the
// owner fill pool buffers for a receive still waiting here, and those
// buffers (the peer's share of the owner's pool) could be the ones the
// running receives wait for; they then waited until their deadline.
class ReceiveTokens {
  public:
    static ReceiveTokens& get() {
        static auto* t = new ReceiveTokens();
        return *t;
    }
    Status take(const Deadline& deadline) {
        std::unique_lock<std::mutex> lk(mu_);
        while (used_ >= kMaxWindows) {
            if (deadline.expired())
                return Status(DYAD_RC_TIMEOUT,
                              "all " + std::to_string(kMaxWindows) +
                                  " OFI receives of this process stayed busy until the transfer "
                                  "deadline (DYAD_TRANSFER_TIMEOUT): run fewer MARGO fetches at "
                                  "once per process (threads x consume window), or try again",
                              EAGAIN);
            cv_.wait_for(lk, std::chrono::milliseconds(std::clamp(deadline.poll_ms(), 1, 1000)));
        }
        ++used_;
        return Status::ok();
    }
    void give() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            --used_;
        }
        cv_.notify_one();
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    size_t used_ = 0;
};

// The source address (numeric host) a consumer uses to reach a service
// whose libfabric address is the IPv4 or IPv6 `peer`: the one the kernel's
// route to it gives (a UDP socket connected to it, nothing sent), so the
// endpoint has the service's address family and an interface that reaches
// it, whatever else the node has (dual-stack, bridges, IPoIB). Empty for
// other formats (shm's names) or when there is no route: the provider's
// own choice then.
std::string source_towards(const std::string& peer) {
    sockaddr_storage ss;
    std::memset(&ss, 0, sizeof ss);
    socklen_t len = 0;
    sa_family_t fam = 0;
    if (peer.size() >= sizeof fam) std::memcpy(&fam, peer.data(), sizeof fam);
    if (fam == AF_INET && peer.size() == sizeof(sockaddr_in))
        len = sizeof(sockaddr_in);
    else if (fam == AF_INET6 && peer.size() == sizeof(sockaddr_in6))
        len = sizeof(sockaddr_in6);
    else
        return "";
    std::memcpy(&ss, peer.data(), len);
    int fd = ::socket(fam, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return "";
    std::string out;
    sockaddr_storage src;
    socklen_t slen = sizeof src;
    char host[INET6_ADDRSTRLEN] = {};
    if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&src), &slen) == 0 &&
        ::getnameinfo(reinterpret_cast<sockaddr*>(&src), slen, host, sizeof host, nullptr, 0,
                      NI_NUMERICHOST) == 0)
        out = host;
    ::close(fd);
    // A link-local IPv6 source carries its scope ("fe80::1%eth0"); the
    // provider takes it as it is.
    return out;
}

class OfiConsumer {
  public:
    // One endpoint per protocol and source address (`source` empty: the
    // provider's choice, for addresses that are no IP socket address).
    static Result<OfiConsumer*> instance(const std::string& proto_name, const std::string& source) {
        // Process-lifetime instances, reachable to the end (never destroyed:
        // threads may still use them while the process exits).
        static auto& state = *new PerProcess<std::map<std::string, OfiConsumer*>>();
        auto insts = state.lock();
        const std::string key = proto_name + "@" + source;
        auto it = insts->find(key);
        if (it != insts->end() && !it->second->poisoned_) return it->second;
        // A poisoned instance (reads that could not be cancelled) is leaked:
        // the provider may still write into its windows.
        auto proto = validated(proto_name);
        if (!proto) return proto.status();
        auto ep = ofi::Endpoint::open(*proto.value(), source.empty() ? nullptr : source.c_str());
        if (!ep) return ep.status();
        auto* c = new OfiConsumer(std::move(ep.value()));
        (*insts)[key] = c;
        if (std::strcmp(proto.value()->provider, "shm") == 0) unlink_at_exit(c->ep_->address());
        return c;
    }
    ~OfiConsumer() {
        for (auto& [k, v] : av_) fi_av_remove(ep_->av(), &v->second.fa, 1, 0);
        for (auto& w : windows_) {
            ep_->release(w.region);
            if (w.mem) ::munmap(w.mem, kWindow);
        }
    }

    ofi::Endpoint& ep() { return *ep_; }
    void poison() { poisoned_ = true; }

    // A registered read window of kDepth chunk slots for one receive. At
    // most kMaxWindows exist per endpoint (mapped, not allocated: a
    // window's pages are touched only by receives that use it); as no more
    // receives run at once (ReceiveTokens), one is always free or can be
    // made, and the wait below is only a guard.
    Result<int> take_window(const Deadline& deadline) {
        std::unique_lock<std::mutex> lk(mu_);
        size_t i = 0;
        for (;;) {
            for (i = 0; i < windows_.size() && windows_[i].busy; ++i) {
            }
            if (i < windows_.size() || windows_.size() < kMaxWindows) break;
            ++window_waits_;
            if (deadline.expired())
                return Status(DYAD_RC_TIMEOUT,
                              "all " + std::to_string(kMaxWindows) +
                                  " OFI read windows of this process stayed in use by other "
                                  "receives until the transfer deadline (DYAD_TRANSFER_TIMEOUT): "
                                  "run fewer MARGO fetches at once per process (threads x "
                                  "consume window), or try again",
                              EAGAIN);
            window_cv_.wait_for(lk,
                                std::chrono::milliseconds(std::clamp(deadline.poll_ms(), 1, 1000)));
        }
        if (i == windows_.size()) windows_.emplace_back();
        Window& w = windows_[i];
        w.busy = true;
        if (w.mem) return static_cast<int>(i);
        // Mapped and registered outside the lock; the window is reserved.
        lk.unlock();
        Status err = Status::ok();
        ofi::Region r;
        void* m =
            ::mmap(nullptr, kWindow, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            err = Status(DYAD_RC_SYSFAIL, "cannot map an OFI read window", errno);
        } else {
            auto reg = ep_->register_memory(m, kWindow, FI_READ);
            if (reg) {
                r = reg.value();
            } else {
                ::munmap(m, kWindow);
                err = reg.status();
            }
        }
        lk.lock();
        if (!err) {
            w.busy = false;  // mapped again by the next receive that takes it
            window_cv_.notify_one();
            return err;
        }
        w.mem = static_cast<char*>(m);
        w.region = r;
        return static_cast<int>(i);
    }
    void give_window(int i) {
        {
            std::lock_guard<std::mutex> lk(mu_);
            windows_[static_cast<size_t>(i)].busy = false;
        }
        window_cv_.notify_one();
    }
    char* window(int i) {
        std::lock_guard<std::mutex> lk(mu_);
        return windows_[static_cast<size_t>(i)].mem;
    }
    void* window_desc(int i) {
        std::lock_guard<std::mutex> lk(mu_);
        return windows_[static_cast<size_t>(i)].region.desc;
    }

    // Completions are read by one thread at a time (the poller) and handed
    // to the read's own receive (its inbox), which applies them on its own
    // thread: a receive's window is never touched by another thread. A
    // completion whose read belongs to no live receive (one that ended with
    // reads it could not cancel) is dropped.
    struct Done {
        void* op;
        int err;
    };
    struct Inbox {
        std::vector<Done> done;
    };
    void attach(void* op, Inbox* in) {
        std::lock_guard<std::mutex> lk(mu_);
        live_[op] = in;
    }
    void detach(void* op) {
        std::lock_guard<std::mutex> lk(mu_);
        live_.erase(op);
    }
    // Moves `in`'s completions to `out`, reading the CQ first if no other
    // thread is (waiting up to timeout_ms on its fd when there is nothing),
    // or waiting up to timeout_ms for that thread to hand some over.
    Status poll(Inbox& in, int timeout_ms, std::vector<Done>& out) {
        std::unique_lock<std::mutex> lk(mu_);
        if (in.done.empty() && polling_) {
            if (timeout_ms > 0)
                poll_cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms),
                                  [&] { return !in.done.empty() || !polling_; });
        } else if (in.done.empty()) {
            polling_ = true;
            lk.unlock();
            fi_cq_entry e[16];
            Done err{nullptr, 0};
            // Read (which also drives progress); when there is nothing,
            // sleep on the CQ's fd rather than in fi_cq_sread, which for
            // tcp;ofi_rxm polls the provider in a loop and keeps a core busy.
            ssize_t n = fi_cq_read(ep_->cq(), e, 16);
            if (n == -FI_EAGAIN && timeout_ms > 0 && ep_->can_wait()) {
                ep_->sleep(timeout_ms);
                n = fi_cq_read(ep_->cq(), e, 16);
            }
            if (n == -FI_EAVAIL) {
                fi_cq_err_entry ee;
                std::memset(&ee, 0, sizeof ee);
                if (fi_cq_readerr(ep_->cq(), &ee, 0) == 1 && ee.op_context)
                    err = Done{ee.op_context, ee.err ? ee.err : FI_EIO};
            }
            lk.lock();
            polling_ = false;
            if (n > 0)
                for (ssize_t i = 0; i < n; ++i) hand(e[i].op_context, 0);
            if (err.op) hand(err.op, err.err);
            poll_cv_.notify_all();
            if (n < 0 && n != -FI_EAGAIN && n != -FI_EAVAIL) {
                out.swap(in.done);
                return ofi::fi_error(DYAD_RC_BADFETCH, "fi_cq_read", n);
            }
        }
        out.clear();
        out.swap(in.done);
        return Status::ok();
    }

    // The service's address in the AV (inserted once; LRU eviction of
    // entries no receive is using: give_peer when done).
    Result<fi_addr_t> peer(const std::string& addr) {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = av_.find(addr);
        if (it != av_.end()) {
            lru_.splice(lru_.begin(), lru_, it->second);
            ++it->second->second.users;
            return it->second->second.fa;
        }
        // fi_av_insert reads an address of our format's length, whatever
        // the blob's: one of another length or family never gets there.
        Status fits = check_ofi_peer_address(addr, ep_->address(), ep_->sockaddr_format());
        if (!fits) return fits;
        fi_addr_t fa = FI_ADDR_UNSPEC;
        int n = fi_av_insert(ep_->av(), addr.data(), 1, &fa, 0, nullptr);
        if (n != 1) return ofi::fi_error(DYAD_RC_BADFETCH, "fi_av_insert of the service", n);
        lru_.emplace_front(addr, AvEntry{fa, 1});
        av_[addr] = lru_.begin();
        // Entries in use stay (at most one per receive, themselves bounded
        // by the windows).
        for (auto old = lru_.end(); lru_.size() > kAvCacheSize && old != lru_.begin();) {
            --old;
            if (old->second.users > 0) continue;
            fi_av_remove(ep_->av(), &old->second.fa, 1, 0);
            av_.erase(old->first);
            old = lru_.erase(old);
        }
        return fa;
    }
    void give_peer(const std::string& addr) {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = av_.find(addr);
        if (it != av_.end() && it->second->second.users > 0) --it->second->second.users;
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
    // Under mu_ (hands a completion to its read's receive, if live).
    void hand(void* op, int err) {
        auto it = live_.find(op);
        if (it != live_.end()) it->second->done.push_back(Done{op, err});
    }

    std::unique_ptr<ofi::Endpoint> ep_;
    static constexpr size_t kWindow = kDepth * kOfiChunk;
    struct Window {
        char* mem = nullptr;
        ofi::Region region;
        bool busy = false;
    };
    std::mutex mu_;               // everything below
    std::deque<Window> windows_;  // never shrinks: addresses stay valid
    std::condition_variable window_cv_;
    uint64_t window_waits_ = 0;
    std::unordered_map<void*, Inbox*> live_;  // reads of live receives
    bool polling_ = false;                    // a thread is reading the CQ
    std::condition_variable poll_cv_;
    std::atomic<bool> poisoned_{false};
    struct AvEntry {
        fi_addr_t fa;
        int users;
    };
    std::list<std::pair<std::string, AvEntry>> lru_;
    std::unordered_map<std::string, std::list<std::pair<std::string, AvEntry>>::iterator> av_;
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
