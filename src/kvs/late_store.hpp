// SPDX-License-Identifier: Apache-2.0
// The metadata store of a service that is ready before its store answers
// (dyadd --store-late; `dyad job` starts the dyadds of a job with its own
// etcd so, docs/design.md, "A job's start with its own etcd"). The service
// listens at once; its store is connected, and the service registered in
// it, on a thread of the service, which then attach()es the store. Until
// then every call waits for it, each up to its own deadline (never longer),
// and wait-for-create requests are held and forwarded once it is there
// (TIMEOUT at their deadline): a client's first publish or lookup rides
// through the store's start. Status, health and metrics say "starting"
// meanwhile.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "service_store.hpp"

namespace dyad::kvs {

class LateStore : public ServiceStore {
  public:
    // While starting, a request is held this long at most before the
    // store counts as down (down(): refused at once, the client asks again
    // until its own deadline), rather than holding threads of the pool.
    static constexpr double kHold = 10.0;

    // backend: "etcd"; endpoint: its members (HOST:PORT,...), as the store
    // names them once connected; uri: the --kvs given (messages).
    LateStore(std::string backend, std::string endpoint, std::string uri);
    ~LateStore() override;

    // The store, connected, with the service registered in it: every call
    // goes there from now on; the waits held are forwarded (those past
    // their deadline answered TIMEOUT). Once.
    void attach(std::shared_ptr<ServiceStore> store);
    // The start failed for good: the calls held and those to come get `why`.
    void fail(const Status& why);
    // Why the store does not answer yet (the last try's error), for status.
    void note(const std::string& why);
    // The service stops: calls waiting for the store give up now.
    void stop_waiting();
    // Seconds since the service began to reach its store.
    double starting_seconds() const;

    Result<Entry> register_service(const std::string& id, const std::string& value,
                                   Deadline d) override;
    Result<uint64_t> put(const std::string& ns, const std::string& key, const std::string& value,
                         const std::string& writer, uint64_t replaces, Deadline d) override;
    Status remove(const std::string& ns, const std::string& key, const std::string& writer,
                  Deadline d) override;
    Result<Entry> get(const std::string& ns, const std::string& key, Deadline d) override;
    Result<std::vector<Lookup>> get_many(const std::string& ns,
                                         const std::vector<std::string>& keys, size_t budget,
                                         Deadline d) override;
    uint64_t wait(const std::string& ns, const std::string& key, Deadline d, Done done) override;
    void cancel(uint64_t id) override;
    Result<Page> list(const std::string& ns, const std::string& prefix, const std::string& after,
                      uint64_t limit, Deadline d) override;
    Result<Changes> changes(const std::string& ns, uint64_t after, double wait,
                            Deadline d) override;
    void changes_refused() override;
    bool serves_clients() const override { return true; }
    bool blocks() const override { return true; }
    size_t max_key() const override;
    void start() override;
    void close() override;
    void check(std::function<void(bool, std::string)> done) override;
    std::optional<Status> down() const override;
    std::optional<OutageView> outage() const override;
    nlohmann::json status() const override;
    std::string describe() const override;

    struct Held;    // a wait-for-create request held (late_store.cpp)
    struct Shared;  // what forwarded waits' answers reach (late_store.cpp)

  private:
    using Clock = std::chrono::steady_clock;
    // The store once attached, else null.
    ServiceStore* live() const { return live_.load(std::memory_order_acquire); }
    // The store, waiting for it until `d`; else why not.
    Result<ServiceStore*> ready(Deadline d) const;
    // While starting: the error of a call whose deadline came first. It
    // reads as the store's outage (Outage::unreachable): clients ask again.
    Status starting_status() const;
    std::string starting_text() const;
    // Answers TIMEOUT to the held waits past their deadline (a thread of
    // its own, while starting).
    void expire_held();
    void forward(uint64_t id, const std::shared_ptr<Held>& h);

    const std::string backend_, endpoint_, uri_;
    const Clock::time_point since_ = Clock::now();
    const std::chrono::system_clock::time_point since_wall_ = std::chrono::system_clock::now();
    std::shared_ptr<Shared> s_;
    mutable std::condition_variable cv_;  // with s_->mu: attached, failed, closing
    std::thread expiry_;
    std::atomic<ServiceStore*> live_{nullptr};
    double attached_after_ = 0;
    // Last: destroyed first, while what its answers reach still exists.
    std::shared_ptr<ServiceStore> store_;
};

}  // namespace dyad::kvs
