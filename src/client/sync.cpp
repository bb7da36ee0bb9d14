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
#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "client.hpp"

namespace dyad::client {
namespace {
constexpr double kPollFirst = 0.05;
constexpr double kPollMax = 1.0;
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
    for (;;) {
        // Page by page: only the records to consume are kept, not the
        // namespace.
        std::vector<Record> todo;
        Status listed = list("", [&](const Record& r) {
            if (!under_prefix(r.upath, options.prefix)) return true;
            auto it = done.find(r.upath);
            if (it == done.end() || it->second < r.generation) todo.push_back(r);
            return true;
        });
        if (!listed) return listed;
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
