// SPDX-License-Identifier: Apache-2.0
// Whether a service's metadata store answers, as its calls and streams see
// it: up or down since when (and why), how many calls failed, how many
// outages there were. The outage and the recovery are each logged once (not
// per request); status, health and metrics read the same figures. Never
// held over I/O: answered() and failed() are cheap, from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.hpp"

namespace dyad::kvs {

struct OutageView {
    bool up = true;        // answered last (or nothing failed yet)
    uint64_t errors = 0;   // calls and streams that failed
    uint64_t outages = 0;  // times it went from answering to not
    double down_s = 0;     // how long it has not answered (when down)
    std::string since;     // when it stopped answering, UTC (when down)
    std::string error;     // the last failure (when down)
};

class Outage {
  public:
    // store: what the messages call it ("etcd://10.0.0.1:2379").
    explicit Outage(std::string store) : store_(std::move(store)) {}
    const std::string& store() const { return store_; }
    // The store answered. After an outage, logs the recovery once, with
    // resumed() (the waits that resume now) when given.
    void answered(const std::function<uint64_t()>& resumed = {});
    // A call or stream failed: counted; the first failure after an answer
    // starts an outage (logged once).
    void failed(const std::string& why);
    bool up() const { return !down_.load(std::memory_order_relaxed); }
    OutageView view() const;
    // {reachable, store_errors, store_outages, unreachable_since, down_s, error}.
    void describe(nlohmann::json& j) const;
    // The error a request gets while the store is down (DYAD_RC_CONNFAIL,
    // EHOSTUNREACH): "the metadata store etcd://... is unreachable since
    // ... (N s): WHY". Clients recognize it by unreachable().
    Status unreachable_status() const;
    // For a health check while down: "degraded: metadata store ...
    // unreachable since ... (N s): WHY".
    std::string health_text() const;
    static bool unreachable(const Status& s);

  private:
    std::string store_;
    std::atomic<bool> down_{false};
    std::atomic<uint64_t> errors_{0};
    mutable std::mutex mu_;
    uint64_t outages_ = 0;
    std::chrono::steady_clock::time_point since_;
    std::chrono::system_clock::time_point since_wall_;
    std::string error_;
};

}  // namespace dyad::kvs
