// SPDX-License-Identifier: Apache-2.0
// Client::consume_many: many files with several in flight.
//
// 1. Every path is checked and keyed; the files produced already are found
//    with batched lookups (kvs.get_many, up to kBatch keys a request), on
//    the calling thread while the workers fetch what the earlier batches
//    found (the first batch is small, so that fetching starts early).
// 2. A window of workers fetches the files whose record is known, in any
//    order; each fetch is an ordinary consume_with (one lock, one staging
//    file, checksum, atomic rename), so a file is still whole and checked.
//    Connections come from the client's pool: fetches from one owner reuse
//    its idle connections instead of connecting per file. Small files that
//    travel over the stream go several of one owner in one request
//    (dyad.fetch_many, fetch_many.cpp).
// 3. The files not produced yet: up to half the window waits for them one by
//    one (wait-for-create, answered at the produce), while the calling
//    thread looks the rest up in batches with a backoff, so that a file that
//    appears is fetched without waiting for a worker to be free of a file
//    that never comes. Every file waits until the same deadline
//    (DYAD_WAIT_TIMEOUT from the start of the call).
// docs/design.md, "Pipelined consume", says why it is built this way.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "client.hpp"
#include "common/keygen.hpp"
#include "common/log.hpp"
#include "kvs/get_many.hpp"

namespace dyad::client {
namespace {

constexpr size_t kBatch = 512;           // keys per kvs.get_many
constexpr size_t kFirstBatch = 64;       // ... in the first, which the workers wait for
constexpr double kPollFirst = 0.02;      // seconds between looks for missing files, at first
constexpr double kPollMax = 1.0;         // ... growing to this while nothing appears
constexpr double kLookupTimeout = 30.0;  // one kvs.get_many
constexpr size_t kMinBatch = 8;          // files of one dyad.fetch_many, at least when ready
constexpr size_t kBatchScan = 1024;      // ready files looked at for a batch's company

double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::vector<Status> Client::consume_many(const std::vector<std::string>& paths,
                                         const ConsumeManyOptions& options) {
    const size_t n = paths.size();
    std::vector<Status> results(n);
    if (n == 0) return results;
    const auto t0 = std::chrono::steady_clock::now();
    const Deadline deadline = wait_deadline();

    std::mutex m;
    std::condition_variable cv;
    size_t finished = 0;
    auto finish = [&](size_t i, Status s, const ConsumeReport& rep) {
        std::lock_guard<std::mutex> lk(m);
        results[i] = std::move(s);
        if (options.done) {
            try {
                options.done(i, results[i], rep);
            } catch (...) {
                DYAD_WARN("client", "consume_many: the completion callback of '%s' threw",
                          paths[i].c_str());
            }
        }
        // Only the calling thread waits for finishes, and only for the
        // last: waking it (and idle workers) per file costs a switch each.
        if (++finished == n) cv.notify_all();
    };

    // 1. Paths and keys. A path that cannot be consumed is said so by the
    // same checks a single lookup makes.
    std::vector<std::string> keys(n), upaths(n);
    std::vector<size_t> valid;
    valid.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        std::optional<std::string> up;
        if (!cons_.empty()) up = consumer_upath(paths[i]);
        bool ok = up && normalize_upath(*up).is_ok();
        if (ok) {
            auto key = gen_path_key(*up, cfg_.key_depth, cfg_.key_bins);
            if (key) {
                keys[i] = std::move(key.value());
                upaths[i] = *up;
                valid.push_back(i);
                continue;
            }
        }
        auto r = lookup(paths[i], false, deadline);
        finish(i,
               r ? Status(DYAD_RC_BADFIO, "'" + paths[i] + "' cannot be consumed", EINVAL)
                 : r.status(),
               ConsumeReport());
    }
    if (valid.empty()) return results;
    auto svc = service();
    if (!svc) {
        for (size_t i : valid) finish(i, svc.status(), ConsumeReport());
        return results;
    }
    const std::string nspace = ns(svc.value());
    const std::string uri = store_uri(svc.value());
    auto st = store();
    // Read by the workers, turned off by the calling thread's lookups.
    std::atomic<bool> batched{st && dynamic_cast<kvs::RpcStore*>(st.value()) != nullptr};

    // Looks up `which` (indices) in batches. Found: their records, as
    // (index, record); a record that is not the path's is that file's
    // error. Turns `batched` off if the store does not answer kvs.get_many.
    std::vector<Record> records(n);
    auto batch_lookup = [&](const std::vector<size_t>& which, std::vector<size_t>* found) {
        for (size_t at = 0; batched && at < which.size(); at += kBatch) {
            size_t end = std::min(which.size(), at + kBatch);
            std::vector<std::string> ks;
            for (size_t j = at; j < end; ++j) ks.push_back(keys[which[j]]);
            auto got = kvs::get_many(*pool_, uri, nspace, ks, Deadline::after(kLookupTimeout));
            if (!got) {
                // An older service (ENOSYS) or a store that is not a
                // dyadd's: every file is looked up on its own instead.
                DYAD_DEBUG("client", "batched lookups unavailable (%s): one lookup per file",
                           got.status().to_string().c_str());
                batched = false;
                return;
            }
            for (size_t j = at; j < end; ++j) {
                const auto& l = got.value()[j - at];
                if (l.state != kvs::Lookup::State::found) continue;
                auto r = Record::from_json(l.entry.value, l.entry.version);
                size_t i = which[j];
                // Another file's record under this key: the single lookup
                // of this file says what is wrong.
                if (!r || r->upath != upaths[i]) continue;
                records[i] = std::move(r.value());
                found->push_back(i);
            }
        }
    };

    std::deque<size_t> ready;  // record known: to fetch
    std::vector<char> missing(n, 0);
    size_t missing_count = 0;
    // The first lookups are still going: workers that run out of files wait
    // for more instead of ending.
    bool looking = true;
    const unsigned window =
        std::max(1u, std::min<unsigned>(options.window ? options.window : cfg_.consume_window,
                                        static_cast<unsigned>(std::min<size_t>(n, 1024))));
    // Without batched lookups nothing else finds the missing files: every
    // worker may wait for one.
    auto max_waiting = [&] { return batched ? std::max(1u, window / 2) : window; };
    unsigned waiting = 0;
    size_t next_missing = 0;  // where workers look for a missing file to wait for

    const ServiceInfo& here = svc.value();
    auto consume_one = [&](size_t i) {
        ConsumeReport rep;
        rep.wait_s = since(t0);
        Status s = consume_record(paths[i], std::move(records[i]), &rep, deadline);
        finish(i, std::move(s), rep);
    };
    auto worker = [&] {
        std::unique_lock<std::mutex> lk(m);
        for (;;) {
            if (!ready.empty()) {
                size_t i = ready.front();
                ready.pop_front();
                lk.unlock();
                auto ep = batch_endpoint(records[i], here);
                if (!ep) {
                    consume_one(i);
                    lk.lock();
                    continue;
                }
                // Small files of the same owner go with it in one request
                // (fetch_many.cpp): as many as leaves every worker some
                // while many are ready, at most kFetchManyFiles.
                lk.lock();
                const size_t want = std::min(
                    dtl::kFetchManyFiles, std::max<size_t>(kMinBatch, (ready.size() + 1) / window));
                std::vector<size_t> batch{i};
                size_t scanned = 0;
                for (auto it = ready.begin();
                     it != ready.end() && batch.size() < want && scanned < kBatchScan; ++scanned) {
                    if (records[*it].owner == records[i].owner &&
                        batch_endpoint(records[*it], here) == ep) {
                        batch.push_back(*it);
                        it = ready.erase(it);
                    } else {
                        ++it;
                    }
                }
                lk.unlock();
                for (size_t j : consume_batch(batch, upaths, records, here, *ep, finish, t0))
                    consume_one(j);
                lk.lock();
                continue;
            }
            if (missing_count > 0 && waiting < max_waiting()) {
                while (!missing[next_missing]) next_missing = (next_missing + 1) % n;
                size_t i = next_missing;
                missing[i] = 0;
                --missing_count;
                ++waiting;
                lk.unlock();
                ConsumeReport rep;
                auto rec = lookup(paths[i], true, deadline);
                rep.wait_s = since(t0);
                Status s = rec ? consume_record(paths[i], std::move(rec.value()), &rep, deadline)
                               : rec.status();
                finish(i, std::move(s), rep);
                lk.lock();
                --waiting;
                cv.notify_all();
                continue;
            }
            if (!looking && ready.empty() && missing_count == 0) return;
            cv.wait(lk);
        }
    };
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < window; ++w) workers.emplace_back(worker);

    // The first lookups, a batch at a time, each batch's files fetched by
    // the workers while the next is looked up. The first batch is small so
    // that the workers start early.
    std::vector<char> is_found(n, 0);
    for (size_t at = 0, chunk = kFirstBatch; at < valid.size(); at += chunk, chunk = kBatch) {
        const size_t end = std::min(valid.size(), at + chunk);
        std::vector<size_t> which(valid.begin() + static_cast<std::ptrdiff_t>(at),
                                  valid.begin() + static_cast<std::ptrdiff_t>(end));
        std::vector<size_t> found;
        batch_lookup(which, &found);
        for (size_t i : found) is_found[i] = 1;
        std::lock_guard<std::mutex> lk(m);
        for (size_t i : found) ready.push_back(i);
        for (size_t i : which)
            if (!is_found[i]) {
                missing[i] = 1;
                ++missing_count;
            }
        cv.notify_all();
    }

    // 3. The calling thread looks for the missing files that appear.
    double pause = kPollFirst;
    std::unique_lock<std::mutex> lk(m);
    looking = false;
    cv.notify_all();
    while (finished < n) {
        cv.wait_for(lk, std::chrono::duration<double>(pause));
        if (!batched || missing_count == 0 || finished >= n) continue;
        // Past the deadline the workers look once at each and say TIMEOUT.
        if (deadline.expired()) continue;
        std::vector<size_t> which;
        for (size_t i = 0; i < n && which.size() < 8 * kBatch; ++i)
            if (missing[i]) which.push_back(i);
        lk.unlock();
        std::vector<size_t> found;
        batch_lookup(which, &found);
        lk.lock();
        size_t moved = 0;
        for (size_t i : found)
            if (missing[i]) {  // not taken by a worker meanwhile
                missing[i] = 0;
                --missing_count;
                ready.push_back(i);
                ++moved;
            }
        if (moved) {
            cv.notify_all();
            pause = kPollFirst;
        } else {
            pause = std::min(kPollMax, pause * 2);
        }
    }
    lk.unlock();
    for (auto& t : workers) t.join();
    return results;
}

}  // namespace dyad::client
