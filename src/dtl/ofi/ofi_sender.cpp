// SPDX-License-Identifier: Apache-2.0
// The libfabric transport, service side (overview in ofi.cpp): per protocol
// one endpoint, a pool of registered chunk buffers within the service's
// memory budget and a progress thread; per transfer, chunks read straight
// into pool buffers and announced to the consumer, who pulls them with
// fi_read and acknowledges each.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "dtl/budget.hpp"
#include "dtl/chunked.hpp"
#include "common/base64.hpp"
#include "common/log.hpp"
#include "common/rate_limit.hpp"
#include "ofi.hpp"
#include "ofi_transport.hpp"
#include "proto/transfer.hpp"

namespace dyad::dtl::ofi {
namespace {

class OfiTransfer;

// One protocol served by this dyadd: its endpoint, the registered buffer
// pool (grown on demand up to kPoolBuffers, registered once) and the
// progress thread for providers whose data progress is manual.
class ServedProtocol {
  public:
    // `no_thread`: DYAD_OFI_NO_PROGRESS_THREAD (tests).
    static Result<std::shared_ptr<ServedProtocol>> open(const ofi::Protocol& p,
                                                        const std::string& node, bool strict,
                                                        bool no_thread, asio::io_context& io) {
        auto ep = ofi::Endpoint::open(p, node.empty() ? nullptr : node.c_str(), strict);
        if (!ep) return ep.status();
        auto sp = std::shared_ptr<ServedProtocol>(new ServedProtocol(std::move(ep.value()), io));
        if (sp->ep_->manual_progress() && !no_thread)
            sp->progress_ = std::thread([raw = sp.get()] { raw->run(); });
        DYAD_INFO(kSub, "serving %s (provider %s): %s progress, CQ %s", p.name, p.provider,
                  sp->ep_->manual_progress() ? "manual" : "automatic",
                  sp->ep_->can_wait() ? "with a wait fd" : "without a wait object");
        return sp;
    }
    ~ServedProtocol() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        busy_cv_.notify_all();
        if (progress_.joinable()) progress_.join();
        for (auto& r : regions_) ep_->release(r);
        if (budget_) budget_->unreserve(reserved_);
    }

    const std::string& address() const { return ep_->address(); }
    const ofi::Protocol& protocol() const { return ep_->protocol(); }

    // A free registered buffer (index), -1 when none (then `waiter` is
    // resumed on the loop when one frees), or an error.
    // The pool grows within the service's memory budget (its first buffer
    // always: a protocol with no buffer could never serve).
    // A peer (FetchJob::peer) holds at most its share (PoolShares); beyond it
    // it waits, and a release wakes the first waiter under its share.
    Result<int> acquire(std::weak_ptr<OfiTransfer> waiter, MemoryBudget* budget, uint64_t peer);
    void release(int idx, uint64_t peer);
    uint64_t progress_interrupted() const { return interrupted_.load(); }
    uint64_t progress_failures() const { return failures_.load(); }
    uint64_t peer_waits() const {
        std::lock_guard<std::mutex> lk(mu_);
        return shares_.waits;
    }
    char* buffer(int idx) { return bufs_[static_cast<size_t>(idx)].get(); }
    const ofi::Region& region(int idx) const { return regions_[static_cast<size_t>(idx)]; }
    size_t pool_size() const {
        std::lock_guard<std::mutex> lk(mu_);
        return bufs_.size();
    }

  private:
    ServedProtocol(std::unique_ptr<ofi::Endpoint> ep, asio::io_context& io)
        : ep_(std::move(ep)), io_(io) {}
    void wait_for_buffer(std::weak_ptr<OfiTransfer> t, uint64_t peer);  // under mu_

    // Drives the provider so consumers' reads of our memory complete. The
    // service posts no operations itself, so completions are not expected;
    // the wait (with a timeout, to notice shutdown) is what makes progress.
    // A CQ without a wait object (shm) is read in a yielding loop, but only
    // while buffers are out to consumers; otherwise the thread sleeps.
    void run() {
        fi_cq_entry e[8];
        while (!stop_) {
            if (!ep_->can_wait()) {
                std::unique_lock<std::mutex> lk(mu_);
                busy_cv_.wait(lk, [this] { return stop_ || out_ > 0; });
                if (stop_) break;
            }
            ssize_t n = ep_->can_wait() ? fi_cq_sread(ep_->cq(), e, 8, nullptr, 200)
                                        : fi_cq_read(ep_->cq(), e, 8);
            if (n == -FI_EAVAIL) {
                fi_cq_err_entry ee;
                std::memset(&ee, 0, sizeof ee);
                fi_cq_readerr(ep_->cq(), &ee, 0);
                static log::RateLimit limit(kSub, "completion errors");  // peers cause them
                if (limit.allow()) DYAD_WARN(kSub, "completion error: %s", fi_strerror(ee.err));
            } else if (n == -FI_EINTR) {
                // The wait was interrupted: dyadd stopped and continued
                // (SIGSTOP/SIGCONT, a batch system's suspend and resume, a
                // debugger attaching). Wait again: without this thread no
                // consumer's read would ever complete.
                ++interrupted_;
            } else if (n < 0 && n != -FI_EAGAIN) {
                // Not expected; the thread keeps going (once a second at
                // most), as every consumer of this protocol depends on it.
                uint64_t f = ++failures_;
                if (f == 1 || f % 100 == 0)
                    DYAD_ERROR(kSub, "fi_cq_sread: %s (%llu times); retrying",
                               fi_strerror(static_cast<int>(-n)),
                               static_cast<unsigned long long>(f));
                std::unique_lock<std::mutex> lk(mu_);
                busy_cv_.wait_for(lk, std::chrono::seconds(1), [this] { return stop_.load(); });
            } else if (!ep_->can_wait()) {
                std::this_thread::yield();
            }
        }
    }

    std::unique_ptr<ofi::Endpoint> ep_;
    asio::io_context& io_;
    mutable std::mutex mu_;
    std::vector<std::unique_ptr<char[]>> bufs_;
    std::vector<ofi::Region> regions_;
    std::vector<int> free_;
    struct Waiter {
        std::weak_ptr<OfiTransfer> t;
        uint64_t peer;
    };
    std::deque<Waiter> waiters_;
    PoolShares shares_;               // buffers each peer holds, against its share
    MemoryBudget* budget_ = nullptr;  // the service's (loop thread); its bytes we hold
    size_t reserved_ = 0;
    std::atomic<bool> stop_{false};  // set under mu_ (for busy_cv_)
    size_t out_ = 0;                 // buffers not in the free list (under mu_)
    // Written by the progress thread, read by `dyad service status`.
    std::atomic<uint64_t> interrupted_{0};  // waits interrupted (EINTR), then resumed
    std::atomic<uint64_t> failures_{0};     // waits that failed, then retried
    std::condition_variable busy_cv_;
    std::thread progress_;
};

// Chunks are read straight into pool buffers (the direct mode of the chunk
// pipeline); each is announced by a descriptor and returned on the
// consumer's acknowledgement.
class OfiTransfer : public ChunkedTransfer {
  public:
    OfiTransfer(std::shared_ptr<FetchJob> job, SendDone done, std::shared_ptr<ServedProtocol> sp)
        : ChunkedTransfer(std::move(job), std::move(done), kOfiChunk, kDepth), sp_(std::move(sp)) {}
    ~OfiTransfer() override {
        for (int idx : reading_) sp_->release(idx, job().peer);
        pending_.drain([this](Pending& p) { sp_->release(p.idx, job().peer); });
    }

    void start_ofi() {
        std::weak_ptr<ChunkedTransfer> weak = shared_from_this();
        job().ch->on_update([weak](const nlohmann::json& m) {
            auto self = std::static_pointer_cast<OfiTransfer>(weak.lock());
            if (self) self->on_ack(m);
        });
        start();
    }
    void wake() { resume(); }

  protected:
    bool inline_first_chunk() const override { return false; }
    nlohmann::json first_meta() const override {
        return proto::OfiStart{{job().size, name_of(Kind::ofi)},
                               kOfiChunk,
                               sp_->protocol().name,
                               base64_encode(sp_->address())}
            .build();
    }
    bool direct() const override { return true; }
    char* direct_target(size_t) override {
        if (over_ || reading_.size() + pending_.outstanding() >= static_cast<size_t>(kDepth))
            return nullptr;  // resumed by an acknowledgement
        auto idx = sp_->acquire(std::static_pointer_cast<OfiTransfer>(shared_from_this()),
                                job().budget, job().peer);
        if (!idx) {
            auto self = std::static_pointer_cast<OfiTransfer>(shared_from_this());
            asio::post(job().ch->io(), [self, st = idx.status()] { self->abort(st); });
            return nullptr;
        }
        if (idx.value() < 0) return nullptr;  // resumed when a buffer frees
        reading_.push_back(idx.value());
        return sp_->buffer(idx.value());
    }
    void write_chunk(const char*, size_t n, nlohmann::json,
                     std::function<void(bool)> done) override {
        int idx = reading_.front();
        reading_.pop_front();
        uint64_t seq = pending_.push(Pending{idx, std::move(done)});
        const auto& r = sp_->region(idx);
        job().ch->send(proto::OfiChunk{seq, r.base, r.key, n}.build());
    }
    void on_finish() override {
        over_ = true;
        // Announced buffers go back (the consumer has failed or is gone);
        // a buffer still being read from the file goes back in the destructor.
        pending_.drain([this](Pending& p) { sp_->release(p.idx, job().peer); });
    }

  private:
    struct Pending {
        int idx;
        std::function<void(bool)> done;
    };
    void on_ack(const nlohmann::json& m) {
        auto p = pending_.ack(m);
        if (!p) return;
        sp_->release(p->idx, job().peer);
        p->done(true);
    }

    std::shared_ptr<ServedProtocol> sp_;
    std::deque<int> reading_;  // buffers being filled from the file, in order
    AckWindow<Pending> pending_{static_cast<size_t>(kDepth)};  // announced, not yet read
    bool over_ = false;
};

Result<int> ServedProtocol::acquire(std::weak_ptr<OfiTransfer> waiter, MemoryBudget* budget,
                                    uint64_t peer) {
    std::unique_lock<std::mutex> lk(mu_);
    shares_.set_share(budget, kPoolBuffers);
    if (shares_.full(peer)) {
        ++shares_.waits;
        wait_for_buffer(std::move(waiter), peer);
        return -1;
    }
    if (!free_.empty()) {
        int idx = free_.back();
        free_.pop_back();
        if (out_++ == 0) busy_cv_.notify_all();
        shares_.take(peer);
        return idx;
    }
    bool may_grow = bufs_.size() < kPoolBuffers;
    if (may_grow && budget) {
        budget_ = budget;
        if (!budget->try_reserve(kOfiChunk)) {
            may_grow = bufs_.empty();
            if (may_grow) budget->force_reserve(kOfiChunk);
        }
        if (may_grow) reserved_ += kOfiChunk;
    }
    if (may_grow) {
        std::unique_ptr<char[]> b(new char[kOfiChunk]);
        auto r = ep_->register_memory(b.get(), kOfiChunk, FI_REMOTE_READ);
        if (!r) {
            if (budget) {
                budget->unreserve(kOfiChunk);
                reserved_ -= kOfiChunk;
            }
            return r.status();
        }
        bufs_.push_back(std::move(b));
        regions_.push_back(r.value());
        if (out_++ == 0) busy_cv_.notify_all();
        shares_.take(peer);
        return static_cast<int>(bufs_.size() - 1);
    }
    wait_for_buffer(std::move(waiter), peer);
    return -1;
}

void ServedProtocol::wait_for_buffer(std::weak_ptr<OfiTransfer> t, uint64_t peer) {
    // Once per transfer: a transfer asks again on each of its events.
    for (const auto& w : waiters_)
        if (!w.t.owner_before(t) && !t.owner_before(w.t)) return;
    waiters_.push_back({std::move(t), peer});
}

void ServedProtocol::release(int idx, uint64_t peer) {
    std::vector<std::weak_ptr<OfiTransfer>> wake;
    {
        std::lock_guard<std::mutex> lk(mu_);
        free_.push_back(idx);
        --out_;
        shares_.give(peer);
        // Every waiter whose peer is under its share is woken, in order (gone
        // ones dropped); each tries again and those that lose wait again.
        // Waking only the first lost buffers: a woken transfer may no longer
        // want one (it is reading, at its depth, or done) and then never
        // takes it, while the next waiter sleeps with a free buffer beside
        // it until its consumer's deadline.
        for (auto w = waiters_.begin(); w != waiters_.end();) {
            if (w->t.expired()) {
                w = waiters_.erase(w);
            } else if (shares_.full(w->peer)) {
                ++w;
            } else {
                wake.push_back(std::move(w->t));
                w = waiters_.erase(w);
            }
        }
    }
    if (!wake.empty())
        asio::post(io_, [wake = std::move(wake)] {
            for (const auto& w : wake)
                if (auto t = w.lock()) t->wake();
        });
}

class OfiSender : public Sender {
  public:
    OfiSender(asio::io_context& io, ServiceBind bind, const OfiOptions& o)
        : io_(io),
          bind_(std::move(bind)),
          attrs_(ofi_attributes(o, false)),
          no_thread_(o.no_progress_thread) {}
    const Attributes& attributes() const override { return attrs_; }
    nlohmann::json stats() const override {
        nlohmann::json served = nlohmann::json::object();
        for (const auto& [k, sp] : *served_)
            served[k] = {{"provider", sp->protocol().provider},
                         {"pool_buffers", sp->pool_size()},
                         {"peer_waits", sp->peer_waits()},
                         {"progress_interrupted", sp->progress_interrupted()},
                         {"progress_failures", sp->progress_failures()}};
        return {{"protocols", served}, {"pool_limit_bytes", kPoolBuffers * kOfiChunk}};
    }

    void send(std::shared_ptr<FetchJob> job, SendDone done) override {
        auto req = proto::OfiRequest::parse(job->transport_args);
        if (!req) {
            done(req.status(), 0, "");
            return;
        }
        std::string name = std::move(req.value().proto);
        // The service's listen policy decides where the endpoint binds;
        // without one (a keyed service on a wildcard), the address the
        // consumer reached.
        const bool strict = !bind_.host.empty();
        std::string node = strict ? bind_.host : job->local_host;
        std::string key = name + "@" + node;
        auto found = served_->find(key);
        if (found != served_->end()) {
            std::make_shared<OfiTransfer>(std::move(job), std::move(done), found->second)
                ->start_ofi();
            return;
        }
        // Opening a protocol probes libfabric's providers (0.3 s for the
        // first one in a process): off the event loop, on the file pool.
        std::weak_ptr<Served> weak = served_;
        asio::io_context& io = io_;
        asio::thread_pool& pool = *job->file_pool;
        asio::post(pool, [weak, &io, name, key, node, strict, no_thread = no_thread_,
                          job = std::move(job), done = std::move(done)]() mutable {
            Result<std::shared_ptr<ServedProtocol>> sp = Status::ok();
            // One open at a time: first fetches arriving together opened
            // endpoints on two pool threads at once, and libfabric 1.17's shm
            // then failed one of them in fi_enable (EBUSY; seen once in
            // test_consumers_contending_for_one_buffer_each_finish[ofi+shm]).
            static std::mutex opening;
            std::lock_guard<std::mutex> one(opening);
            auto p = ofi::validate_protocol(name);
            if (!p)
                sp = p.status();
            else
                sp = ServedProtocol::open(*p.value(), node, strict, no_thread, io);
            asio::post(io, [weak, key, sp = std::move(sp), job = std::move(job),
                            done = std::move(done)]() mutable {
                auto served = weak.lock();
                if (!served) return;  // the service is shutting down
                if (!sp) {
                    done(sp.status(), 0, "");
                    return;
                }
                // Two first fetches may both have opened it: keep the first.
                auto ins = served->emplace(key, sp.value()).first->second;
                std::make_shared<OfiTransfer>(std::move(job), std::move(done), ins)->start_ofi();
            });
        });
    }

  private:
    using Served = std::map<std::string, std::shared_ptr<ServedProtocol>>;

    asio::io_context& io_;
    ServiceBind bind_;
    Attributes attrs_;
    bool no_thread_;
    std::shared_ptr<Served> served_ = std::make_shared<Served>();
};

}  // namespace

std::unique_ptr<Sender> make_sender(asio::io_context& io, const ServiceBind& bind,
                                    const OfiOptions& o) {
    return std::unique_ptr<Sender>(new OfiSender(io, bind, o));
}

}  // namespace dyad::dtl::ofi
