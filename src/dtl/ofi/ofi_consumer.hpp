// SPDX-License-Identifier: Apache-2.0
// The libfabric transport's consumer endpoint (ofi_receiver.cpp uses it):
// one per process, protocol and source address, with its read windows, its
// completion queue's poller and its AV of service addresses; and the tokens
// that bound the receives a process runs at once.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/deadline.hpp"
#include "common/status.hpp"
#include "ofi.hpp"
#include "ofi_transport.hpp"

namespace dyad::dtl::ofi {

// The protocols validated in this process (fi_getinfo once each).
Result<const ofi::Protocol*> validated(const std::string& name);

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
std::string source_towards(const std::string& peer);

class OfiConsumer {
  public:
    // One endpoint per protocol and source address (`source` empty: the
    // provider's choice, for addresses that are no IP socket address).
    static Result<OfiConsumer*> instance(const std::string& proto_name, const std::string& source);
    ~OfiConsumer();

    ofi::Endpoint& ep() { return *ep_; }
    void poison() { poisoned_ = true; }

    // A registered read window of kDepth chunk slots for one receive. At
    // most kMaxWindows exist per endpoint (mapped, not allocated: a
    // window's pages are touched only by receives that use it); as no more
    // receives run at once (ReceiveTokens), one is always free or can be
    // made, and the wait below is only a guard.
    Result<int> take_window(const Deadline& deadline);
    void give_window(int i);
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
    Status poll(Inbox& in, int timeout_ms, std::vector<Done>& out);

    // The service's address in the AV (inserted once; LRU eviction of
    // entries no receive is using: give_peer when done).
    Result<fi_addr_t> peer(const std::string& addr);
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
    static void unlink_at_exit(const std::string& address);
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

}  // namespace dyad::dtl::ofi
