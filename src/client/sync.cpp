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

namespace dyad::client {
namespace {
constexpr double kPollFirst = 0.05;
constexpr double kPollMax = 1.0;
// How long one kvs.changes waits for a first new record (then the pass ends
// with nothing new; a stop is seen after it).
constexpr double kChangesWait = 0.5;
constexpr double kChangesTimeout = 30.0;
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

Status Client::sync(const SyncOptions& options, uint64_t* consumed) {
    if (cons_.empty())
        return Status(DYAD_RC_BADMANAGEDPATH, "no consumer directory (set DYAD_PATH_CONSUMER)",
                      EINVAL);
    std::map<std::string, uint64_t> done;  // upath -> generation consumed (or failed)
    uint64_t total = 0;
    Status first;
    double pause = kPollFirst;
    auto wanted = [&] { return options.count ? options.count - total : UINT64_MAX; };
    // The follow by changes: whether the store answers them, and the
    // revision the passes so far reached (0: list next).
    kvs::Store* kv = nullptr;
    std::string space;
    if (options.follow) {
        auto svc = service();
        if (!svc) return svc.status();
        auto st = store();
        if (!st) return st.status();
        kv = st.value();
        space = ns(svc.value());
    }
    bool by_changes = options.follow;
    uint64_t cursor = 0;
    auto keep = [&](const Record& r, std::vector<Record>& todo) {
        if (!under_prefix(r.upath, options.prefix)) return;
        auto it = done.find(r.upath);
        if (it == done.end() || it->second < r.generation) todo.push_back(r);
    };
    for (;;) {
        std::vector<Record> todo;
        bool waited = false;  // the pass waited for new records itself
        if (by_changes && cursor) {
            auto t0 = std::chrono::steady_clock::now();
            auto ch = kv->changes(space, cursor, kChangesWait, Deadline::after(kChangesTimeout));
            if (ch && !ch->compacted) {
                for (const auto& [k, e] : ch->entries) {
                    auto r = Record::from_json(e.value, e.version);
                    if (r) keep(r.value(), todo);
                }
                cursor = ch->next;
                // (An answer that came back at once with nothing is no wait.)
                waited =
                    !ch->entries.empty() || std::chrono::steady_clock::now() - t0 >=
                                                std::chrono::duration<double>(kChangesWait / 2);
            } else {
                // Compacted: list again from a new revision; failed: list
                // this pass (and ask for changes again after it).
                cursor = 0;
                if (!ch && ch.status().err() == ENOSYS) by_changes = false;
            }
        }
        if (!(by_changes && cursor)) {
            if (by_changes) {
                // The revision the listing starts from: every record put
                // after it comes with the changes after it.
                auto now = kv->changes(space, 0, 0, Deadline::after(kChangesTimeout));
                if (now && !now->compacted && now->next)
                    cursor = now->next;
                else if (!now && now.status().err() == ENOSYS)
                    by_changes = false;
            }
            // Page by page: only the records to consume are kept, not the
            // namespace.
            Status listed = list("", [&](const Record& r) {
                keep(r, todo);
                return true;
            });
            if (!listed) return listed;
        }
        std::sort(todo.begin(), todo.end(),
                  [](const Record& a, const Record& b) { return a.upath < b.upath; });
        if (options.follow && todo.size() > wanted()) todo.resize(wanted());
        if (!todo.empty()) {
            std::vector<std::string> paths;
            for (const auto& r : todo) paths.push_back(cons_.join(r.upath));
            ConsumeManyOptions o;
            o.window = options.window;
            o.done = [&](size_t i, const Status& s, const ConsumeReport& rep) {
                if (options.done) options.done(paths[i], s, rep);
            };
            auto res = consume_many(paths, o);
            for (size_t i = 0; i < todo.size(); ++i) {
                done[todo[i].upath] = todo[i].generation;
                if (res[i])
                    ++total;
                else if (first)
                    first = res[i];
            }
            pause = kPollFirst;
        } else {
            pause = std::min(kPollMax, pause * 2);
        }
        if (consumed) *consumed = total;
        if (!options.follow) return first;
        if (options.count && total >= options.count) return first;
        if (waited) {  // (the changes' own wait was the pause)
            if (options.stop && options.stop()) return first;
            continue;
        }
        // Sleep in short steps so that a stop request is seen soon.
        auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(pause);
        while (std::chrono::steady_clock::now() < until) {
            if (options.stop && options.stop()) return first;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (options.stop && options.stop()) return first;
    }
}

}  // namespace dyad::client
