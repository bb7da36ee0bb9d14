// SPDX-License-Identifier: Apache-2.0
// dyadd --store-late: the service accepts connections before its metadata
// store answers (a job's own etcd elects its leader meanwhile; docs/design.md,
// "A job's start with its own etcd"). A thread connects the store, checks
// that no other live dyadd holds this service id, registers the service and
// attaches the store to the kvs::LateStore every request goes through, which
// held them until then. A store that is merely slow is waited for (said in
// the log at growing intervals); one that refuses us for good (a wrong
// password, another dyadd of this id) stops the service with the exit code
// and message a start without --store-late has.
#include <algorithm>
#include <chrono>
#include <thread>

#include "common/json_text.hpp"
#include "common/log.hpp"
#include "common/timeouts.hpp"
#include "common/seconds.hpp"
#include "kvs/registry.hpp"
#include "proto/hello.hpp"
#include "service.hpp"

namespace dyad::service {
namespace {
constexpr const char* kSub = "dyadd";
// One try to connect: short, so that a stop is never kept waiting long.
constexpr double kConnectTry = 1.0;
// The registration's calls, per try.
constexpr double kRegisterTry = 5.0;
// The log lines while the store is not reached: after 5, 10, 20 ... s, then
// every kLongestGap.
constexpr double kFirstLine = 5.0;
constexpr double kLongestGap = 600.0;

// A store not up yet (tried again), rather than one that refuses us.
bool later(const Status& s) {
    return s.rc() == DYAD_RC_TIMEOUT || s.rc() == DYAD_RC_CONNFAIL;
}

// Says, at growing intervals, that the store is still not reached.
class SlowLog {
  public:
    explicit SlowLog(std::string what) : what_(std::move(what)) {}
    void tick(const std::string& why) {
        const double s = seconds_since(t0_);
        if (s < next_) return;
        DYAD_WARN(kSub,
                  "%s: not done after %.0f s (%s); still trying. This service answers "
                  "meanwhile: its publishes and lookups wait for the store",
                  what_.c_str(), s, why.c_str());
        gap_ = std::min(gap_ * 2, kLongestGap);
        next_ = s + gap_;
    }

  private:
    std::string what_;
    std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
    double next_ = kFirstLine, gap_ = kFirstLine;
};
}  // namespace

void Service::start_reaching_store() {
    store_thread_ = std::thread([this] { reach_store(); });
}

void Service::stop_reaching_store() {
    store_stop_ = true;
    if (opts_.late_store) opts_.late_store->stop_waiting();
    if (store_thread_.joinable()) store_thread_.join();
}

std::optional<Service::StoreFailure> Service::store_failure() const {
    std::lock_guard<std::mutex> lk(store_failure_mu_);
    return store_failure_;
}

void Service::store_failed(const Status& why, bool connecting) {
    DYAD_ERROR(kSub, "cannot use the metadata store %s: %s; this service stops",
               opts_.kvs_uri.c_str(), why.to_string().c_str());
    opts_.late_store->fail(why);
    {
        std::lock_guard<std::mutex> lk(store_failure_mu_);
        store_failure_ = StoreFailure{why, connecting};
    }
    stop();
}

std::shared_ptr<kvs::ServiceStore> Service::connect_late() {
    SlowLog slow("reaching the metadata store " + opts_.late_store->describe());
    while (!store_stop_) {
        auto c = opts_.connect_store(kConnectTry);
        if (c) return c.value();
        if (!later(c.status())) {
            store_failed(c.status(), true);
            return nullptr;
        }
        opts_.late_store->note(c.status().message());
        slow.tick(c.status().message());
    }
    return nullptr;
}

bool Service::register_late(kvs::ServiceStore& real) {
    Status unique = refuse_if_live(
        id_, real.get(kServicesNamespace, id_, Deadline::after(timeouts::kRegistryLook)), key_,
        real.describe());
    if (!unique) {
        store_failed(unique, false);
        return false;
    }
    SlowLog slow("registering in the metadata store " + real.describe());
    while (!store_stop_) {
        auto mine =
            real.register_service(id_, identity().build().dump(-1, ' ', false, kBadUtf8Replaced),
                                  Deadline::after(kRegisterTry));
        if (mine) {
            real.start();
            auto given = kvs::registry::rank_of(mine->value);
            if (!opts_.rank && given)  // (the loop reads the rank)
                asio::post(io_, [this, r = *given] {
                    rank_ = r;
                    rank_source_ = "store";
                    server_->set_hello_info(proto::Hello{identity()}.build());
                });
            return true;
        }
        if (!later(mine.status())) {
            store_failed(mine.status(), false);
            return false;
        }
        opts_.late_store->note(mine.status().message());
        slow.tick(mine.status().message());
    }
    return false;
}

void Service::reach_store() {
    auto real = connect_late();
    if (!real || !register_late(*real)) return;
    opts_.late_store->attach(real);
    DYAD_INFO(kSub, "metadata store %s reached %.3f s after the start; service %s registered",
              real->describe().c_str(), opts_.late_store->starting_seconds(), id_.c_str());
}

}  // namespace dyad::service
