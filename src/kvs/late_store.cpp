// SPDX-License-Identifier: Apache-2.0
#include "late_store.hpp"

#include <algorithm>
#include <cerrno>
#include <vector>

#include "common/seconds.hpp"

namespace dyad::kvs {
namespace {
// Ids of held waits (the store's own are small counters).
constexpr uint64_t kHeldBit = 1ull << 63;

Status timed_out(const std::string& ns, const std::string& key) {
    return Status(DYAD_RC_TIMEOUT,
                  "no record '" + key + "' in namespace '" + ns + "' before the deadline",
                  ETIMEDOUT);
}
}  // namespace

struct LateStore::Held {
    std::string ns, key;
    Deadline d;
    Done done;
    bool cancelled = false;  // (under Shared::mu)
    uint64_t real = 0;       // the store's id, once forwarded
};

struct LateStore::Shared {
    std::mutex mu;
    bool closing = false;
    std::optional<Status> failed;
    std::string why = "not reached yet";
    uint64_t next = 1;
    std::map<uint64_t, std::shared_ptr<Held>> held;       // waiting for the store
    std::map<uint64_t, std::shared_ptr<Held>> forwarded;  // held, then given to it
};

LateStore::LateStore(std::string backend, std::string endpoint, std::string uri)
    : backend_(std::move(backend)),
      endpoint_(std::move(endpoint)),
      uri_(std::move(uri)),
      s_(std::make_shared<Shared>()) {
    expiry_ = std::thread([this] { expire_held(); });
}

LateStore::~LateStore() {
    close();
}

double LateStore::starting_seconds() const {
    return std::chrono::duration<double>(Clock::now() - since_).count();
}

void LateStore::note(const std::string& why) {
    std::lock_guard<std::mutex> lk(s_->mu);
    s_->why = why;
}

std::string LateStore::starting_text() const {
    std::string why;
    {
        std::lock_guard<std::mutex> lk(s_->mu);
        why = s_->why;
    }
    return "starting: the service has been reaching its metadata store (" + backend_ + " at " +
           endpoint_ + ") for " + seconds_tenths(starting_seconds()) + " s (" + why +
           "); publishes and lookups wait for it";
}

Status LateStore::starting_status() const {
    // The marks of Outage::unreachable_status, so that clients ask again.
    return Status(DYAD_RC_CONNFAIL,
                  "the metadata store at " + uri_ + " is unreachable since " +
                      utc_text(since_wall_) + " (" + seconds_tenths(starting_seconds()) +
                      " s): " + starting_text(),
                  EHOSTUNREACH);
}

Result<ServiceStore*> LateStore::ready(Deadline d) const {
    if (ServiceStore* s = live()) return s;
    std::unique_lock<std::mutex> lk(s_->mu);
    for (;;) {
        if (ServiceStore* s = live()) return s;
        if (s_->failed) return *s_->failed;
        if (s_->closing || d.expired()) break;
        cv_.wait_for(lk, std::chrono::duration<double>(std::min(d.remaining(), 1.0)));
    }
    lk.unlock();
    return starting_status();
}

void LateStore::attach(std::shared_ptr<ServiceStore> store) {
    std::map<uint64_t, std::shared_ptr<Held>> held;
    {
        std::lock_guard<std::mutex> lk(s_->mu);
        if (store_ || s_->failed) return;
        store_ = std::move(store);
        attached_after_ = starting_seconds();
        held.swap(s_->held);
        for (const auto& [id, h] : held) s_->forwarded[id] = h;
        live_.store(store_.get(), std::memory_order_release);
    }
    cv_.notify_all();
    for (const auto& [id, h] : held) forward(id, h);
}

// A held wait, given to the store now: its answer reaches the caller
// unless it was cancelled meanwhile.
void LateStore::forward(uint64_t id, const std::shared_ptr<Held>& h) {
    std::weak_ptr<Shared> weak = s_;
    auto answer = [weak, id, h](Result<Entry> e) {
        if (auto s = weak.lock()) {
            std::lock_guard<std::mutex> lk(s->mu);
            if (h->cancelled) return;
            s->forwarded.erase(id);
        }
        h->done(std::move(e));
    };
    if (h->d.expired()) return answer(timed_out(h->ns, h->key));
    const uint64_t real = store_->wait(h->ns, h->key, h->d, answer);
    bool cancelled = false;
    {
        std::lock_guard<std::mutex> lk(s_->mu);
        h->real = real;
        cancelled = h->cancelled;
    }
    if (cancelled && real) store_->cancel(real);
}

void LateStore::fail(const Status& why) {
    std::map<uint64_t, std::shared_ptr<Held>> held;
    {
        std::lock_guard<std::mutex> lk(s_->mu);
        if (store_ || s_->failed) return;
        s_->failed = why;
        held.swap(s_->held);
    }
    cv_.notify_all();
    for (const auto& [id, h] : held) h->done(why);
}

void LateStore::expire_held() {
    std::unique_lock<std::mutex> lk(s_->mu);
    while (!s_->closing && !live() && !s_->failed) {
        std::vector<std::shared_ptr<Held>> expired;
        double next = 1.0;
        for (auto it = s_->held.begin(); it != s_->held.end();) {
            if (it->second->d.expired()) {
                expired.push_back(it->second);
                it = s_->held.erase(it);
                continue;
            }
            next = std::min(next, it->second->d.remaining());
            ++it;
        }
        if (!expired.empty()) {
            lk.unlock();
            for (const auto& h : expired) h->done(timed_out(h->ns, h->key));
            lk.lock();
            continue;
        }
        cv_.wait_for(lk, std::chrono::duration<double>(next));
    }
}

void LateStore::stop_waiting() {
    {
        std::lock_guard<std::mutex> lk(s_->mu);
        s_->closing = true;
    }
    cv_.notify_all();
}

void LateStore::close() {
    stop_waiting();
    if (expiry_.joinable()) expiry_.join();
    if (ServiceStore* s = live()) s->close();
}

Result<Entry> LateStore::register_service(const std::string& id, const std::string& value,
                                          Deadline d) {
    auto s = ready(d);
    if (!s) return s.status();
    return s.value()->register_service(id, value, d);
}

Result<uint64_t> LateStore::put(const std::string& ns, const std::string& key,
                                const std::string& value, const std::string& writer,
                                uint64_t replaces, Deadline d) {
    auto s = ready(d);
    if (!s) return s.status();
    return s.value()->put(ns, key, value, writer, replaces, d);
}

Status LateStore::remove(const std::string& ns, const std::string& key, const std::string& writer,
                         Deadline d) {
    auto s = ready(d);
    if (!s) return s.status();
    return s.value()->remove(ns, key, writer, d);
}

Result<Entry> LateStore::get(const std::string& ns, const std::string& key, Deadline d) {
    auto s = ready(d);
    if (!s) return s.status();
    return s.value()->get(ns, key, d);
}

Result<std::vector<Lookup>> LateStore::get_many(const std::string& ns,
                                                const std::vector<std::string>& keys, size_t budget,
                                                Deadline d) {
    auto s = ready(d);
    if (!s) return s.status();
    return s.value()->get_many(ns, keys, budget, d);
}

Result<Page> LateStore::list(const std::string& ns, const std::string& prefix,
                             const std::string& after, uint64_t limit, Deadline d) {
    auto s = ready(d);
    if (!s) return s.status();
    return s.value()->list(ns, prefix, after, limit, d);
}

Result<Changes> LateStore::changes(const std::string& ns, uint64_t after, double wait, Deadline d) {
    auto s = ready(d);
    if (!s) return s.status();
    return s.value()->changes(ns, after, wait, d);
}

uint64_t LateStore::wait(const std::string& ns, const std::string& key, Deadline d, Done done) {
    if (ServiceStore* s = live()) return s->wait(ns, key, d, std::move(done));
    std::unique_lock<std::mutex> lk(s_->mu);
    if (!live() && !s_->failed && !s_->closing) {
        const uint64_t id = kHeldBit | s_->next++;
        s_->held[id] = std::make_shared<Held>(Held{ns, key, d, std::move(done)});
        lk.unlock();
        cv_.notify_all();  // (its deadline may be the next)
        return id;
    }
    std::optional<Status> failed = s_->failed;
    lk.unlock();
    if (ServiceStore* s = live()) return s->wait(ns, key, d, std::move(done));
    done(failed ? *failed : starting_status());
    return 0;
}

void LateStore::cancel(uint64_t id) {
    if (!(id & kHeldBit)) {
        if (ServiceStore* s = live(); s && id) s->cancel(id);
        return;
    }
    uint64_t real = 0;
    {
        std::lock_guard<std::mutex> lk(s_->mu);
        for (auto* m : {&s_->held, &s_->forwarded}) {
            auto it = m->find(id);
            if (it == m->end()) continue;
            it->second->cancelled = true;
            real = it->second->real;
            m->erase(it);
        }
    }
    if (real)
        if (ServiceStore* s = live()) s->cancel(real);
}

void LateStore::changes_refused() {
    if (ServiceStore* s = live()) s->changes_refused();
}

size_t LateStore::max_key() const {
    if (ServiceStore* s = live()) return s->max_key();
    return StoreLimits().max_key;
}

void LateStore::start() {
    if (ServiceStore* s = live()) s->start();
}

void LateStore::check(std::function<void(bool, std::string)> done) {
    if (ServiceStore* s = live()) return s->check(std::move(done));
    std::optional<Status> failed;
    {
        std::lock_guard<std::mutex> lk(s_->mu);
        failed = s_->failed;
    }
    done(false, failed ? failed->message() : starting_text());
}

std::optional<Status> LateStore::down() const {
    if (ServiceStore* s = live()) return s->down();
    {
        std::lock_guard<std::mutex> lk(s_->mu);
        if (s_->failed) return *s_->failed;
    }
    // A normal start: held (each up to its deadline); a long one: an outage.
    if (starting_seconds() < kHold) return std::nullopt;
    return starting_status();
}

std::optional<OutageView> LateStore::outage() const {
    if (ServiceStore* s = live()) return s->outage();
    OutageView v;
    v.up = false;
    v.down_s = starting_seconds();
    v.since = utc_text(since_wall_);
    v.error = starting_text();
    return v;
}

nlohmann::json LateStore::status() const {
    if (ServiceStore* s = live()) {
        nlohmann::json j = s->status();
        j["reached_after_s"] = attached_after_;
        return j;
    }
    std::optional<Status> failed;
    {
        std::lock_guard<std::mutex> lk(s_->mu);
        failed = s_->failed;
    }
    nlohmann::json j = nlohmann::json::object();
    j["backend"] = backend_;
    j["endpoint"] = endpoint_;
    j["uri"] = uri_;
    j["reachable"] = false;
    j["starting"] = !failed;
    j["starting_s"] = starting_seconds();
    j["error"] = failed ? failed->message() : starting_text();
    return j;
}

std::string LateStore::describe() const {
    return backend_ + " at " + endpoint_;
}

}  // namespace dyad::kvs
