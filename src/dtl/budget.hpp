// SPDX-License-Identifier: Apache-2.0
// The service's transfer memory: every chunk buffer a transfer holds comes
// from one budget (DYAD_SERVICE_MEMORY, default 256 MiB), whatever the number
// of consumers and the size of their files. A transfer that finds the budget
// spent parks on the pending queue and is resumed, with its buffer, when
// another transfer returns one. Waiting endpoints (consumer connections) are
// served round-robin, and no endpoint holds more than its fair share
// (per_endpoint), so one greedy or slow consumer cannot starve the others.
// Endpoints of one peer (a host, or a local process: rpc::Peer::key)
// together read ahead within per_peer (set_per_peer), and hold at most twice
// that with every endpoint's first buffer, so opening more connections does
// not buy a peer more memory, and one slow endpoint of a peer, holding the
// peer's share, does not stall the peer's other endpoints.
//
// Thread-safe: the loop takes and parks; a file thread may take with
// try_get (a small file read whole there) and drop a Buffer. Grants run
// with the budget's lock held: they must only post (as every caller does).
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace dyad::dtl {

class MemoryBudget;

// One chunk buffer, returned to its budget when destroyed.
class Buffer {
  public:
    Buffer() = default;
    Buffer(MemoryBudget* b, uint64_t owner, uint64_t peer, char* p, size_t n)
        : budget_(b), owner_(owner), peer_(peer), p_(p), n_(n) {}
    Buffer(Buffer&& o) noexcept { *this = std::move(o); }
    Buffer& operator=(Buffer&& o) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() { reset(); }
    char* data() const { return p_; }
    size_t size() const { return n_; }
    explicit operator bool() const { return p_ != nullptr; }
    void reset();

  private:
    MemoryBudget* budget_ = nullptr;
    uint64_t owner_ = 0;
    uint64_t peer_ = 0;
    char* p_ = nullptr;
    size_t n_ = 0;
};

class MemoryBudget {
  public:
    using Grant = std::function<void(Buffer)>;

    explicit MemoryBudget(uint64_t limit)
        : limit_(limit), per_endpoint_(std::max<uint64_t>(limit / 8, 8u << 20)) {}
    ~MemoryBudget() {
        for (auto& [n, list] : cache_)
            for (char* p : list) ::munmap(p, n);
    }
    MemoryBudget(const MemoryBudget&) = delete;
    MemoryBudget& operator=(const MemoryBudget&) = delete;

    uint64_t limit() const { return limit_; }
    uint64_t in_use() const {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        return used_;
    }
    uint64_t peak() const {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        return peak_;
    }
    // Bytes all endpoints of one peer may hold together (0: no cap). A
    // peer holding nothing may always have one buffer.
    void set_per_peer(uint64_t n) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        per_peer_ = n;
    }
    uint64_t per_peer() const { return per_peer_; }

    // A buffer of n bytes for `owner` (an endpoint of `peer`; 0: none) now,
    // or an empty one when the budget (or the owner's or the peer's share)
    // is spent or others are already waiting.
    Buffer try_get(uint64_t owner, size_t n, uint64_t peer = 0) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        if (!waiting_.empty()) return {};
        Fit f = fits(owner, peer, n);
        if (f == Fit::peer_full) ++peer_limited_;
        if (f != Fit::yes) return {};
        return take(owner, peer, n);
    }
    // Parks the request: `grant` runs (posted by the caller's resume path,
    // on the loop) with the buffer once there is room. Returns a ticket for
    // cancel().
    uint64_t wait(uint64_t owner, size_t n, Grant grant, uint64_t peer = 0) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        uint64_t t = ++tickets_;
        auto& q = waiting_[owner];
        if (q.empty()) ring_.push_back(owner);
        q.push_back({t, n, peer, std::move(grant)});
        ++parked_total_;
        serve();
        return t;
    }
    void cancel(uint64_t owner, uint64_t ticket) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        auto it = waiting_.find(owner);
        if (it == waiting_.end()) return;
        auto& q = it->second;
        for (auto w = q.begin(); w != q.end(); ++w)
            if (w->ticket == ticket) {
                q.erase(w);
                break;
            }
        if (q.empty()) forget_owner(owner);
    }
    // Memory held outside Buffers (a transport's registered pool): counted
    // against the same limit, never parked.
    bool try_reserve(size_t n) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        if (used_ + n > limit_) return false;
        used_ += n;
        reserved_ += n;
        peak_ = std::max(peak_, used_);
        return true;
    }
    // The one exception: a transport that cannot work without its first
    // buffer takes it even over the limit (counted, so others get less).
    void force_reserve(size_t n) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        used_ += n;
        reserved_ += n;
        peak_ = std::max(peak_, used_);
    }
    void unreserve(size_t n) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        used_ -= n;
        reserved_ -= n;
        serve();
    }

    nlohmann::json stats() const {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        size_t waiting = 0;
        for (const auto& [o, q] : waiting_) waiting += q.size();
        uint64_t cached = 0;
        for (const auto& [n, list] : cache_) cached += n * list.size();
        return {{"limit", limit_},
                {"in_use", used_},
                {"peak", peak_},
                {"reserved", reserved_},
                {"cached", cached},
                {"per_endpoint", per_endpoint_},
                {"per_peer", per_peer_},
                {"peer_limited_total", peer_limited_},
                {"peers", peer_held_.size()},
                {"waiting", waiting},
                {"parked_total", parked_total_},
                {"endpoints", held_.size()}};
    }

  private:
    friend class Buffer;
    struct Waiter {
        uint64_t ticket;
        size_t n;
        uint64_t peer;
        Grant grant;
    };
    enum class Fit { yes, budget_full, endpoint_full, peer_full };

    Fit fits(uint64_t owner, uint64_t peer, size_t n) const {
        if (used_ + n > limit_) return Fit::budget_full;
        auto it = held_.find(owner);
        uint64_t mine = it == held_.end() ? 0 : it->second;
        if (peer && per_peer_) {
            auto p = peer_held_.find(peer);
            uint64_t theirs = p == peer_held_.end() ? 0 : p->second;
            // The peer's share bounds what its endpoints read ahead. An
            // endpoint holding nothing may still have its first buffer up
            // to twice the share, so one endpoint of a peer that holds the
            // share and drains it slowly (a consumer reading slowly, or not
            // at all until --send-timeout) does not stop its siblings; a
            // peer holding nothing may always have one buffer.
            const uint64_t cap = mine == 0 ? 2 * per_peer_ : per_peer_;
            if (theirs != 0 && theirs + n > cap) return Fit::peer_full;
        }
        // An endpoint holding nothing may always have one buffer.
        return mine == 0 || mine + n <= per_endpoint_ ? Fit::yes : Fit::endpoint_full;
    }

    Buffer take(uint64_t owner, uint64_t peer, size_t n) {
        char* p = nullptr;
        auto& list = cache_[n];
        if (!list.empty()) {
            p = list.back();
            list.pop_back();
            cached_ -= n;
        } else {
            void* m =
                ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED) return {};
            p = static_cast<char*>(m);
        }
        used_ += n;
        peak_ = std::max(peak_, used_);
        held_[owner] += n;
        if (peer) peer_held_[peer] += n;
        return Buffer(this, owner, peer, p, n);
    }

    void give_back(uint64_t owner, uint64_t peer, char* p, size_t n) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        auto it = held_.find(owner);
        if (it != held_.end() && (it->second -= n) == 0) held_.erase(it);
        auto pt = peer ? peer_held_.find(peer) : peer_held_.end();
        if (pt != peer_held_.end() && (pt->second -= n) == 0) peer_held_.erase(pt);
        used_ -= n;
        // Idle buffers are kept for reuse up to a quarter of the limit (and
        // within it); the rest goes back to the system at once.
        if (used_ + cached_ + n <= limit_ && cached_ + n <= limit_ / 4) {
            cache_[n].push_back(p);
            cached_ += n;
        } else {
            ::munmap(p, n);
        }
        serve();
    }

    // Round-robin over waiting endpoints: each turn grants the first waiter
    // of the next endpoint that fits.
    void serve() {
        if (serving_) return;  // a grant that frees memory re-enters here
        serving_ = true;
        size_t misses = 0;
        while (!ring_.empty() && misses < ring_.size()) {
            uint64_t owner = ring_.front();
            ring_.pop_front();
            auto& q = waiting_[owner];
            Waiter& w = q.front();
            if (fits(owner, w.peer, w.n) != Fit::yes) {
                ring_.push_back(owner);
                ++misses;
                continue;
            }
            misses = 0;
            Buffer b = take(owner, w.peer, w.n);
            if (!b) {  // out of address space: try again on the next release
                ring_.push_front(owner);
                break;
            }
            Grant g = std::move(w.grant);
            q.pop_front();
            if (q.empty())
                waiting_.erase(owner);
            else
                ring_.push_back(owner);
            g(std::move(b));
        }
        serving_ = false;
    }

    void forget_owner(uint64_t owner) {
        waiting_.erase(owner);
        for (auto it = ring_.begin(); it != ring_.end(); ++it)
            if (*it == owner) {
                ring_.erase(it);
                break;
            }
    }

    uint64_t limit_;
    uint64_t per_endpoint_;
    uint64_t per_peer_ = 0;
    uint64_t peer_limited_ = 0;               // try_get refused because the peer held its share
    std::map<uint64_t, uint64_t> peer_held_;  // peer -> bytes in Buffers
    uint64_t used_ = 0, peak_ = 0, reserved_ = 0, cached_ = 0;
    uint64_t tickets_ = 0, parked_total_ = 0;
    bool serving_ = false;
    std::map<uint64_t, uint64_t> held_;  // owner -> bytes in Buffers
    std::map<uint64_t, std::deque<Waiter>> waiting_;
    std::deque<uint64_t> ring_;  // owners with waiters, in turn order
    std::map<size_t, std::vector<char*>> cache_;
    mutable std::recursive_mutex mu_;  // recursive: a grant may drop a Buffer
};

// Buffers of a transport's own pool (MARGO's registered buffers) that each
// peer holds, against the share of the pool it may hold: the fraction of the
// budget it may hold (MemoryBudget::per_peer / limit), at least one buffer.
// Not thread-safe: the pool's lock guards it.
class PoolShares {
  public:
    void set_share(const MemoryBudget* b, size_t pool) {
        if (b && b->per_peer() && b->limit())
            per_peer_ = std::max<size_t>(1, static_cast<size_t>(pool * b->per_peer() / b->limit()));
    }
    bool full(uint64_t peer) const {
        auto it = peer && per_peer_ ? out_.find(peer) : out_.end();
        return it != out_.end() && it->second >= per_peer_;
    }
    void take(uint64_t peer) {
        if (peer) ++out_[peer];
    }
    void give(uint64_t peer) {
        auto it = peer ? out_.find(peer) : out_.end();
        if (it != out_.end() && --it->second == 0) out_.erase(it);
    }
    uint64_t waits = 0;  // acquisitions refused for a peer's share

  private:
    size_t per_peer_ = 0;  // 0: no cap
    std::map<uint64_t, size_t> out_;
};

inline Buffer& Buffer::operator=(Buffer&& o) noexcept {
    if (this != &o) {
        reset();
        budget_ = std::exchange(o.budget_, nullptr);
        owner_ = o.owner_;
        peer_ = o.peer_;
        p_ = std::exchange(o.p_, nullptr);
        n_ = std::exchange(o.n_, 0);
    }
    return *this;
}

inline void Buffer::reset() {
    if (p_ && budget_) budget_->give_back(owner_, peer_, p_, n_);
    p_ = nullptr;
    budget_ = nullptr;
    n_ = 0;
}

}  // namespace dyad::dtl
