// SPDX-License-Identifier: Apache-2.0
// Another dyadd's embedded store (dyadd --kvs tcp://...) as this service's
// ServiceStore: the RPC client (RpcStore) plus the watch of whether it
// answers, and the keeper that puts the service back into it when it comes
// back empty (its dyadd restarted): the Rejoin the service supplies
// registers again and publishes again what it published (docs/design.md,
// "A restart of the store host").
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "service_store.hpp"

namespace dyad::kvs {

// The last successful call of the service or of a probe (a get of its own
// registration, deadline kProbeTimeout) on a thread of its own, which probes
// every kKeepEvery. A result younger than kFresh is reused; a check
// otherwise waits for the next probe, one at a time however many ask. A
// probe that finds the registration gone (the store answers, without it)
// calls the Rejoin on a thread of its own, once at a time.
class RemoteStore final : public ServiceStore {
  public:
    static constexpr auto kFresh = std::chrono::seconds(1);
    static constexpr auto kKeepEvery = std::chrono::seconds(1);
    static constexpr double kProbeTimeout = 1.5;

    // id: this service; its calls go as `credentials` says.
    RemoteStore(std::string uri, std::string id, rpc::Credentials credentials, Rejoin rejoin);
    ~RemoteStore() override;

    Result<Entry> register_service(const std::string& id, const std::string& value,
                                   Deadline d) override;
    // (The writer is this service, as its credentials say.)
    Result<uint64_t> put(const std::string& ns, const std::string& key, const std::string& value,
                         const std::string& writer, uint64_t replaces, Deadline d) override;
    Status remove(const std::string& ns, const std::string& key, const std::string& writer,
                  Deadline d) override;
    Result<Entry> get(const std::string& ns, const std::string& key, Deadline d) override;
    // Blocks for the whole wait (a remote store is never served to clients).
    uint64_t wait(const std::string& ns, const std::string& key, Deadline d, Done done) override;
    void cancel(uint64_t) override {}
    Result<Page> list(const std::string& ns, const std::string& prefix, const std::string& after,
                      uint64_t limit, Deadline d) override;
    bool serves_clients() const override { return false; }
    // Starts the probing thread (after the first registration).
    void start() override;
    void close() override;
    void check(std::function<void(bool, std::string)> done) override;
    // Reachable as last seen, seconds since the last answer, how often the
    // service was put back and how many files it published again.
    nlohmann::json status() const override;
    std::optional<OutageView> outage() const override { return outage_.view(); }
    // The uri (the errors about it name it so).
    std::string describe() const override { return uri_; }

  private:
    // The store answered a call of the service.
    void answered();
    void run();
    void rejoin_loop();

    std::string uri_, id_;
    RpcStore rpc_;
    Rejoin rejoin_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    bool lost_ = false;       // the registration is gone: rejoin_loop puts it back
    bool rejoining_ = false;  // rejoin_ runs
    std::optional<std::chrono::steady_clock::time_point> last_ok_, last_fail_;
    std::string error_;
    std::vector<std::function<void(bool, std::string)>> waiting_;
    uint64_t rejoins_ = 0;
    uint64_t republished_ = 0;
    Outage outage_{uri_};  // what the probes and the service's calls saw
    std::thread thread_, rejoiner_;
};

}  // namespace dyad::kvs
