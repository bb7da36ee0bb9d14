// SPDX-License-Identifier: Apache-2.0
// Client::sync: consume everything produced under a relative path prefix,
// as it appears.
//
// Keys are hashed (DYAD_KEY_DEPTH levels of bins before the path), so a path
// prefix is no key prefix: each pass lists the namespace through the Store
// interface (kvs.list; whether the store answers in one piece or in pages
// is the Store's business) and keeps the records whose path falls under the
// prefix, then consumes those not consumed yet at their generation with
// consume_many. With follow, passes repeat, every 50 ms while files keep
// appearing, backing off to 1 s when nothing new comes.
//
// Following a store with revisions (etcd), a pass after the first asks only
// for what was put since the last (kvs.changes: a watch of the namespace
// from the revision the previous pass reached, waiting up to kChangesWait
// for the first record), so its cost is that of the new records, not of the
// namespace. The first pass lists, after learning the revision it starts
// from; when the store says "compacted" (etcd no longer holds the changes
// after that revision) the follow lists again from a new revision. A store
// or service that does not answer kvs.changes (the embedded store, an older
// dyadd: ENOSYS) is listed on every pass, as before; so is a pass whose
// kvs.changes fails (a busy service: EBUSY).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <map>
#include <thread>

#include "client.hpp"
#include "timeouts.hpp"

namespace dyad::client {
namespace {
constexpr double kPollFirst = 0.05;
constexpr double kPollMax = 1.0;
// How long one kvs.changes waits for a first new record (then the pass ends
// with nothing new; a stop is seen after it).
constexpr double kChangesWait = 0.5;
}  // namespace

bool under_prefix(const std::string& upath, const std::string& prefix) {
    if (prefix.empty() || prefix == "." || prefix == "./") return true;
    std::string p = prefix;
    while (p.rfind("./", 0) == 0) p.erase(0, 2);
    if (!p.empty() && p.back() == '*')
        return upath.compare(0, p.size() - 1, p, 0, p.size() - 1) == 0;
    while (!p.empty() && p.back() == '/') p.pop_back();
    if (p.empty()) return true;
    if (upath.compare(0, p.size(), p) != 0) return false;
    return upath.size() == p.size() || upath[p.size()] == '/';
}

// One sync call: what it consumed, and where its follow is.
class Syncer {
  public:
    Syncer(Client& c, const SyncOptions& options) : c_(c), options_(options) {}
    Status run(uint64_t* consumed);

  private:
    // The records put since the cursor (a follow's pass after the first);
    // true if the pass waited for them itself.
    bool changes(std::vector<Record>& todo);
    // The whole namespace, page by page (learning the revision it starts
    // from first when following by changes).
    Status listing(std::vector<Record>& todo);
    void keep(const Record& r, std::vector<Record>& todo);
    // Consumes `todo` (sorted, within the count).
    void consume(std::vector<Record>& todo);
    // Sleeps `pause` in short steps; true if asked to stop meanwhile.
    bool pause(double pause) const;
    bool stopped() const { return options_.stop && options_.stop(); }

    Client& c_;
    const SyncOptions& options_;
    std::map<std::string, uint64_t> done_;  // upath -> generation consumed (or failed)
    uint64_t total_ = 0;
    Status first_;
    // The follow by changes: whether the store answers them, and the
    // revision the passes so far reached (0: list next).
    kvs::Store* kv_ = nullptr;
    std::string space_;
    bool by_changes_ = false;
    uint64_t cursor_ = 0;
};

Status Client::sync(const SyncOptions& options, uint64_t* consumed) {
    if (cons_.empty())
        return Status(DYAD_RC_BADMANAGEDPATH, "no consumer directory (set DYAD_PATH_CONSUMER)",
                      EINVAL);
    return Syncer(*this, options).run(consumed);
}

Status Syncer::run(uint64_t* consumed) {
    if (options_.follow) {
        auto svc = c_.link_.service();
        if (!svc) return svc.status();
        auto st = c_.link_.store();
        if (!st) return st.status();
        kv_ = st.value();
        space_ = c_.link_.ns(svc.value());
    }
    by_changes_ = options_.follow;
    double pause = kPollFirst;
    for (;;) {
        std::vector<Record> todo;
        bool waited = false;  // the pass waited for new records itself
        if (by_changes_ && cursor_) waited = changes(todo);
        if (!(by_changes_ && cursor_))
            if (Status listed = listing(todo); !listed) return listed;
        const bool found = !todo.empty();
        consume(todo);
        pause = found ? kPollFirst : std::min(kPollMax, pause * 2);
        if (consumed) *consumed = total_;
        if (!options_.follow) return first_;
        if (options_.count && total_ >= options_.count) return first_;
        if (waited) {  // (the changes' own wait was the pause)
            if (stopped()) return first_;
            continue;
        }
        if (this->pause(pause)) return first_;
    }
}

void Syncer::keep(const Record& r, std::vector<Record>& todo) {
    if (!under_prefix(r.upath, options_.prefix)) return;
    auto it = done_.find(r.upath);
    if (it == done_.end() || it->second < r.generation) todo.push_back(r);
}

bool Syncer::changes(std::vector<Record>& todo) {
    auto t0 = std::chrono::steady_clock::now();
    auto ch = kv_->changes(space_, cursor_, kChangesWait, Deadline::after(timeouts::kChanges));
    if (ch && !ch->compacted) {
        for (const auto& [k, e] : ch->entries) {
            auto r = Record::from_json(e.value, e.version);
            if (r) keep(r.value(), todo);
        }
        cursor_ = ch->next;
        // (An answer that came back at once with nothing is no wait.)
        return !ch->entries.empty() || std::chrono::steady_clock::now() - t0 >=
                                           std::chrono::duration<double>(kChangesWait / 2);
    }
    // Compacted: list again from a new revision; failed: list this pass
    // (and ask for changes again after it).
    cursor_ = 0;
    if (!ch && ch.status().err() == ENOSYS) by_changes_ = false;
    return false;
}

Status Syncer::listing(std::vector<Record>& todo) {
    if (by_changes_) {
        // The revision the listing starts from: every record put after it
        // comes with the changes after it.
        auto now = kv_->changes(space_, 0, 0, Deadline::after(timeouts::kChanges));
        if (now && !now->compacted && now->next)
            cursor_ = now->next;
        else if (!now && now.status().err() == ENOSYS)
            by_changes_ = false;
    }
    // Page by page: only the records to consume are kept, not the namespace.
    return c_.list("", [&](const Record& r) {
        keep(r, todo);
        return true;
    });
}

void Syncer::consume(std::vector<Record>& todo) {
    std::sort(todo.begin(), todo.end(),
              [](const Record& a, const Record& b) { return a.upath < b.upath; });
    const uint64_t wanted = options_.count ? options_.count - total_ : UINT64_MAX;
    if (options_.follow && todo.size() > wanted) todo.resize(wanted);
    if (todo.empty()) return;
    std::vector<std::string> paths;
    for (const auto& r : todo) paths.push_back(c_.consumer_dir().join(r.upath));
    ConsumeManyOptions o;
    o.window = options_.window;
    o.done = [&](size_t i, const Status& s, const ConsumeReport& rep) {
        if (options_.done) options_.done(paths[i], s, rep);
    };
    auto res = c_.consume_many(paths, o);
    for (size_t i = 0; i < todo.size(); ++i) {
        done_[todo[i].upath] = todo[i].generation;
        if (res[i])
            ++total_;
        else if (first_)
            first_ = res[i];
    }
}

bool Syncer::pause(double pause) const {
    // Sleep in short steps so that a stop request is seen soon.
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(pause);
    while (std::chrono::steady_clock::now() < until) {
        if (stopped()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return stopped();
}

}  // namespace dyad::client
