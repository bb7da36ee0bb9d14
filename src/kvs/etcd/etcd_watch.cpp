// SPDX-License-Identifier: Apache-2.0
#include "etcd_watch.hpp"

#include "common/log.hpp"

namespace dyad::kvs::etcd {
namespace {
const char* kSub = "etcd";
}

Watcher::Watcher(Client& c, Lookup lookup) : c_(c), lookup_(std::move(lookup)) {}

Watcher::~Watcher() {
    stop();
}

void Watcher::start() {
    reader_ = std::thread([this] { run(); });
    writer_ = std::thread([this] { write(); });
    sweeper_ = std::thread([this] { sweep(); });
    checker_ = std::thread([this] { check(); });
}

void Watcher::stop() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_ && !reader_.joinable()) return;
        stop_ = true;
        if (ctx_) ctx_->TryCancel();
    }
    cv_.notify_all();
    if (reader_.joinable()) reader_.join();
    if (writer_.joinable()) writer_.join();
    if (sweeper_.joinable()) sweeper_.join();
    if (checker_.joinable()) checker_.join();
}

uint64_t Watcher::add(const std::string& key, int64_t seen, Deadline d, Done done) {
    uint64_t id;
    {
        std::lock_guard<std::mutex> lk(mu_);
        id = next_waiter_++;
        waiters_[id] = Waiter{key, d, std::move(done)};
        auto it = keys_.find(key);
        if (it == keys_.end()) {
            // Records are never deleted, so a watcher of this key that
            // started later than seen + 1 misses nothing of ours: its own
            // lookup found no key either.
            KeyWatch w;
            w.watch_id = next_watch_++;
            w.start = seen + 1;
            by_id_[w.watch_id] = key;
            it = keys_.emplace(key, std::move(w)).first;
            creates_.push_back(key);
        }
        it->second.waiters.insert(id);
    }
    cv_.notify_all();
    return id;
}

void Watcher::cancel(uint64_t id) {
    int64_t wid = 0;
    bool sent = false;
    {
        std::lock_guard<std::mutex> lk(mu_);
        auto w = waiters_.find(id);
        if (w == waiters_.end()) return;
        auto k = keys_.find(w->second.key);
        waiters_.erase(w);
        if (k == keys_.end()) return;
        k->second.waiters.erase(id);
        if (!k->second.waiters.empty()) return;
        wid = k->second.watch_id;
        sent = k->second.sent;
        by_id_.erase(wid);
        keys_.erase(k);
    }
    if (sent) send_cancel(wid);
}

std::vector<Watcher::Done> Watcher::take(const std::string& key, int64_t* watch_id, bool* sent) {
    std::vector<Done> out;
    auto k = keys_.find(key);
    if (k == keys_.end()) return out;
    for (uint64_t id : k->second.waiters) {
        auto w = waiters_.find(id);
        if (w == waiters_.end()) continue;
        out.push_back(std::move(w->second.done));
        waiters_.erase(w);
    }
    *watch_id = k->second.watch_id;
    *sent = k->second.sent;
    by_id_.erase(k->second.watch_id);
    keys_.erase(k);
    return out;
}

void Watcher::send_cancel(int64_t watch_id) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!stream_) return;  // the next stream never hears of it
        cancels_.push_back(watch_id);
    }
    cv_.notify_all();
}

void Watcher::write() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk,
                 [this] { return stop_ || (stream_ && (!creates_.empty() || !cancels_.empty())); });
        if (stop_) return;
        pb::WatchRequest q;
        if (!cancels_.empty()) {
            q.mutable_cancel_request()->set_watch_id(cancels_.front());
            cancels_.pop_front();
        } else {
            std::string key = std::move(creates_.front());
            creates_.pop_front();
            auto it = keys_.find(key);
            if (it == keys_.end() || it->second.sent) continue;
            it->second.sent = true;
            auto* c = q.mutable_create_request();
            c->set_key(key);
            // From etcd's current revision (start_revision 0): a watcher
            // that starts at a revision etcd has passed is "unsynced", and
            // etcd sends it nothing, not even new puts, until its catch-up
            // pass (every 100 ms) has run. The revisions in between are
            // checked by a lookup instead (created()).
            c->set_watch_id(it->second.watch_id);
            // Only puts matter: records are never deleted.
            c->add_filters(pb::WatchCreateRequest::NODELETE);
        }
        Stream* s = stream_;
        writing_ = true;
        lk.unlock();
        bool ok = s->Write(q);
        lk.lock();
        writing_ = false;
        cv_.notify_all();
        // A broken stream: the reader opens the next one and queues every
        // watcher again.
        if (!ok) cv_.wait(lk, [this, s] { return stop_ || stream_ != s; });
    }
}

void Watcher::run() {
    double backoff = 0.1;
    for (;;) {
        grpc::ClientContext ctx;
        ctx.set_wait_for_ready(true);
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (stop_) return;
            ctx_ = &ctx;  // stop() cancels it, also while Watch() waits
        }
        // Opening the stream waits for etcd (wait_for_ready, no deadline):
        // never under mu_, which status(), add(), cancel() and the sweeper
        // take. (Opened under it, a status of the service waited for etcd
        // to come back, and its loop with it.)
        std::unique_ptr<Stream> stream = c_.watch().Watch(&ctx);
        {
            std::lock_guard<std::mutex> lk(mu_);
            stream_ = stream.get();
            cancels_.clear();
            creates_.clear();
            for (auto& [k, w] : keys_) {
                w.sent = false;
                creates_.push_back(k);
            }
        }
        cv_.notify_all();
        pb::WatchResponse a;
        bool any = false;
        while (stream->Read(&a)) {
            if (!any) {
                any = true;
                backoff = 0.1;
            }
            c_.answered();
            handle(a);
        }
        std::unique_lock<std::mutex> lk(mu_);
        stream_ = nullptr;
        cv_.notify_all();
        cv_.wait(lk, [this] { return !writing_; });
        lk.unlock();
        grpc::Status st = stream->Finish();
        lk.lock();
        ctx_ = nullptr;
        if (stop_) return;
        ++reconnects_;
        c_.failed("watch stream to etcd at " + c_.where() + " broke: " + st.error_message());
        DYAD_WARN(kSub, "watch stream to etcd at %s broke (%s); %zu waited keys resume on the next",
                  c_.where().c_str(), st.error_message().c_str(), keys_.size());
        cv_.wait_for(lk, std::chrono::duration<double>(backoff), [this] { return stop_; });
        backoff = std::min(backoff * 2, 1.0);
    }
}

void Watcher::handle(const pb::WatchResponse& a) {
    if (a.created() && !a.canceled()) return created(a.watch_id(), a.header().revision());
    if (a.canceled()) {
        std::string key;
        {
            std::lock_guard<std::mutex> lk(mu_);
            auto it = by_id_.find(a.watch_id());
            if (it == by_id_.end()) return;  // one we cancelled
            key = it->second;
        }
        if (a.compact_revision() > 0) {
            ++compacted_;
            renew(key);
            return;
        }
        int64_t wid = 0;
        bool sent = false;
        std::vector<Done> fail;
        {
            std::lock_guard<std::mutex> lk(mu_);
            fail = take(key, &wid, &sent);
        }
        Status why(
            DYAD_RC_BADRPC,
            "etcd at " + c_.where() + " cancelled the watch of '" + key + "': " +
                (a.cancel_reason().empty() ? std::string("no reason given") : a.cancel_reason()),
            EPROTO);
        for (auto& d : fail) d(why);
        return;
    }
    for (const auto& ev : a.events()) {
        if (ev.type() != pb::Event::PUT) continue;
        int64_t wid = 0;
        bool sent = false;
        std::vector<Done> fire;
        {
            std::lock_guard<std::mutex> lk(mu_);
            fire = take(ev.kv().key(), &wid, &sent);
            fired_ += fire.size();
        }
        if (fire.empty()) continue;
        // The waiters first, the watcher's cancel after: queued first, the
        // cancel woke the writer, which took this thread's CPU to send it
        // (and etcd's threads theirs to read it) before the waiters were
        // answered, ~0.25 ms of every wake (docs/design.md, "Wake at the
        // store's speed").
        Entry e{ev.kv().value(), static_cast<uint64_t>(ev.kv().mod_revision()), ""};
        for (auto& d : fire) d(e);
        if (sent) send_cancel(wid);
    }
}

void Watcher::created(int64_t watch_id, int64_t at) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        auto id = by_id_.find(watch_id);
        if (id == by_id_.end()) return;  // fired or cancelled meanwhile
        auto k = keys_.find(id->second);
        // Nothing was written since the lookup that missed the key: the
        // watcher misses nothing.
        // (No revision in the answer: looked up all the same.)
        if (k == keys_.end() || (at > 0 && at < k->second.start)) return;
        checks_.emplace_back(id->second, watch_id);
    }
    cv_.notify_all();
}

// Looks up each key whose watcher etcd created past the revision its
// waiters' lookup read: a put in between is found here (the watcher
// reports the later ones). Linearizable: the watch stream and this call
// may reach different members. On its own thread, so that the reader never
// waits for it.
void Watcher::check() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk, [this] { return stop_ || !checks_.empty(); });
        if (stop_) return;
        auto [key, wid] = std::move(checks_.front());
        checks_.pop_front();
        lk.unlock();
        auto now = lookup_(key);
        lk.lock();
        auto k = keys_.find(key);
        if (k == keys_.end() || k->second.watch_id != wid) continue;  // fired, cancelled, renewed
        ++checked_;
        if (!now) {
            // etcd did not answer: looked up again a little later (the
            // watcher meanwhile reports what comes after its creation).
            checks_.emplace_back(std::move(key), wid);
            cv_.wait_for(lk, std::chrono::milliseconds(100), [this] { return stop_; });
            continue;
        }
        if (!now->first) continue;
        int64_t id = 0;
        bool sent = false;
        std::vector<Done> fire = take(key, &id, &sent);
        fired_ += fire.size();
        lk.unlock();
        for (auto& d : fire) d(*now->first);
        if (sent) send_cancel(id);
        lk.lock();
    }
}

void Watcher::renew(const std::string& key) {
    // The revision asked for was compacted away: look again; a key put in the
    // meantime is there now.
    auto now = lookup_(key);
    int64_t wid = 0;
    bool sent = false;
    std::vector<Done> fire;
    {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = keys_.find(key);
        if (it == keys_.end()) return;
        if (now && now->first) {
            fire = take(key, &wid, &sent);
        } else {
            by_id_.erase(it->second.watch_id);
            it->second.watch_id = next_watch_++;
            it->second.start = now ? now->second + 1 : it->second.start;
            it->second.sent = false;
            by_id_[it->second.watch_id] = key;
            creates_.push_back(key);
        }
    }
    cv_.notify_all();
    for (auto& d : fire) d(*now->first);
}

void Watcher::sweep() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        lk.lock();
        std::vector<std::pair<std::string, Done>> late;
        std::vector<int64_t> cancels;
        for (auto it = waiters_.begin(); it != waiters_.end();) {
            if (!it->second.deadline.expired()) {
                ++it;
                continue;
            }
            auto k = keys_.find(it->second.key);
            if (k != keys_.end()) {
                k->second.waiters.erase(it->first);
                if (k->second.waiters.empty()) {
                    if (k->second.sent) cancels.push_back(k->second.watch_id);
                    by_id_.erase(k->second.watch_id);
                    keys_.erase(k);
                }
            }
            late.emplace_back(it->second.key, std::move(it->second.done));
            it = waiters_.erase(it);
        }
        expired_ += late.size();
        if (late.empty()) continue;
        lk.unlock();
        for (int64_t w : cancels) send_cancel(w);
        for (auto& [key, d] : late)
            d(Status(DYAD_RC_TIMEOUT, "no record of '" + key + "' appeared before the deadline",
                     ETIMEDOUT));
        lk.lock();
    }
}

uint64_t Watcher::waiters() const {
    std::lock_guard<std::mutex> lk(mu_);
    return waiters_.size();
}

nlohmann::json Watcher::status() const {
    std::lock_guard<std::mutex> lk(mu_);
    nlohmann::json j = {{"watched_keys", keys_.size()},
                        {"waiters", waiters_.size()},
                        {"watch_reconnects", reconnects_},
                        {"woken", fired_},
                        {"wait_timeouts", expired_},
                        {"watch_compacted", compacted_},
                        {"watch_stream_up", stream_ != nullptr}};
    j["watch_gap_lookups"] = checked_;  // keys written to while their watch was made
    return j;
}

}  // namespace dyad::kvs::etcd
