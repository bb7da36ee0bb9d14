// SPDX-License-Identifier: Apache-2.0
#include "remote_store.hpp"

#include "common/log.hpp"

namespace dyad::kvs {
namespace {
constexpr const char* kSub = "dyadd";
// A failed call's message without the "metadata store: " RpcStore puts first.
std::string m_of(const Status& s) {
    std::string m = s.message();
    if (m.rfind("metadata store: ", 0) == 0) m.erase(0, 16);
    return m;
}
}  // namespace

RemoteStore::RemoteStore(std::string uri, std::string id, rpc::Credentials credentials,
                         Rejoin rejoin)
    : uri_(std::move(uri)),
      id_(std::move(id)),
      rpc_(uri_, std::make_shared<rpc::ConnectionPool>(std::move(credentials))),
      rejoin_(std::move(rejoin)) {}

RemoteStore::~RemoteStore() {
    close();
}

void RemoteStore::close() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (rejoiner_.joinable()) rejoiner_.join();
}

Result<Entry> RemoteStore::register_service(const std::string& id, const std::string& value,
                                            Deadline d) {
    auto v = rpc_.put(kServicesNamespace, id, value, d);
    if (!v) {
        // The hint fits the cause: an answer refused for the key already
        // says the key files differ.
        const int rc = v.status().rc();
        const bool unreachable = rc == DYAD_RC_CONNFAIL || rc == DYAD_RC_TIMEOUT;
        return Status(v.status())
            .wrap("cannot register in the metadata store at " + uri_ +
                  (unreachable ? " (is the dyadd hosting it running?)" : ""));
    }
    answered();
    // As registered, with the rank the store gave (as sent if it does not say).
    auto e = rpc_.get(kServicesNamespace, id, d);
    if (e) return e;
    return Entry{value, v.value(), id};
}

Result<uint64_t> RemoteStore::put(const std::string& ns, const std::string& key,
                                  const std::string& value, const std::string&, uint64_t replaces,
                                  Deadline d) {
    auto v = rpc_.put(ns, key, value, d, replaces);
    if (v || v.status().rc() == DYAD_RC_NOTFOUND) answered();
    return v;
}

Status RemoteStore::remove(const std::string& ns, const std::string& key, const std::string&,
                           Deadline d) {
    Status s = rpc_.remove(ns, key, d);
    if (s || s.rc() == DYAD_RC_NOTFOUND || s.rc() == DYAD_RC_NOAUTH) answered();
    return s;
}

Result<Entry> RemoteStore::get(const std::string& ns, const std::string& key, Deadline d) {
    auto e = rpc_.get(ns, key, d);
    if (e || e.status().rc() == DYAD_RC_NOTFOUND) answered();
    return e;
}

uint64_t RemoteStore::wait(const std::string& ns, const std::string& key, Deadline d, Done done) {
    done(rpc_.wait(ns, key, d));
    return 0;
}

Result<Page> RemoteStore::list(const std::string& ns, const std::string& prefix,
                               const std::string& after, uint64_t limit, Deadline d) {
    return rpc_.list_page(ns, prefix, after, limit, d);
}

void RemoteStore::start() {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return;
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    if (!rejoiner_.joinable()) rejoiner_ = std::thread([this] { rejoin_loop(); });
}

void RemoteStore::answered() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        last_ok_ = std::chrono::steady_clock::now();
    }
    outage_.answered();
}

void RemoteStore::check(std::function<void(bool, std::string)> done) {
    std::unique_lock<std::mutex> lk(mu_);
    if (stop_) return;
    auto now = std::chrono::steady_clock::now();
    bool ok_newer = last_ok_ && (!last_fail_ || *last_ok_ >= *last_fail_);
    if (ok_newer && now - *last_ok_ < kFresh) {
        lk.unlock();
        return done(true, "");
    }
    if (!ok_newer && last_fail_ && now - *last_fail_ < kFresh) {
        std::string why = outage_.up() ? error_ : outage_.health_text();
        lk.unlock();
        return done(false, why);
    }
    waiting_.push_back(std::move(done));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    cv_.notify_all();
}

nlohmann::json RemoteStore::status() const {
    std::lock_guard<std::mutex> lk(mu_);
    nlohmann::json j = nlohmann::json::object();
    auto now = std::chrono::steady_clock::now();
    if (last_ok_)
        j["last_contact_s"] = std::chrono::duration<double>(now - *last_ok_).count();
    else
        j["last_contact_s"] = nullptr;
    if (last_fail_ && (!last_ok_ || *last_fail_ > *last_ok_)) j["error"] = error_;
    j["rejoined"] = rejoins_;
    j["rejoining"] = rejoining_ || lost_;
    j["backend"] = "remote embedded";
    j["endpoint"] = uri_;
    j["republished"] = republished_;
    auto v = outage_.view();
    j["store_errors"] = v.errors;
    j["store_outages"] = v.outages;
    if (!v.up) {
        j["unreachable_since"] = v.since;
        j["down_s"] = v.down_s;
    }
    return j;
}

void RemoteStore::run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait_for(lk, kKeepEvery, [this] { return stop_ || !waiting_.empty(); });
        if (stop_) return;
        lk.unlock();
        auto e = rpc_.get(kServicesNamespace, id_, Deadline::after(kProbeTimeout));
        bool gone = !e && e.status().rc() == DYAD_RC_NOTFOUND;
        bool ok = e || gone;
        std::string why;  // "degraded: metadata store at URI unreachable since ..."
        if (ok) {
            outage_.answered();
        } else {
            outage_.failed(m_of(e.status()));
            why = outage_.health_text();
        }
        lk.lock();
        auto now = std::chrono::steady_clock::now();
        if (ok) {
            last_ok_ = now;
        } else {
            last_fail_ = now;
            error_ = why;
        }
        if (gone && !rejoining_ && !lost_) {
            lost_ = true;
            cv_.notify_all();
        }
        auto waiting = std::move(waiting_);
        waiting_.clear();
        lk.unlock();
        for (auto& d : waiting) d(ok, why);
        lk.lock();
    }
}

void RemoteStore::rejoin_loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk, [this] { return stop_ || lost_; });
        if (stop_) return;
        lost_ = false;
        rejoining_ = true;
        lk.unlock();
        DYAD_WARN(kSub,
                  "the metadata store at %s no longer knows this service (its dyadd restarted?): "
                  "registering again and publishing again what this service published",
                  uri_.c_str());
        uint64_t again = 0;
        bool done = rejoin_(
            [this] {
                std::lock_guard<std::mutex> g(mu_);
                return stop_;
            },
            again);
        lk.lock();
        republished_ += again;
        rejoining_ = false;
        if (done) {
            ++rejoins_;
        } else if (!stop_) {
            cv_.wait_for(lk, kKeepEvery, [this] { return stop_; });
            lost_ = true;
        }
    }
}

}  // namespace dyad::kvs
