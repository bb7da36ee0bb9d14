// SPDX-License-Identifier: Apache-2.0
// What one peer (rpc::Peer::key: its host over TCP, its process on the Unix
// socket) holds of the service's fetches: fetches in progress, and LOCAL
// fetches, each of which holds an open descriptor of the served file (and
// its shared lock) until the consumer says it copied it. Caps on both, so
// that one peer cannot take what the others need (docs/security.md, "Caps
// per peer"). Thread-safe: slots are taken on the loop and released
// wherever the last holder of the fetch lets go (loop or file thread).
#pragma once

#include <algorithm>
#include <cerrno>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/status.hpp"

namespace dyad::service {

class PeerCaps : public std::enable_shared_from_this<PeerCaps> {
  public:
    struct Limits {
        uint64_t fetches = 1024;  // fetches in progress per peer (0: no cap)
        uint64_t local = 256;     // LOCAL descriptors held per peer (0: no cap)
    };
    explicit PeerCaps(Limits l) : limits_(l) {}
    const Limits& limits() const { return limits_; }

    // A slot for one fetch of `peer` (a LOCAL one takes a descriptor slot
    // too), given back when the last copy of the returned pointer goes; or
    // the refusal (EBUSY, saying which cap and what to do).
    Result<std::shared_ptr<void>> take(const std::string& peer, bool local,
                                       const std::string& service) {
        std::lock_guard<std::mutex> lk(mu_);
        Use& u = use_[peer];
        std::string why;
        if (limits_.fetches && u.fetches >= limits_.fetches) {
            ++refused_fetches_;
            why = std::to_string(u.fetches) +
                  " fetches in progress, the most one peer may have (dyadd "
                  "--max-fetches-per-peer)";
        } else if (local && limits_.local && u.local >= limits_.local) {
            ++refused_local_;
            why = std::to_string(u.local) +
                  " LOCAL fetches holding an open file, the most one peer may have (dyadd "
                  "--max-local-per-peer)";
        }
        if (!why.empty()) {
            if (u.fetches == 0 && u.local == 0) use_.erase(peer);
            return Status(DYAD_RC_BADFETCH,
                          "service " + service + " refused a fetch of " + peer + ": it has " + why +
                              "; wait for those to finish (a consumer must read what it asked "
                              "for) or start dyadd with a larger cap",
                          EBUSY);
        }
        ++u.fetches;
        if (local) ++u.local;
        auto self = shared_from_this();
        return std::shared_ptr<void>(new int(0), [self, peer, local](int* p) {
            delete p;
            self->give_back(peer, local);
        });
    }

    uint64_t refused_fetches() const {
        std::lock_guard<std::mutex> lk(mu_);
        return refused_fetches_;
    }
    uint64_t refused_local() const {
        std::lock_guard<std::mutex> lk(mu_);
        return refused_local_;
    }
    // For status: peers holding fetches, and the most one of them holds.
    nlohmann::json stats() const {
        std::lock_guard<std::mutex> lk(mu_);
        uint64_t most = 0, most_local = 0;
        for (const auto& [p, u] : use_) {
            most = std::max(most, u.fetches);
            most_local = std::max(most_local, u.local);
        }
        return {{"peers_fetching", use_.size()},
                {"busiest_peer_fetches", most},
                {"busiest_peer_local", most_local}};
    }

  private:
    struct Use {
        uint64_t fetches = 0, local = 0;
    };
    void give_back(const std::string& peer, bool local) {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = use_.find(peer);
        if (it == use_.end()) return;
        if (it->second.fetches) --it->second.fetches;
        if (local && it->second.local) --it->second.local;
        if (it->second.fetches == 0 && it->second.local == 0) use_.erase(it);
    }

    Limits limits_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, Use> use_;
    uint64_t refused_fetches_ = 0, refused_local_ = 0;
};

}  // namespace dyad::service
