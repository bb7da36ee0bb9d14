// SPDX-License-Identifier: Apache-2.0
// The libfabric transport's consumer endpoint (ofi_consumer.hpp).
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
#include "dtl/per_process.hpp"
#include "dtl/receive_window.hpp"

namespace dyad::dtl::ofi {

Result<const ofi::Protocol*> validated(const std::string& name) {
    static auto& state = *new PerProcess<std::map<std::string, const ofi::Protocol*>>();
    auto known = state.lock();
    auto it = known->find(name);
    if (it != known->end()) return it->second;
    auto p = ofi::validate_protocol(name);
    if (p) (*known)[name] = p.value();
    return p;
}

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

Result<OfiConsumer*> OfiConsumer::instance(const std::string& proto_name,
                                           const std::string& source) {
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

OfiConsumer::~OfiConsumer() {
    for (auto& [k, v] : av_) fi_av_remove(ep_->av(), &v->second.fa, 1, 0);
    for (auto& w : windows_) {
        ep_->release(w.region);
        if (w.mem) ::munmap(w.mem, kWindow);
    }
}

Result<int> OfiConsumer::take_window(const Deadline& deadline) {
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
        window_cv_.wait_for(lk, std::chrono::milliseconds(std::clamp(deadline.poll_ms(), 1, 1000)));
    }
    if (i == windows_.size()) windows_.emplace_back();
    Window& w = windows_[i];
    w.busy = true;
    if (w.mem) return static_cast<int>(i);
    // Mapped and registered outside the lock; the window is reserved.
    lk.unlock();
    Status err = Status::ok();
    ofi::Region r;
    void* m = ::mmap(nullptr, kWindow, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
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

void OfiConsumer::give_window(int i) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        windows_[static_cast<size_t>(i)].busy = false;
    }
    window_cv_.notify_one();
}

Status OfiConsumer::poll(Inbox& in, int timeout_ms, std::vector<Done>& out) {
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

Result<fi_addr_t> OfiConsumer::peer(const std::string& addr) {
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

void OfiConsumer::unlink_at_exit(const std::string& address) {
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

}  // namespace dyad::dtl::ofi
