// SPDX-License-Identifier: Apache-2.0
// Service::StoreWatch: whether a remote metadata store (--kvs) answers, and
// the keeper that puts the service back into it when it comes back empty
// (its dyadd restarted): registration first, then the records of the files
// the service published (docs/design.md, "A restart of the store host").
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvs/store.hpp"
#include "service.hpp"

namespace dyad::service {

// The last successful call of the service or of a probe (a get of its own
// registration, deadline kProbeTimeout) on a thread of its own, which probes
// every kKeepEvery. A result younger than kFresh is reused; a check
// otherwise waits for the next probe, one at a time however many ask. A
// probe that finds the registration gone (the store answers, without it)
// calls `rejoin` on a thread of its own, once at a time.
class Service::StoreWatch {
  public:
    using Done = std::function<void(bool, std::string)>;
    // Puts the service back; `stopping` says when to give up. False: not
    // all of it (the store went away again): tried again kKeepEvery later.
    using Rejoin = std::function<bool(const std::function<bool()>& stopping)>;
    static constexpr auto kFresh = std::chrono::seconds(1);
    static constexpr auto kKeepEvery = std::chrono::seconds(1);
    static constexpr double kProbeTimeout = 1.5;

    StoreWatch(kvs::RpcStore& store, std::string id, std::string uri, Rejoin rejoin);
    ~StoreWatch();

    // Starts the probing thread (after the first registration).
    void start();
    // The store answered a call of the service (file threads).
    void answered();
    void check(Done done);
    // For status: reachable as last seen, seconds since the last answer,
    // how often the service was put back.
    nlohmann::json view() const;

  private:
    void run();
    void rejoin_loop();

    kvs::RpcStore& store_;
    std::string id_, uri_;
    Rejoin rejoin_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    bool lost_ = false;       // the registration is gone: rejoin_loop puts it back
    bool rejoining_ = false;  // rejoin_ runs
    std::optional<std::chrono::steady_clock::time_point> last_ok_, last_fail_;
    std::string error_;
    std::vector<Done> waiting_;
    uint64_t rejoins_ = 0;
    std::thread thread_, rejoiner_;
};

}  // namespace dyad::service
