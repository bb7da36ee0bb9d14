// SPDX-License-Identifier: Apache-2.0
#include "store_watch.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include "common/log.hpp"
#include "kvs/record.hpp"
#include "common/json_text.hpp"

namespace dyad::service {
namespace {
constexpr const char* kSub = "dyadd";
}  // namespace

Service::StoreWatch::StoreWatch(kvs::RpcStore& store, std::string id, std::string uri,
                                Rejoin rejoin)
    : store_(store), id_(std::move(id)), uri_(std::move(uri)), rejoin_(std::move(rejoin)) {}

Service::StoreWatch::~StoreWatch() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (rejoiner_.joinable()) rejoiner_.join();
}

void Service::StoreWatch::start() {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return;
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    if (!rejoiner_.joinable()) rejoiner_ = std::thread([this] { rejoin_loop(); });
}

void Service::StoreWatch::answered() {
    std::lock_guard<std::mutex> lk(mu_);
    last_ok_ = std::chrono::steady_clock::now();
}

void Service::StoreWatch::check(Done done) {
    std::unique_lock<std::mutex> lk(mu_);
    if (stop_) return;
    auto now = std::chrono::steady_clock::now();
    bool ok_newer = last_ok_ && (!last_fail_ || *last_ok_ >= *last_fail_);
    if (ok_newer && now - *last_ok_ < kFresh) {
        lk.unlock();
        return done(true, "");
    }
    if (!ok_newer && last_fail_ && now - *last_fail_ < kFresh) {
        std::string why = error_;
        lk.unlock();
        return done(false, why);
    }
    waiting_.push_back(std::move(done));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    cv_.notify_all();
}

nlohmann::json Service::StoreWatch::view() const {
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
    return j;
}

void Service::StoreWatch::run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait_for(lk, kKeepEvery, [this] { return stop_ || !waiting_.empty(); });
        if (stop_) return;
        lk.unlock();
        auto e = store_.get(kServicesNamespace, id_, Deadline::after(kProbeTimeout));
        bool gone = !e && e.status().rc() == DYAD_RC_NOTFOUND;
        bool ok = e || gone;
        std::string why;
        if (!ok) {
            std::string m = e.status().message();
            if (m.rfind("metadata store: ", 0) == 0) m.erase(0, 16);
            why = "metadata store at " + uri_ + " does not answer: " + m;
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

void Service::StoreWatch::rejoin_loop() {
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
        bool done = rejoin_([this] {
            std::lock_guard<std::mutex> g(mu_);
            return stop_;
        });
        lk.lock();
        rejoining_ = false;
        if (done) {
            ++rejoins_;
        } else if (!stop_) {
            cv_.wait_for(lk, kKeepEvery, [this] { return stop_; });
            lost_ = true;
        }
    }
}

// ---- putting the service back into a store that lost it ----

kvs::Record Service::record_of(const std::string& up, const struct stat& sb) const {
    kvs::Record rec;
    rec.upath = up;
    rec.owner = id_;
    rec.node = opts_.node;
    rec.producer_dir = prod_dir_;
    rec.endpoints = endpoints_;
    rec.size = static_cast<uint64_t>(sb.st_size);
    rec.mtime_ns = static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000LL + sb.st_mtim.tv_nsec;
    rec.mode = sb.st_mode & 07777;
    rec.ino = static_cast<uint64_t>(sb.st_ino);
    rec.rank = rank_;
    return rec;
}

bool Service::rejoin(const std::function<bool()>& stopping) {
    auto v = remote_->put(kServicesNamespace, id_,
                          identity().dump(-1, ' ', false, kBadUtf8Replaced), Deadline::after(10));
    if (!v) {
        DYAD_WARN(kSub, "cannot register again in the metadata store at %s: %s (trying again)",
                  opts_.kvs_uri.c_str(), v.status().to_string().c_str());
        return false;
    }
    std::vector<std::pair<std::string, Published>> all;
    {
        std::lock_guard<std::mutex> lk(pub_mu_);
        all.reserve(published_.size());
        for (const auto& [up, pub] : published_)
            if (pub.generation != 0 && !pub.key.empty()) all.emplace_back(up, pub);
    }
    uint64_t again = 0, changed = 0, failed = 0;
    for (const auto& [up, pub] : all) {
        if (stopping()) return true;
        // One at a time with publishes: a publish of the same file while
        // this one is in flight would otherwise be overtaken by it.
        std::unique_lock<std::shared_mutex> gate(publish_gate_);
        {
            std::lock_guard<std::mutex> lk(pub_mu_);
            auto it = published_.find(up);
            if (it == published_.end() || it->second.generation != pub.generation) continue;
        }
        // Only a file still exactly as published (it would not be served
        // otherwise): its record as publish() would write it now.
        auto fd = open_served_file(up);
        struct stat sb;
        if (!fd || ::fstat(fd->get(), &sb) != 0 || static_cast<uint64_t>(sb.st_dev) != pub.dev ||
            static_cast<uint64_t>(sb.st_ino) != pub.ino ||
            static_cast<uint64_t>(sb.st_size) != pub.size ||
            static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000LL + sb.st_mtim.tv_nsec !=
                pub.mtime_ns ||
            (pub.ctime_ns != 0 &&
             static_cast<int64_t>(sb.st_ctim.tv_sec) * 1000000000LL + sb.st_ctim.tv_nsec !=
                 pub.ctime_ns)) {
            ++changed;
            continue;
        }
        auto rec = record_of(up, sb);
        auto put =
            remote_->put(pub.ns, pub.key, rec.to_json().dump(-1, ' ', false, kBadUtf8Replaced),
                         Deadline::after(30));
        if (!put) {
            ++failed;
            DYAD_WARN(kSub, "cannot publish '%s' again: %s", up.c_str(),
                      put.status().to_string().c_str());
            if (put.status().rc() == DYAD_RC_CONNFAIL) return false;  // gone again
            continue;
        }
        std::lock_guard<std::mutex> lk(pub_mu_);
        auto it = published_.find(up);
        if (it != published_.end() && it->second.generation == pub.generation)
            it->second.generation = put.value();
        ++again;
        republished_++;
    }
    DYAD_INFO(kSub,
              "registered again in the metadata store at %s; published again %llu files (%llu "
              "changed since, not published; %llu failed)",
              opts_.kvs_uri.c_str(), static_cast<unsigned long long>(again),
              static_cast<unsigned long long>(changed), static_cast<unsigned long long>(failed));
    return true;
}

}  // namespace dyad::service
