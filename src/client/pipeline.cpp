// SPDX-License-Identifier: Apache-2.0
// Client::consume_many: many files with several in flight.
//
// 1. Every path is checked and keyed; the files produced already are found
//    with batched lookups (kvs.get_many, up to kBatch keys a request), on
//    the calling thread while the workers fetch what the earlier batches
//    found (the first batch is small, so that fetching starts early).
// 2. A window of workers (a WorkQueue, work_queue.hpp) fetches the files
//    whose record is known, in any order, through the consume core
//    (consume.cpp: one lock, one staging file, checksum, atomic rename), so
//    a file is still whole and checked.
//    Connections come from the client's pool: fetches from one owner reuse
//    its idle connections instead of connecting per file. Small files that
//    travel over the stream go several of one owner in one request
//    (dyad.fetch_many, fetch_many.cpp).
// 3. The files not produced yet: up to half the window waits for them one by
//    one (the queue's idle work; wait-for-create, answered at the produce),
//    while the calling
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

#include "client.hpp"
#include "common/keygen.hpp"
#include "common/log.hpp"
#include "common/seconds.hpp"
#include "common/trace.hpp"
#include "kvs/get_many.hpp"
#include "timeouts.hpp"
#include "work_queue.hpp"

namespace dyad::client {
namespace {

constexpr size_t kBatch = 512;       // keys per kvs.get_many
constexpr size_t kFirstBatch = 64;   // ... in the first, which the workers wait for
constexpr double kPollFirst = 0.02;  // seconds between looks for missing files, at first
constexpr double kPollMax = 1.0;     // ... growing to this while nothing appears
constexpr size_t kMinBatch = 8;      // files of one dyad.fetch_many, at least when ready
constexpr size_t kBatchScan = 1024;  // ready files looked at for a batch's company

}  // namespace

// One consume_many call: its files, what is known of them, what is left.
// Under mu_: ready_, missing_, missing_count_, next_missing_, finished_
// (and the results, through finish).
class Pipeline {
  public:
    Pipeline(Client& c, const std::vector<std::string>& paths, const ConsumeManyOptions& options)
        : c_(c),
          paths_(paths),
          options_(options),
          n_(paths.size()),
          results_(n_),
          keys_(n_),
          upaths_(n_),
          records_(n_),
          missing_(n_, 0),
          t0_(std::chrono::steady_clock::now()),
          deadline_(c.wait_deadline()) {}

    std::vector<Status> run();

  private:
    void finish(size_t i, Status s, const ConsumeReport& rep);
    std::vector<size_t> keyed();  // 1: the paths that can be looked up, keyed
    void batch_lookup(const std::vector<size_t>& which, std::vector<size_t>* found);
    void first_lookups(const std::vector<size_t>& valid, WorkQueue& q);
    void poll_missing(WorkQueue& q);  // 3: the calling thread's part
    Status fetch_ready();             // a worker's job: the next ready file and its company
    WorkQueue::Job wait_missing();    // a worker's idle work: one missing file
    void consume_one(size_t i);
    unsigned window() const;

    Client& c_;
    const std::vector<std::string>& paths_;
    const ConsumeManyOptions& options_;
    const size_t n_;
    std::vector<Status> results_;
    std::vector<std::string> keys_, upaths_;
    std::vector<Record> records_;
    std::optional<ServiceInfo> svc_;
    std::string nspace_;
    kvs::Store* store_ = nullptr;  // the client's (it outlives the call)
    // Read by the workers, turned off by the calling thread's lookups.
    std::atomic<bool> batched_{false};
    std::mutex mu_;
    std::condition_variable all_done_;
    size_t finished_ = 0;
    std::deque<size_t> ready_;  // record known: to fetch
    std::vector<char> missing_;
    size_t missing_count_ = 0;
    size_t next_missing_ = 0;  // where workers look for a missing file to wait for
    const std::chrono::steady_clock::time_point t0_;
    const Deadline deadline_;
};

std::vector<Status> Client::consume_many(const std::vector<std::string>& paths,
                                         const ConsumeManyOptions& options) {
    if (paths.empty()) return {};
    return Pipeline(*this, paths, options).run();
}

std::vector<Status> Pipeline::run() {
    trace::Span sp("consume_many", "client");
    sp.arg("files", static_cast<uint64_t>(n_));
    std::vector<size_t> valid = keyed();
    if (valid.empty()) return std::move(results_);
    auto svc = c_.service();
    if (!svc) {
        for (size_t i : valid) finish(i, svc.status(), ConsumeReport());
        return std::move(results_);
    }
    svc_ = svc.value();
    nspace_ = c_.link_.ns(*svc_);
    auto st = c_.link_.store();
    store_ = st ? st.value() : nullptr;
    batched_ = store_ != nullptr;

    WorkQueue::Options o;
    o.workers = window();
    o.idle = [this] { return wait_missing(); };
    // Without batched lookups nothing else finds the missing files: every
    // worker may wait for one.
    o.idle_limit = [this, w = o.workers] { return batched_ ? std::max(1u, w / 2) : w; };
    WorkQueue q(o);
    first_lookups(valid, q);
    poll_missing(q);
    (void)q.finish();  // every file's outcome is in results_
    return std::move(results_);
}

unsigned Pipeline::window() const {
    const unsigned w = options_.window ? options_.window : c_.cfg_.consume_window;
    return std::max(1u, std::min<unsigned>(w, static_cast<unsigned>(std::min<size_t>(n_, 1024))));
}

void Pipeline::finish(size_t i, Status s, const ConsumeReport& rep) {
    std::lock_guard<std::mutex> lk(mu_);
    results_[i] = std::move(s);
    if (options_.done) {
        try {
            options_.done(i, results_[i], rep);
        } catch (...) {
            DYAD_WARN("client", "consume_many: the completion callback of '%s' threw",
                      paths_[i].c_str());
        }
    }
    // Only the calling thread waits for finishes, and only for the last:
    // waking it per file costs a switch each.
    if (++finished_ == n_) all_done_.notify_all();
}

std::vector<size_t> Pipeline::keyed() {
    // A path that cannot be consumed is said so by the same checks a
    // single lookup makes.
    std::vector<size_t> valid;
    valid.reserve(n_);
    for (size_t i = 0; i < n_; ++i) {
        std::optional<std::string> up;
        if (!c_.cons_.empty()) up = c_.consumer_upath(paths_[i]);
        if (up && normalize_upath(*up).is_ok()) {
            auto key = gen_path_key(*up, c_.cfg_.key_depth, c_.cfg_.key_bins);
            if (key) {
                keys_[i] = std::move(key.value());
                upaths_[i] = *up;
                valid.push_back(i);
                continue;
            }
        }
        auto r = c_.lookup(paths_[i], false, deadline_);
        finish(i,
               r ? Status(DYAD_RC_BADFIO, "'" + paths_[i] + "' cannot be consumed", EINVAL)
                 : r.status(),
               ConsumeReport());
    }
    return valid;
}

// Looks up `which` (indices) in batches. Found: their records (a record that
// is not the path's is that file's error, said by its single lookup). Turns
// batched_ off if the store does not answer kvs.get_many.
void Pipeline::batch_lookup(const std::vector<size_t>& which, std::vector<size_t>* found) {
    for (size_t at = 0; batched_ && at < which.size(); at += kBatch) {
        size_t end = std::min(which.size(), at + kBatch);
        std::vector<std::string> ks;
        for (size_t j = at; j < end; ++j) ks.push_back(keys_[which[j]]);
        trace::Span sp("lookup_many", "client");
        sp.arg("keys", static_cast<uint64_t>(ks.size()));
        auto got = store_->get_many(nspace_, ks, Deadline::after(timeouts::kLookupMany));
        sp.fail(got.status());
        if (!got) {
            // An older service (ENOSYS) or a store that is not a dyadd's:
            // every file is looked up on its own instead.
            DYAD_DEBUG("client", "batched lookups unavailable (%s): one lookup per file",
                       got.status().to_string().c_str());
            batched_ = false;
            return;
        }
        for (size_t j = at; j < end; ++j) {
            const auto& l = got.value()[j - at];
            if (l.state != kvs::Lookup::State::found) continue;
            auto r = Record::from_json(l.entry.value, l.entry.version);
            size_t i = which[j];
            if (!r || r->upath != upaths_[i]) continue;
            records_[i] = std::move(r.value());
            found->push_back(i);
        }
    }
}

// The first lookups, a batch at a time, each batch's files fetched by the
// workers while the next is looked up. The first batch is small so that
// the workers start early.
void Pipeline::first_lookups(const std::vector<size_t>& valid, WorkQueue& q) {
    std::vector<char> is_found(n_, 0);
    for (size_t at = 0, chunk = kFirstBatch; at < valid.size(); at += chunk, chunk = kBatch) {
        const size_t end = std::min(valid.size(), at + chunk);
        std::vector<size_t> which(valid.begin() + static_cast<std::ptrdiff_t>(at),
                                  valid.begin() + static_cast<std::ptrdiff_t>(end));
        std::vector<size_t> found;
        batch_lookup(which, &found);
        for (size_t i : found) is_found[i] = 1;
        {
            std::lock_guard<std::mutex> lk(mu_);
            for (size_t i : found) ready_.push_back(i);
            for (size_t i : which)
                if (!is_found[i]) {
                    missing_[i] = 1;
                    ++missing_count_;
                }
        }
        for (size_t k = 0; k < found.size(); ++k) q.push([this] { return fetch_ready(); });
        q.wake();
    }
}

// The calling thread looks for the missing files that appear, in batches,
// with a backoff while nothing does.
void Pipeline::poll_missing(WorkQueue& q) {
    double pause = kPollFirst;
    std::unique_lock<std::mutex> lk(mu_);
    while (finished_ < n_) {
        all_done_.wait_for(lk, std::chrono::duration<double>(pause));
        if (!batched_ || missing_count_ == 0 || finished_ >= n_) continue;
        // Past the deadline the workers look once at each and say TIMEOUT.
        if (deadline_.expired()) continue;
        std::vector<size_t> which;
        for (size_t i = 0; i < n_ && which.size() < 8 * kBatch; ++i)
            if (missing_[i]) which.push_back(i);
        lk.unlock();
        std::vector<size_t> found;
        batch_lookup(which, &found);
        lk.lock();
        size_t moved = 0;
        for (size_t i : found)
            if (missing_[i]) {  // not taken by a worker meanwhile
                missing_[i] = 0;
                --missing_count_;
                ready_.push_back(i);
                ++moved;
            }
        pause = moved ? kPollFirst : std::min(kPollMax, pause * 2);
        lk.unlock();
        for (size_t k = 0; k < moved; ++k) q.push([this] { return fetch_ready(); });
        lk.lock();
    }
}

void Pipeline::consume_one(size_t i) {
    ConsumeReport rep;
    rep.wait_s = seconds_since(t0_);
    Status s = c_.consume_record(paths_[i], std::move(records_[i]), &rep, deadline_);
    finish(i, std::move(s), rep);
}

// One job per ready file: it takes the oldest ready file (another job may
// have taken this one's in its batch: then nothing). Small files of the
// same owner go with it in one request (fetch_many.cpp): as many as leaves
// every worker some while many are ready, at most kFetchManyFiles.
Status Pipeline::fetch_ready() {
    std::unique_lock<std::mutex> lk(mu_);
    if (ready_.empty()) return Status::ok();
    const size_t i = ready_.front();
    ready_.pop_front();
    lk.unlock();
    auto ep = c_.fetcher_.batch_endpoint(records_[i], *svc_);
    if (!ep) {
        consume_one(i);
        return Status::ok();
    }
    lk.lock();
    const size_t want =
        std::min(dtl::kFetchManyFiles, std::max<size_t>(kMinBatch, (ready_.size() + 1) / window()));
    std::vector<size_t> batch{i};
    size_t scanned = 0;
    for (auto it = ready_.begin();
         it != ready_.end() && batch.size() < want && scanned < kBatchScan; ++scanned) {
        if (records_[*it].owner == records_[i].owner &&
            c_.fetcher_.batch_endpoint(records_[*it], *svc_) == ep) {
            batch.push_back(*it);
            it = ready_.erase(it);
        } else {
            ++it;
        }
    }
    lk.unlock();
    auto done = [this](size_t j, Status s, const ConsumeReport& rep) {
        finish(j, std::move(s), rep);
    };
    for (size_t j : c_.fetcher_.consume_batch(batch, upaths_, records_, *svc_, *ep, done, t0_))
        consume_one(j);
    return Status::ok();
}

// Idle work: a missing file to wait for (wait-for-create, answered at the
// produce), one at a time per worker, round the list.
WorkQueue::Job Pipeline::wait_missing() {
    std::lock_guard<std::mutex> lk(mu_);
    if (missing_count_ == 0) return nullptr;
    while (!missing_[next_missing_]) next_missing_ = (next_missing_ + 1) % n_;
    const size_t i = next_missing_;
    missing_[i] = 0;
    --missing_count_;
    return [this, i] {
        ConsumeReport rep;
        auto rec = c_.lookup(paths_[i], true, deadline_);
        rep.wait_s = seconds_since(t0_);
        Status s = rec ? c_.consume_record(paths_[i], std::move(rec.value()), &rep, deadline_)
                       : rec.status();
        finish(i, std::move(s), rep);
        return Status::ok();
    };
}

}  // namespace dyad::client
