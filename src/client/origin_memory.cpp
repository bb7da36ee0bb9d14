// SPDX-License-Identifier: Apache-2.0
// The answers of origin lookups a process keeps (origin_memory.hpp says why).
#include "origin_memory.hpp"

namespace dyad::client {

OriginMemory::OriginMemory(double recheck_s)
    : recheck_(recheck_s > 0 ? std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(recheck_s))
                             : Clock::duration::zero()) {}

std::optional<Record> OriginMemory::recall(const std::string& upath) const {
    if (!enabled()) return std::nullopt;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = seen_.find(upath);
    if (it == seen_.end() || Clock::now() >= it->second.until) return std::nullopt;
    return it->second.rec;
}

void OriginMemory::remember(const std::string& upath, const Record& rec, Clock::time_point asked) {
    if (!enabled()) return;
    const Clock::time_point until = asked + recheck_;
    const Clock::time_point now = Clock::now();
    if (until <= now) return;
    std::lock_guard<std::mutex> lk(mu_);
    if (seen_.size() >= kMaxPaths && !seen_.count(upath)) {
        for (auto it = seen_.begin(); it != seen_.end();)
            it = it->second.until <= now ? seen_.erase(it) : std::next(it);
        if (seen_.size() >= kMaxPaths) seen_.erase(seen_.begin());
    }
    seen_[upath] = Entry{rec, until};
}

void OriginMemory::forget(const std::string& upath) {
    std::lock_guard<std::mutex> lk(mu_);
    seen_.erase(upath);
}

}  // namespace dyad::client
