// SPDX-License-Identifier: Apache-2.0
// DYAD_ASYNC_PUBLISH's queue and its publishing thread (publish_queue.hpp).
#include "publish_queue.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <set>
#include <unordered_map>

#include "client.hpp"
#include "common/fd.hpp"
#include "common/log.hpp"
#include "common/seconds.hpp"
#include "common/settings.hpp"

namespace dyad::client {

namespace {
constexpr const char* kSub = "client";
// The files one pass of the thread takes at most (a file queued again
// within a pass is published once, as it is then).
constexpr size_t kBatch = 256;
// Failures kept for the next call to say by name; beyond them, counted.
constexpr size_t kKeptFailures = 64;
// Files an error names at most.
constexpr size_t kNamed = 3;

// "'a', 'b', 'c' and 4 more"
std::string name_files(const std::vector<std::string>& paths) {
    std::string out;
    for (size_t i = 0; i < paths.size() && i < kNamed; ++i)
        out += (i ? ", '" : "'") + paths[i] + "'";
    if (paths.size() > kNamed) out += " and " + std::to_string(paths.size() - kNamed) + " more";
    return out;
}

}  // namespace

// ---- fork() and exit: every live queue of the process ----

struct ForkHooks {
    static std::mutex& mu() {
        static std::mutex* m = new std::mutex();  // never destroyed: used at exit
        return *m;
    }
    static std::set<PublishQueue*>& live() {
        static auto* s = new std::set<PublishQueue*>();
        return *s;
    }
    static void prepare() {
        mu().lock();
        for (PublishQueue* q : live()) q->before_fork();
    }
    static void parent() {
        for (PublishQueue* q : live()) q->after_fork_parent();
        mu().unlock();
    }
    static void child() {
        new (&mu()) std::mutex();
        for (PublishQueue* q : live()) q->after_fork_child();
    }
    // At exit every queue is drained (within its timeout) and stopped, and
    // what it could not publish is said on stderr.
    static void at_exit() {
        std::vector<std::shared_ptr<PublishQueue>> qs;
        {
            std::lock_guard<std::mutex> lk(mu());
            for (PublishQueue* q : live())
                if (auto sp = q->weak_from_this().lock()) qs.push_back(std::move(sp));
        }
        for (auto& q : qs) {
            Status s = q->finish();
            if (!s) std::fprintf(stderr, "dyad: at exit: %s\n", s.message().c_str());
        }
    }
    static void add(PublishQueue* q) {
        static std::once_flag once;
        std::call_once(once, [] {
            pthread_atfork(&ForkHooks::prepare, &ForkHooks::parent, &ForkHooks::child);
            std::atexit(&ForkHooks::at_exit);
        });
        std::lock_guard<std::mutex> lk(mu());
        live().insert(q);
    }
    static void remove(PublishQueue* q) {
        std::lock_guard<std::mutex> lk(mu());
        live().erase(q);
    }
};

// ---- settings ----

Result<PublishQueue::Options> PublishQueue::Options::from_settings() {
    Options o;
    auto t = settings::seconds("DYAD_ASYNC_PUBLISH_TIMEOUT");
    if (!t) return t.status();
    if (t.value() && *t.value() < 0)
        return Status(DYAD_RC_NOCTX, "DYAD_ASYNC_PUBLISH_TIMEOUT must be >= 0 seconds", EINVAL);
    o.timeout_s = t.value().value_or(60);
    auto files = settings::count("DYAD_ASYNC_PUBLISH_MAX_FILES", 1, 1u << 24);
    if (!files) return files.status();
    o.max_files = files.value();
    auto bytes = settings::size("DYAD_ASYNC_PUBLISH_MAX_BYTES", 4096, 1ull << 34, "[4K, 16G]");
    if (!bytes) return bytes.status();
    o.max_bytes = bytes.value();
    return o;
}

// ---- the queue ----

PublishQueue::PublishQueue(std::shared_ptr<Client> client, Options options)
    : client_(std::move(client)), opt_(std::move(options)) {}

std::shared_ptr<PublishQueue> PublishQueue::create(std::shared_ptr<Client> client,
                                                   Options options) {
    std::shared_ptr<PublishQueue> q(new PublishQueue(std::move(client), std::move(options)));
    ForkHooks::add(q.get());
    return q;
}

PublishQueue::~PublishQueue() {
    ForkHooks::remove(this);
    // The thread holds a reference to the queue: it has ended by now,
    // or it was abandoned (detached) by finish() at its deadline.
    if (thread_.joinable()) thread_.detach();
}

void PublishQueue::start_locked() {
    if (started_) return;
    started_ = true;
    std::weak_ptr<PublishQueue> self = weak_from_this();
    thread_ = std::thread([self] {
        // Signals are the program's: none is delivered on this thread.
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, nullptr);
        if (auto q = self.lock()) {
            if (q->opt_.thread_init) q->opt_.thread_init();
            q->run();
        }
    });
}

Status PublishQueue::enqueue(const std::string& path) {
    std::unique_lock<std::mutex> lk(mu_);
    if (finished_)
        return Status(DYAD_RC_NOCTX,
                      "cannot queue '" + path +
                          "' for publishing: DYAD was finalized (its publish queue is closed)",
                      EINVAL);
    // Queued as its full path: the thread's working directory may differ
    // by the time it is sent (chdir), and it takes the lease by this name.
    const auto up = client_->producer_upath(path);
    const std::string full = up ? client_->producer_dir().join(*up) : path;
    const uint64_t c = cost(full);
    auto fits = [&] {
        return finished_ || queue_.empty() ||
               (queue_.size() < opt_.max_files && bytes_ + c <= opt_.max_bytes);
    };
    if (!fits()) {
        counters_.full_waits++;
        const Deadline until = Deadline::after(opt_.timeout_s);
        while (!fits() && !until.expired())
            room_cv_.wait_for(lk, std::chrono::duration<double>(until.remaining()));
        if (!fits())
            return Status(
                DYAD_RC_TIMEOUT,
                "cannot queue '" + path + "' for publishing: the queue (" +
                    std::to_string(queue_.size()) +
                    " files, DYAD_ASYNC_PUBLISH_MAX_FILES / _MAX_BYTES) stayed full for " +
                    seconds_text(opt_.timeout_s) +
                    " s (DYAD_ASYNC_PUBLISH_TIMEOUT): is the node's service answering? "
                    "The file is not published: produce it again",
                ETIMEDOUT);
        if (finished_)
            return Status(DYAD_RC_NOCTX,
                          "cannot queue '" + path + "' for publishing: DYAD was finalized", EINVAL);
    }
    queue_.push_back(Entry{full, next_seq_++});
    bytes_ += c;
    counters_.queued++;
    start_locked();
    work_cv_.notify_one();
    return Status::ok();
}

namespace {
// Refused because the file is open for writing again (the lease, or the
// synchronous produce's own check): retried until its writer closes it.
bool busy(const Status& s) {
    return s.rc() == DYAD_RC_BADFIO && s.err() == EBUSY;
}
}  // namespace

bool PublishQueue::requeued_locked(const std::string& path) const {
    for (const auto& e : queue_)
        if (e.path == path) return true;
    return false;
}

void PublishQueue::settle_locked(const std::string& path, const Status& result, Deadline until) {
    if (result) {
        counters_.published++;
    } else if (!busy(result)) {
        note_failure_locked(path, result);
    } else if (requeued_locked(path)) {
        counters_.coalesced++;  // its writer closed it and queued it again: that one goes
    } else if (until.expired()) {
        note_failure_locked(path, result);
    } else {
        busy_.push_back(Busy{path, until});
    }
}

void PublishQueue::retry_busy(std::unique_lock<std::mutex>& lk) {
    std::vector<Busy> again;
    again.swap(busy_);
    for (auto& b : again) {
        if (requeued_locked(b.path)) {
            counters_.coalesced++;
            continue;
        }
        lk.unlock();
        Status s = publish_one(b.path);
        lk.lock();
        settle_locked(b.path, s, b.until);
    }
    done_cv_.notify_all();
}

void PublishQueue::run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        auto ready = [&] { return stop_ || !queue_.empty(); };
        if (busy_.empty())
            work_cv_.wait(lk, ready);
        else
            work_cv_.wait_for(lk, std::chrono::milliseconds(20), ready);
        if (!busy_.empty()) retry_busy(lk);
        if (queue_.empty() && busy_.empty() && stop_) return;  // stopped, nothing left
        if (queue_.empty()) continue;
        // Everything pending (up to kBatch), in order; a file queued more
        // than once is published once, at its last place.
        std::vector<Entry> batch;
        while (!queue_.empty() && batch.size() < kBatch) {
            bytes_ -= cost(queue_.front().path);
            batch.push_back(std::move(queue_.front()));
            queue_.pop_front();
        }
        const uint64_t last = batch.back().seq;
        std::unordered_map<std::string, size_t> final_place;
        for (size_t i = 0; i < batch.size(); ++i) final_place[batch[i].path] = i;
        in_flight_.clear();
        for (size_t i = 0; i < batch.size(); ++i)
            if (final_place[batch[i].path] == i) in_flight_.push_back(batch[i].path);
        counters_.coalesced += batch.size() - in_flight_.size();
        counters_.batches++;
        room_cv_.notify_all();
        const std::vector<std::string> send = in_flight_;
        lk.unlock();
        std::vector<Status> results;
        results.reserve(send.size());
        for (const auto& p : send) results.push_back(publish_one(p));
        lk.lock();
        const Deadline until = Deadline::after(opt_.timeout_s);
        for (size_t i = 0; i < send.size(); ++i) settle_locked(send[i], results[i], until);
        in_flight_.clear();
        if (last > done_seq_) done_seq_ = last;
        done_cv_.notify_all();
    }
}

Status PublishQueue::publish_one(const std::string& path) {
    // The read lease: a writer opening the file while its publish is in
    // flight waits (the kernel holds its open) until the lease is released
    // after the answer, up to /proc/sys/fs/lease-break-time. Where leases
    // cannot be had (not the file's owner, a file system without them) the
    // file is published as it is when the service looks at it.
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    bool leased = false;
    if (fd.valid() && ::fcntl(fd.get(), F_SETSIG, SIGURG) == 0) {
        if (::fcntl(fd.get(), F_SETLEASE, F_RDLCK) == 0)
            leased = true;
        else if (errno == EAGAIN || errno == EBUSY)
            return Status(
                DYAD_RC_BADFIO,
                "cannot publish '" + path +
                    "': it was open for writing again when its queued publish was sent "
                    "(DYAD_ASYNC_PUBLISH); produce it again once its writer has closed it",
                EBUSY);
    }
    Status s = client_->produce(path);
    if (leased) ::fcntl(fd.get(), F_SETLEASE, F_UNLCK);
    return s;
}

void PublishQueue::note_failure_locked(const std::string& path, const Status& why) {
    counters_.failed++;
    DYAD_ERROR(kSub, "asynchronous publish of '%s' failed (DYAD_ASYNC_PUBLISH): %s", path.c_str(),
               why.to_string().c_str());
    if (failures_.size() < kKeptFailures)
        failures_.push_back(Failure{path, why});
    else
        failures_untold_++;
}

Status PublishQueue::take_failures() {
    std::lock_guard<std::mutex> lk(mu_);
    if (failures_.empty()) return Status::ok();
    const uint64_t n = failures_.size() + failures_untold_;
    const Failure first = failures_.front();
    std::vector<std::string> names;
    for (const auto& f : failures_) names.push_back(f.path);
    failures_.clear();
    failures_untold_ = 0;
    std::string msg = std::to_string(n) + " asynchronous publish" + (n == 1 ? "" : "es") +
                      " failed (DYAD_ASYNC_PUBLISH): " + name_files(names) +
                      " not published; the first: " + first.why.to_string() +
                      " (each is logged; produce them again)";
    return Status(first.why.rc() != DYAD_RC_OK ? first.why.rc() : DYAD_RC_BADCOMMIT, msg,
                  first.why.err());
}

bool PublishQueue::drain(Deadline deadline) {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t target = next_seq_ - 1;
    auto done = [&] { return (done_seq_ >= target && busy_.empty()) || !started_; };
    while (!done() && !deadline.expired())
        done_cv_.wait_for(lk,
                          std::chrono::duration<double>(std::min(deadline.remaining(), 3600.0)));
    return done();
}

Status PublishQueue::abandon_locked(const char* context) {
    std::vector<std::string> left = in_flight_;
    for (const auto& b : busy_) left.push_back(b.path);
    for (const auto& e : queue_) left.push_back(e.path);
    if (left.empty()) return Status::ok();
    counters_.unpublished += queue_.size() + busy_.size();
    queue_.clear();
    busy_.clear();
    bytes_ = 0;
    done_seq_ = next_seq_ - 1;
    room_cv_.notify_all();
    done_cv_.notify_all();
    std::string msg = std::to_string(left.size()) + " queued publish" +
                      (left.size() == 1 ? "" : "es") + " not done within " +
                      seconds_text(opt_.timeout_s) + " s (DYAD_ASYNC_PUBLISH_TIMEOUT) at " +
                      context + ": " + name_files(left) +
                      (in_flight_.empty() ? std::string()
                                          : " (the first " + std::to_string(in_flight_.size()) +
                                                " still in flight: published only if the service "
                                                "answers)") +
                      "; is the node's service (" + client_->config().service_uri +
                      ") answering? Produce them again";
    return Status(DYAD_RC_TIMEOUT, msg, ETIMEDOUT);
}

Status PublishQueue::finish() {
    bool drained = drain(Deadline::after(opt_.timeout_s));
    Status left;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (finished_) return Status::ok();
        finished_ = true;
        stop_ = true;
        if (!drained) left = abandon_locked("finalize or exit");
        work_cv_.notify_all();
        room_cv_.notify_all();
    }
    if (thread_.joinable()) {
        // Drained: the thread ends at once. Else it is in a call bounded by
        // its own deadline, and holds what it uses: left to end alone.
        if (drained && thread_.get_id() != std::this_thread::get_id())
            thread_.join();
        else
            thread_.detach();
    }
    Status failed = take_failures();
    if (!failed && !left)
        return Status(failed.rc(), failed.message() + "; " + left.message(), failed.err());
    if (!failed) return failed;
    return left;
}

PublishQueue::Counters PublishQueue::counters() const {
    std::lock_guard<std::mutex> lk(mu_);
    return counters_;
}

void PublishQueue::before_fork() {
    // What was queued before the fork is published before it, so that
    // neither process publishes it twice and the child sees it published.
    if (!drain(Deadline::after(opt_.timeout_s))) {
        std::lock_guard<std::mutex> lk(mu_);
        size_t n = queue_.size() + in_flight_.size() + busy_.size();
        DYAD_WARN(kSub,
                  "fork(): %zu queued publish(es) not done within %s s "
                  "(DYAD_ASYNC_PUBLISH_TIMEOUT); this process (%d) goes on publishing them, the "
                  "child does not",
                  n, seconds_text(opt_.timeout_s).c_str(), static_cast<int>(::getpid()));
    }
    mu_.lock();  // held over the fork: the child's copy of the queue is whole
}

void PublishQueue::after_fork_parent() {
    mu_.unlock();
}

void PublishQueue::after_fork_child() {
    // The parent's thread does not exist here; its files are the parent's.
    new (&mu_) std::mutex();
    new (&work_cv_) std::condition_variable();
    new (&room_cv_) std::condition_variable();
    new (&done_cv_) std::condition_variable();
    new (&thread_) std::thread();  // forget the parent's thread, never joined
    queue_.clear();
    in_flight_.clear();
    busy_.clear();
    failures_.clear();
    failures_untold_ = 0;
    bytes_ = 0;
    done_seq_ = next_seq_ - 1;
    started_ = false;
    stop_ = false;
    counters_ = Counters();
}

}  // namespace dyad::client
