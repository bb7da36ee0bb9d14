// SPDX-License-Identifier: Apache-2.0
// A log rate limit for warnings a peer can trigger: at most `max` lines
// every `window`, then one line saying how many were left out. Thread-safe.
// rpc::Server::peer_warning_allowed uses one for connection-level warnings.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

#include "log.hpp"

namespace dyad::log {

class RateLimit {
  public:
    RateLimit(const char* subsys, const char* what, unsigned max = 20,
              std::chrono::seconds window = std::chrono::seconds(10))
        : subsys_(subsys), what_(what), max_(max), window_(window) {}

    // True: log this one.
    bool allow() {
        std::lock_guard<std::mutex> lk(mu_);
        const auto now = std::chrono::steady_clock::now();
        if (now - start_ >= window_) {
            if (left_out_ > 0)
                DYAD_WARN(subsys_,
                          "%llu more warnings (%s) were left out of the log (at most %u every "
                          "%lld s)",
                          static_cast<unsigned long long>(left_out_), what_, max_,
                          static_cast<long long>(window_.count()));
            start_ = now;
            used_ = 0;
            left_out_ = 0;
        }
        if (used_ < max_) {
            ++used_;
            return true;
        }
        ++left_out_;
        return false;
    }

  private:
    std::mutex mu_;
    const char* subsys_;
    const char* what_;
    unsigned max_;
    std::chrono::seconds window_;
    std::chrono::steady_clock::time_point start_{};
    unsigned used_ = 0;
    uint64_t left_out_ = 0;
};

}  // namespace dyad::log
