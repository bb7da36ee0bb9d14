// SPDX-License-Identifier: Apache-2.0
#include "wait_log.hpp"

#include <algorithm>
#include <cctype>

#include "common/log.hpp"
#include "rpc/server.hpp"

namespace dyad::kvs {
namespace {
constexpr std::chrono::seconds kTick{1};

// "pid 1234, uid 1000, on this node" / "pid 1234, from 10.0.0.2": what
// the hello said and the kernel knows of the waiting client (without the
// port, which changes when the client asks again on a new connection).
std::string who(const rpc::Peer& p) {
    std::string s = "pid " + std::to_string(p.pid);
    if (p.uid >= 0) s += ", uid " + std::to_string(p.uid);
    if (p.address == "unix" || p.address.empty()) return s + ", on this node";
    std::string host = p.address;
    size_t colon = host.rfind(':');
    if (colon != std::string::npos && host.find(']') == std::string::npos) host.resize(colon);
    return s + ", from " + host;
}

// The file's name in a record key ("bin.bin.bin.upath", common/keygen.hpp):
// the key without its leading hexadecimal levels.
std::string file_of(const std::string& key) {
    size_t pos = 0;
    for (int level = 0; level < 16; ++level) {
        size_t dot = key.find('.', pos);
        if (dot == std::string::npos || dot == pos || dot - pos > 8 || dot + 1 >= key.size()) break;
        bool hex =
            std::all_of(key.begin() + static_cast<long>(pos), key.begin() + static_cast<long>(dot),
                        [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
        if (!hex) break;
        pos = dot + 1;
    }
    return key.substr(pos);
}
}  // namespace

void WaitLog::watch(const std::shared_ptr<rpc::Request>& r, const std::string& ns,
                    const std::string& key) {
    const std::string client = who(r->peer());
    const std::string id = client + '\0' + ns + '\0' + key;
    auto it = waits_.find(id);
    if (it != waits_.end()) {
        it->second.requests.push_back(r);  // asked again: the same wait goes on
    } else {
        // Most waits are answered at once (the record is there): they are
        // followed only if still held at the next tick.
        if (fresh_.size() >= kMaxWaits) return;
        fresh_.push_back({r, ns, key, client});
    }
    arm(&r->io());
}

void WaitLog::arm(asio::io_context* io) {
    if (armed_) return;
    if (!timer_) {
        if (!io) return;
        timer_ = std::make_unique<asio::steady_timer>(*io);
    }
    armed_ = true;
    timer_->expires_after(kTick);
    timer_->async_wait([weak = weak_from_this()](asio::error_code ec) {
        auto self = weak.lock();
        if (!self || ec) return;
        self->armed_ = false;
        self->tick();
    });
}

void WaitLog::tick() {
    const auto now = Clock::now();
    for (auto& f : fresh_) {
        auto r = f.request.lock();
        if (!r || r->finished() || waits_.size() >= kMaxWaits) continue;
        const std::string id = f.who + '\0' + f.ns + '\0' + f.key;
        auto [it, made] = waits_.try_emplace(id);
        Wait& w = it->second;
        if (made) {
            w.ns = std::move(f.ns);
            w.key = std::move(f.key);
            w.who = std::move(f.who);
            w.start = r->arrived();
            w.next = w.start + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(kFirstLine));
        }
        w.requests.push_back(r);
    }
    fresh_.clear();
    for (auto it = waits_.begin(); it != waits_.end();) {
        Wait& w = it->second;
        std::shared_ptr<rpc::Request> held;
        auto& rs = w.requests;
        rs.erase(std::remove_if(rs.begin(), rs.end(),
                                [&](const std::weak_ptr<rpc::Request>& wr) {
                                    auto r = wr.lock();
                                    if (!r || r->finished()) return true;
                                    held = r;
                                    return false;
                                }),
                 rs.end());
        if (!held) {
            // Answered (found, or TIMEOUT to be asked again) or given up:
            // kept kRejoin seconds for the client's next request.
            if (w.idle_since == Clock::time_point()) w.idle_since = now;
            if (now - w.idle_since > std::chrono::duration<double>(kRejoin)) {
                it = waits_.erase(it);
                continue;
            }
        } else {
            w.idle_since = Clock::time_point();
            if (now >= w.next) {
                const auto waited =
                    std::chrono::duration_cast<std::chrono::seconds>(now - w.start).count();
                DYAD_INFO("kvs",
                          "a client (%s) has waited %lld s for '%s' (key '%s' in namespace "
                          "'%s'): not produced yet; it waits on",
                          w.who.c_str(), static_cast<long long>(waited), file_of(w.key).c_str(),
                          w.key.c_str(), w.ns.c_str());
                // At 5, 10, 20, 40 ... s of the wait, then every kLongestGap.
                w.next = std::max(now, w.next + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(w.gap)));
                w.gap = std::min(w.gap * 2, kLongestGap);
            }
        }
        ++it;
    }
    // An idle wait (between a TIMEOUT and the client's next request) keeps
    // the tick going until it is forgotten.
    if (!waits_.empty()) arm(nullptr);
}

}  // namespace dyad::kvs
