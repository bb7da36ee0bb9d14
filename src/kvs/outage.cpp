// SPDX-License-Identifier: Apache-2.0
#include "outage.hpp"

#include <cerrno>

#include "common/log.hpp"
#include "common/seconds.hpp"

namespace dyad::kvs {
namespace {
constexpr const char* kSub = "dyadd";
constexpr const char* kMark = " is unreachable since ";

}  // namespace

void Outage::answered(const std::function<uint64_t()>& resumed) {
    if (!down_.load(std::memory_order_relaxed)) return;
    double lasted = 0;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!down_.load()) return;
        down_ = false;
        lasted = std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
    }
    if (resumed)
        DYAD_WARN(kSub, "metadata store at %s reachable again after %s s; %llu waits resumed",
                  store_.c_str(), seconds_tenths(lasted).c_str(),
                  static_cast<unsigned long long>(resumed()));
    else
        DYAD_WARN(kSub, "metadata store at %s reachable again after %s s", store_.c_str(),
                  seconds_tenths(lasted).c_str());
}

void Outage::failed(const std::string& why) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    std::string when;
    {
        std::lock_guard<std::mutex> lk(mu_);
        error_ = why;
        if (down_.load()) return;
        down_ = true;
        ++outages_;
        since_ = std::chrono::steady_clock::now();
        since_wall_ = std::chrono::system_clock::now();
        when = utc_text(since_wall_);
    }
    DYAD_WARN(kSub,
              "metadata store at %s unreachable since %s (%s): status, health and fetches of "
              "records consumers hold go on; publishes and lookups wait for it until their "
              "deadlines",
              store_.c_str(), when.c_str(), why.c_str());
}

OutageView Outage::view() const {
    OutageView v;
    v.errors = errors_.load(std::memory_order_relaxed);
    std::lock_guard<std::mutex> lk(mu_);
    v.up = !down_.load();
    v.outages = outages_;
    if (!v.up) {
        v.down_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
        v.since = utc_text(since_wall_);
        v.error = error_;
    }
    return v;
}

void Outage::describe(nlohmann::json& j) const {
    OutageView v = view();
    j["reachable"] = v.up;
    j["store_errors"] = v.errors;
    j["store_outages"] = v.outages;
    if (!v.up) {
        j["unreachable_since"] = v.since;
        j["down_s"] = v.down_s;
        j["error"] = "metadata store at " + store_ + " unreachable since " + v.since + " (" +
                     seconds_tenths(v.down_s) + " s): " + v.error;
        j["health"] = health_text();
    }
}

std::string Outage::health_text() const {
    OutageView v = view();
    return "degraded: metadata store at " + store_ + " unreachable since " + v.since + " (" +
           seconds_tenths(v.down_s) + " s): " + v.error;
}

Status Outage::unreachable_status() const {
    OutageView v = view();
    return Status(DYAD_RC_CONNFAIL,
                  "the metadata store at " + store_ + kMark + v.since + " (" +
                      seconds_tenths(v.down_s) + " s): " + v.error,
                  EHOSTUNREACH);
}

bool Outage::unreachable(const Status& s) {
    return s.rc() == DYAD_RC_CONNFAIL && s.err() == EHOSTUNREACH &&
           s.message().find("the metadata store at ") != std::string::npos &&
           s.message().find(kMark) != std::string::npos;
}

}  // namespace dyad::kvs
