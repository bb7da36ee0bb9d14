// SPDX-License-Identifier: Apache-2.0
// The owner directory (owners.hpp): owners' registry entries, the endpoint
// to reach each at, the owners found down a moment ago.
#include "owners.hpp"

#include <unistd.h>

#include <cerrno>
#include <new>
#include <set>

#include "common/log.hpp"
#include "timeouts.hpp"

namespace dyad::client {
namespace {
constexpr const char* kSub = "client";
// How long an owner that could not be reached is skipped (its files go to a
// replica first): a lost node does not cost one connect timeout per file.
constexpr auto kDownFor = std::chrono::seconds(5);
}  // namespace

Result<nlohmann::json> OwnerDirectory::info(const std::string& owner, const ServiceInfo& svc) {
    if (owner == svc.id) return svc.raw ? *svc.raw : nlohmann::json::object();
    {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = owners_.find(owner);
        if (it != owners_.end()) return it->second;
    }
    auto st = link_.store();
    if (!st) return st.status();
    auto e = st.value()->get(kvs::kServicesNamespace, owner, Deadline::after(timeouts::kControl));
    if (!e) return e.status();
    auto j = nlohmann::json::parse(e->value, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        return Status(DYAD_RC_BADMETADATA, "registry entry of service " + owner + " is not JSON",
                      EPROTO);
    std::lock_guard<std::mutex> lk(mu_);
    owners_[owner] = j;
    return j;
}

bool OwnerDirectory::registered(const std::string& owner) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        owners_.erase(owner);
    }
    auto st = link_.store();
    if (!st) return true;
    auto e = st.value()->get(kvs::kServicesNamespace, owner, Deadline::after(timeouts::kControl));
    return e || e.status().rc() != DYAD_RC_NOTFOUND;
}

std::string OwnerDirectory::endpoint(const Record& rec, const ServiceInfo& svc) {
    std::string tcp;
    for (const auto& e : rec.endpoints)
        if (e.rfind("tcp://", 0) == 0) {
            tcp = e;
            break;
        }
    if (rec.node == svc.node)
        for (const auto& e : rec.endpoints) {
            if (e.rfind("unix:", 0) != 0) continue;
            // A socket this process may not connect to (its mode follows the
            // service's --allow-uid): the owner's TCP endpoint instead.
            const std::string path = e.substr(5);
            if (tcp.empty() || ::access(path.c_str(), R_OK | W_OK) == 0 || errno != EACCES)
                return e;
            static std::mutex noted_mu;
            static std::set<std::string> noted;
            std::lock_guard<std::mutex> lk(noted_mu);
            if (noted.size() < 64 && noted.insert(path).second)
                DYAD_WARN(kSub,
                          "cannot use the Unix socket %s of service %s (permission denied: its "
                          "dyadd admits other users with --allow-uid): using %s instead",
                          path.c_str(), rec.owner.c_str(), tcp.c_str());
            return tcp;
        }
    return tcp;
}

bool OwnerDirectory::down(const std::string& owner) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = down_.find(owner);
    if (it == down_.end()) return false;
    if (std::chrono::steady_clock::now() - it->second < kDownFor) return true;
    down_.erase(it);
    return false;
}

void OwnerDirectory::note_down(const std::string& owner) {
    std::lock_guard<std::mutex> lk(mu_);
    if (down_.size() >= 4096) down_.clear();
    down_[owner] = std::chrono::steady_clock::now();
}

void OwnerDirectory::reset_after_fork() {
    new (&mu_) std::mutex();  // a parent thread may have held it at fork time
}

}  // namespace dyad::client
