// SPDX-License-Identifier: Apache-2.0
// UCX backend (DYAD_DTL_MODE=UCX). File bytes move from the service's worker
// to the consumer's worker in one of two ways, chosen per endpoint:
//   put: RMA puts into the consumer's registered window, where UCX does put
//        natively (shared memory, RDMA): ucp_ep_print_info lists put lanes;
//   tag: tagged messages, where put would be emulated in software (TCP).
// The fetch channel carries the request (worker address, tag, window rkey),
// the size, the put notices and acknowledgements (AckWindow), errors and the
// end trailer. The consumer side is in receiver.cpp.
//
// Consumer: one process-wide UCP context with the wakeup feature; per
// concurrent fetch a lane (receiver.cpp): a worker and a bounded registered
// receive window (DYAD_UCX_WINDOW, default 64 MiB) cut into chunk slots, run by the consumer's
// chunk window (receive_window.hpp, shared with libfabric); receives are posted ahead into free
// slots and completed in order. Waiting is event-driven: poll() on the worker's event fd and the
// RPC socket together, with the inactivity deadline, so an error or the
// service's death ends the wait at once.
//
// Service: one worker on the event loop (its event fd watched by Asio); an
// endpoint cache keyed by the consumer's connection (session) and the worker
// address itself, never by a name the consumer chooses, with LRU eviction
// (DYAD_UCX_EP_CACHE_SIZE, default 64) and an error handler that drops
// broken endpoints. A consumer's address reaches ucp_ep_create only after
// parse_ucx_worker_address and ucx_address_fits (peer_address.hpp) passed. Sends go through the
// shared chunk pipeline (bounded memory per transfer).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

#include "common/base64.hpp"
#include "common/log.hpp"
#include "common/rate_limit.hpp"
#include "dtl/chunked.hpp"
#include "dtl/peer_address.hpp"
#include "proto/transfer.hpp"
#include "ucx.hpp"

namespace dyad::dtl::ucx {
namespace {

// ---------------- service side ----------------

struct SendCtx {
    std::function<void(bool)> done;
};

void send_cb(void* request, ucs_status_t status, void* user_data) {
    auto* ctx = static_cast<SendCtx*>(user_data);
    auto done = std::move(ctx->done);
    delete ctx;
    ucp_request_free(request);
    if (done) done(status == UCS_OK);
}

class UcxSender;

// A cached endpoint. Transfers hold it; it is closed only when it is out of
// the cache (evicted or failed) and no transfer uses it any more.
struct EpEntry {
    std::string key;    // session and worker address (UcxSender::endpoint)
    std::string label;  // for logs and status: session and the consumer's own name
    ucp_ep_h ep = nullptr;
    int users = 0;
    bool broken = false;
    bool cached = true;
    bool put_native = false;  // UCX lists put lanes for this endpoint
    std::string transports;   // the endpoint's lanes, for logs
    // The consumer's window key, unpacked once per endpoint (one window per
    // consumer process); destroyed before the endpoint is closed.
    std::string rkey_blob;
    ucp_rkey_h rkey = nullptr;
    // Where that window is mapped in this process, when UCX can map it
    // (ucp_rkey_ptr: shared memory); null otherwise.
    uint64_t window = 0;
    char* window_here = nullptr;
};

// Whether UCX does put natively on this endpoint, from its own description
// of the endpoint: with UCP_FEATURE_RMA, ucp_ep_print_info lists "put[N]"
// ranges for every lane that does RMA in hardware or over shared memory;
// when put would be emulated over active messages (TCP), there are none.
// UCX 1.13 has no ucp_ep_query for transports, so this is how it tells us.
void describe_endpoint(EpEntry& e) {
    char* text = nullptr;
    size_t len = 0;
    FILE* f = open_memstream(&text, &len);
    if (!f) return;
    ucp_ep_print_info(e.ep, f);
    std::fclose(f);
    std::string out(text ? text : "", len);
    std::free(text);
    e.put_native = out.find("put[") != std::string::npos;
    // The lanes, e.g. "sysv/memory.0 self/memory0.0".
    size_t pos = 0;
    while ((pos = out.find("lane[", pos)) != std::string::npos) {
        size_t colon = out.find(':', pos);
        size_t start = out.find_first_not_of(" 0123456789:", colon + 1);
        size_t end = out.find(' ', start);
        if (colon == std::string::npos || start == std::string::npos) break;
        if (!e.transports.empty()) e.transports += ' ';
        e.transports += out.substr(start, end - start);
        pos = end;
    }
}

class UcxTransfer : public ChunkedTransfer {
  public:
    UcxTransfer(std::shared_ptr<FetchJob> job, SendDone done, UcxSender* s,
                std::shared_ptr<EpEntry> ep, uint64_t tag)
        : ChunkedTransfer(std::move(job), std::move(done), kUcxTagChunk, kUcxDepth),
          sender_(s),
          ep_(std::move(ep)),
          tag_(tag) {
        ++ep_->users;
    }
    ~UcxTransfer() override;

  protected:
    void write_chunk(const char* p, size_t n, nlohmann::json,
                     std::function<void(bool)> done) override;
    bool inline_first_chunk() const override { return false; }
    nlohmann::json first_meta() const override {
        return proto::UcxStart{{job().size, name_of(Kind::ucx)}, kUcxTagChunk, std::nullopt}
            .build();
    }

  private:
    UcxSender* sender_;
    std::shared_ptr<EpEntry> ep_;
    uint64_t tag_;
};

// Put mode: chunk k goes into the consumer's window slot k % nslots, then a
// flush makes it visible there and a put notice (proto::UcxPutNotice) tells the
// consumer, in order. The consumer returns each slot as a credit once its
// bytes are in the file; with no credit, chunks wait here (their buffers
// stay out of the read-ahead pool, which bounds memory).
class UcxPutTransfer : public ChunkedTransfer {
  public:
    UcxPutTransfer(std::shared_ptr<FetchJob> job, SendDone done, UcxSender* s,
                   std::shared_ptr<EpEntry> ep, uint64_t window, size_t nslots)
        : ChunkedTransfer(std::move(job), std::move(done), kUcxChunk, kUcxDepth),
          sender_(s),
          ep_(std::move(ep)),
          window_(window),
          here_(ep_->window == window ? ep_->window_here : nullptr),
          nslots_(nslots),
          slots_(nslots, /*in_order=*/true) {
        ++ep_->users;
    }
    ~UcxPutTransfer() override;

    void start_put() {
        std::weak_ptr<ChunkedTransfer> weak = shared_from_this();
        job().ch->on_update([weak](const nlohmann::json& m) {
            auto self = std::static_pointer_cast<UcxPutTransfer>(weak.lock());
            if (self) self->on_ack(m);
        });
        start();
    }

  protected:
    void write_chunk(const char* p, size_t n, nlohmann::json,
                     std::function<void(bool)> done) override {
        if (here_) {  // already in the consumer's window
            size_t slot = direct_slots_.front();
            direct_slots_.pop_front();
            job().ch->send(proto::UcxPutNotice{slot, n}.build());
            asio::post(job().ch->io(), [done = std::move(done)] { done(true); });
            return;
        }
        waiting_.push_back(Chunk{p, n, std::move(done), false, false, 0});
        issue();
    }
    bool inline_first_chunk() const override { return false; }
    nlohmann::json first_meta() const override {
        return proto::UcxStart{{job().size, name_of(Kind::ucx)}, kUcxChunk, "put"}.build();
    }
    // With the window mapped here, file reads land in it: no copy, no put.
    bool direct() const override { return here_ != nullptr; }
    char* direct_target(size_t n) override {
        (void)n;
        if (failed_ || slots_.full()) return nullptr;
        size_t slot = static_cast<size_t>(slots_.next_seq() % nslots_);
        slots_.push(slot);
        direct_slots_.push_back(slot);
        return here_ + slot * kUcxChunk;
    }

  private:
    struct Chunk {
        const char* p;
        size_t n;
        std::function<void(bool)> done;
        bool issued;
        bool complete;
        size_t slot;
    };
    // The consumer took chunk k out of its window: slot k % nslots is free.
    void on_ack(const nlohmann::json& m) {
        // Slot k % nslots is reused by chunk k + nslots: acknowledgements
        // must come in order. A consumer of the first release returns
        // a credit alone for the oldest slot instead (proto::UcxAck).
        std::optional<size_t> slot;
        if (proto::UcxAck::parse(m).oldest())
            slot = slots_.ack(proto::ChunkAck{slots_.oldest_seq()}.build());
        else
            slot = slots_.ack(m);
        if (!slot) return;
        if (here_)
            resume();
        else
            issue();
    }
    void issue();
    void completed(bool ok);
    void on_finish() override { completed(false); }

    UcxSender* sender_;
    std::shared_ptr<EpEntry> ep_;
    uint64_t window_;
    char* here_;
    std::deque<size_t> direct_slots_;  // slots being read into (direct mode)
    size_t nslots_;
    AckWindow<size_t> slots_;   // window slots the consumer has not emptied yet
    std::list<Chunk> waiting_;  // in file order; issued ones first (stable addresses)
    bool failed_ = false;
};

class UcxSender : public Sender {
  public:
    static Result<std::unique_ptr<Sender>> create(asio::io_context& io, const ServiceBind& bind,
                                                  const UcxServiceOptions& o) {
        WorkerOptions wo;
        wo.service = true;
        wo.bind = &bind;
        wo.shared_memory = o.shared_memory;
        auto w = Worker::create(wo);
        if (!w) return w.status();
        // Our own address: what a consumer's is compared with.
        auto own = parse_ucx_worker_address(w.value()->address());
        if (!own)
            return Status(DYAD_RC_UCXINIT_FAIL,
                          "this UCX packs worker addresses in a layout DYAD does not know (" +
                              own.status().message() + "); build DYAD against this UCX release",
                          ENOTSUP);
        std::unique_ptr<UcxSender> s(new UcxSender(io, std::move(w.value()), o.ep_cache));
        s->no_direct_ = !o.direct;
        s->own_ = std::move(own.value());
        // Our TCP is kept to the policy's interfaces; consumers' is not.
        if (!bind.host.empty()) add_ucx_tcp_layouts(&s->own_);
        s->watch();
        return std::unique_ptr<Sender>(std::move(s));
    }
    ~UcxSender() override {
        asio::error_code ec;
        efd_.cancel(ec);
        tick_.cancel();
        for (auto& e : lru_) {
            e->broken = true;
            close_ep(*e);
        }
        lru_.clear();
        index_.clear();
        worker_->progress();
    }
    const Attributes& attributes() const override { return attrs_; }
    nlohmann::json stats() const override {
        nlohmann::json eps = nlohmann::json::array();
        for (const auto& e : lru_)
            eps.push_back({{"consumer", e->label},
                           {"transports", e->transports},
                           {"put", e->put_native ? "native" : "emulated"}});
        return {
            {"endpoints_created", {{"native_put", eps_native_}, {"emulated_put", eps_emulated_}}},
            {"last_endpoint_transports", last_transports_},
            {"put_transfers", put_transfers_},
            {"direct_transfers", direct_transfers_},
            {"tag_transfers", tag_transfers_},
            {"addresses_refused", addresses_refused_},
            {"rkeys_refused", rkeys_refused_},
            {"endpoints_failed", eps_failed_},
            {"endpoints", eps}};
    }

    void send(std::shared_ptr<FetchJob> job, SendDone done) override {
        auto req = proto::UcxRequest::parse(job->transport_args);
        if (!req) {
            done(req.status(), 0, "");
            return;
        }
        const proto::UcxRequest& a = req.value();
        // The consumer's own name, for logs only (it proves nothing).
        auto ep = endpoint(job->endpoint, a.consumer, a.worker);
        if (!ep) {
            done(ep.status(), 0, "");
            return;
        }
        bool put = a.proto == "put" || (a.proto == "auto" && ep.value()->put_native);
        // Without a window (an older consumer), tagged messages.
        if (put && a.window) {
            size_t nslots = a.window->size / kUcxChunk;
            Status st = rkey_for(*ep.value(), a.window->rkey, a.window->address);
            if (!st) {
                done(st, 0, "");
                return;
            }
            if (nslots != 0) {  // else a window smaller than one chunk: tagged messages
                ++put_transfers_;
                if (ep.value()->window_here) ++direct_transfers_;
                auto t = std::make_shared<UcxPutTransfer>(std::move(job), std::move(done), this,
                                                          ep.value(), a.window->address, nslots);
                t->start_put();
                return;
            }
        }
        ++tag_transfers_;
        std::make_shared<UcxTransfer>(std::move(job), std::move(done), this, ep.value(), a.tag)
            ->start();
        kick();
    }

    void send_chunk(EpEntry& ep, uint64_t tag, const char* p, size_t n,
                    std::function<void(bool)> done) {
        if (ep.broken) {
            asio::post(io_, [done = std::move(done)] { done(false); });
            return;
        }
        auto* ctx = new SendCtx{counted(std::move(done))};
        ucp_request_param_t prm;
        std::memset(&prm, 0, sizeof prm);
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        prm.cb.send = send_cb;
        prm.user_data = ctx;
        ucs_status_ptr_t r = ucp_tag_send_nbx(ep.ep, p, n, tag, &prm);
        if (UCS_PTR_IS_PTR(r)) {
            kick();
            return;  // send_cb runs from progress, on the loop
        }
        auto d = std::move(ctx->done);
        delete ctx;
        bool ok = UCS_PTR_STATUS(r) == UCS_OK;
        if (!ok) DYAD_WARN(kSub, "ucp_tag_send_nbx: %s", ucs_text(UCS_PTR_STATUS(r)).c_str());
        asio::post(io_, [d = std::move(d), ok] { d(ok); });
    }

    // Puts n bytes at the consumer's `raddr`, then flushes the endpoint so
    // they are visible there; done(ok) runs on the loop.
    void put_chunk(EpEntry& ep, const char* p, size_t n, uint64_t raddr,
                   std::function<void(bool)> done) {
        if (ep.broken || !ep.rkey) {
            asio::post(io_, [done = std::move(done)] { done(false); });
            return;
        }
        ucp_request_param_t prm;
        std::memset(&prm, 0, sizeof prm);
        ucs_status_ptr_t r = ucp_put_nbx(ep.ep, p, n, raddr, ep.rkey, &prm);
        if (UCS_PTR_IS_ERR(r)) {
            DYAD_WARN(kSub, "ucp_put_nbx: %s", ucs_text(UCS_PTR_STATUS(r)).c_str());
            asio::post(io_, [done = std::move(done)] { done(false); });
            return;
        }
        if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);  // the flush below covers it
        auto* ctx = new SendCtx{counted(std::move(done))};
        std::memset(&prm, 0, sizeof prm);
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        prm.cb.send = send_cb;
        prm.user_data = ctx;
        ucs_status_ptr_t fl = ucp_ep_flush_nbx(ep.ep, &prm);
        if (UCS_PTR_IS_PTR(fl)) {
            kick();
            return;
        }
        auto d = std::move(ctx->done);
        delete ctx;
        bool ok = UCS_PTR_STATUS(fl) == UCS_OK;
        if (!ok) DYAD_WARN(kSub, "ucp_ep_flush_nbx: %s", ucs_text(UCS_PTR_STATUS(fl)).c_str());
        asio::post(io_, [d = std::move(d), ok] { d(ok); });
    }

    // One record per kind of lane UCX offers here (ucp_context_print_info
    // lists the transport resources of the context): shared memory for
    // consumers on this machine, the network ones for everybody.
    std::vector<TransportRecord> records() const override {
        std::vector<std::string> tls;
        char* text = nullptr;
        size_t len = 0;
        if (FILE* f = ::open_memstream(&text, &len)) {
            ucp_context_print_info(worker_->context(), f);
            std::fclose(f);
        }
        std::string all(text ? text : "", len);
        std::free(text);
        for (size_t pos = all.find("resource"); pos != std::string::npos;
             pos = all.find("resource", pos + 1)) {
            size_t eol = all.find('\n', pos);
            std::string line = all.substr(pos, eol == std::string::npos ? eol : eol - pos);
            size_t sp = line.find_last_of(" \t");
            std::string tl = line.substr(sp + 1);
            tl = tl.substr(0, tl.find('/'));
            if (!tl.empty() && std::find(tls.begin(), tls.end(), tl) == tls.end())
                tls.push_back(tl);
        }
        auto has = [&](std::initializer_list<const char*> names, std::string* which) {
            for (const auto& t : tls)
                for (const char* n : names)
                    if (t.rfind(n, 0) == 0) *which += (which->empty() ? "" : ",") + t;
            return !which->empty();
        };
        std::vector<TransportRecord> out;
        auto rec = [&](const char* reach, double lat, double bw, bool native, std::string lanes) {
            TransportRecord r;
            r.name = name_of(Kind::ucx);
            r.reach = reach;
            r.latency_us = lat;
            r.bandwidth_gbps = bw;
            r.rma_native = native;
            r.max_message = kUcxChunk;
            r.detail = "lanes " + lanes;
            r.source =
                "lanes from ucp_context_print_info; figures: configuration (measured with "
                "bench/auto_bench.py and bench/ucx_bench.py)";
            out.push_back(std::move(r));
        };
        std::string shm, rdma, tcp;
        if (has({"sysv", "posix", "cma", "xpmem", "knem"}, &shm))
            rec(proto::kReachHost, 160, 0.9, true, shm);
        if (has({"rc", "dc"}, &rdma)) rec(proto::kReachNetwork, 20, 10.0, true, rdma);
        if (has({"tcp"}, &tcp)) rec(proto::kReachNetwork, 160, 1.0, false, tcp);
        return out;
    }

    // A transfer let go of its endpoint.
    void release(EpEntry& e) {
        if (--e.users == 0 && !e.cached) close_ep(e);
    }

  private:
    UcxSender(asio::io_context& io, std::unique_ptr<Worker> w, size_t cap)
        : io_(io),
          worker_(std::move(w)),
          efd_(io, ::dup(worker_->efd())),
          cap_(cap),
          attrs_(ucx_attributes()),
          tick_(io) {}

    // Progress whenever the worker's event fd fires; re-arm when idle.
    void watch() {
        for (;;) {
            worker_->progress();
            ucs_status_t s = ucp_worker_arm(worker_->get());
            if (s == UCS_ERR_BUSY) continue;
            if (s != UCS_OK) DYAD_ERROR(kSub, "ucp_worker_arm: %s", ucs_text(s).c_str());
            break;
        }
        efd_.async_wait(asio::posix::stream_descriptor::wait_read, [this](asio::error_code ec) {
            if (!ec) watch();
        });
    }
    // After posting work: progress once on the loop (sends may need it
    // before the fd ever fires). A bounded spin while requests were in
    // flight was measured and did not help (docs/design.md).
    //
    // And while any send or flush is out, progress every millisecond: over
    // shared memory (sysv, posix) a send that found the consumer's FIFO full
    // waits in UCX's pending queue, and nothing signals the event fd when
    // the consumer drains it; the transfer then stalled until the consumer's
    // deadline (forced tag over sysv: 1 fetch in 6 to 8 hung for 20 s).
    void kick() {
        if (!kick_pending_) {
            kick_pending_ = true;
            asio::post(io_, [this] {
                kick_pending_ = false;
                worker_->progress();
            });
        }
        if (outstanding_ > 0 && !ticking_) tick();
    }
    void tick() {
        ticking_ = true;
        tick_.expires_after(std::chrono::milliseconds(1));
        tick_.async_wait([this](asio::error_code ec) {
            if (ec) return;  // cancelled: the sender may be gone
            ticking_ = false;
            worker_->progress();
            if (outstanding_ > 0) tick();
        });
    }
    // A request's `done`, counted in `outstanding_` from here until it runs.
    std::function<void(bool)> counted(std::function<void(bool)> done) {
        ++outstanding_;
        return [this, done = std::move(done)](bool ok) {
            --outstanding_;
            done(ok);
        };
    }

    static void ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
        auto* self = static_cast<UcxSender*>(arg);
        static log::RateLimit limit(kSub, "failed endpoints");  // a peer going away
        if (limit.allow())
            DYAD_WARN(kSub, "endpoint failed (%s): dropped from the cache",
                      ucs_text(status).c_str());
        for (auto it = self->lru_.begin(); it != self->lru_.end(); ++it) {
            if ((*it)->ep == ep) {
                auto e = *it;
                e->broken = true;
                e->cached = false;
                self->index_.erase(e->key);
                ++self->eps_failed_;
                self->lru_.erase(it);
                // Closing from inside the callback is not allowed: do it next.
                if (e->users == 0) asio::post(self->io_, [self, e] { self->close_ep(*e); });
                break;
            }
        }
    }

    // The remote key goes first, then the endpoint (forcibly if broken).
    void close_ep(EpEntry& e) {
        if (!e.ep) return;
        if (e.rkey) ucp_rkey_destroy(e.rkey);
        e.rkey = nullptr;
        ucp_request_param_t p;
        std::memset(&p, 0, sizeof p);
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = e.broken ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        ucs_status_ptr_t r = ucp_ep_close_nbx(e.ep, &p);
        e.ep = nullptr;
        if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);  // completes in the background
    }

    // The endpoint for this consumer connection (`session`) and worker
    // address. Keyed by both: another connection naming the same address, or
    // this one naming another, never gets or changes this entry (its rkey,
    // its window).
    Result<std::shared_ptr<EpEntry>> endpoint(uint64_t session, const std::string& name,
                                              const std::string& addr_b64) {
        auto addr = base64_decode(addr_b64);
        if (!addr) return addr.status();
        std::string key = std::to_string(session) + '\n' + addr.value();
        auto it = index_.find(key);
        if (it != index_.end()) {
            lru_.splice(lru_.begin(), lru_, it->second);
            return *it->second;
        }
        std::string label = "session " + std::to_string(session) + " (" + name + ")";
        // Nothing UCX would choke on goes further (peer_address.hpp).
        auto parsed = parse_ucx_worker_address(addr.value());
        Status fits = parsed ? ucx_address_fits(parsed.value(), own_) : parsed.status();
        if (!fits) {
            ++addresses_refused_;
            static log::RateLimit limit(kSub, "refused UCX worker addresses");
            if (limit.allow())
                DYAD_WARN(kSub, "refused the UCX worker address of %s: %s", label.c_str(),
                          fits.message().c_str());
            return fits;
        }
        ucp_ep_params_t p;
        std::memset(&p, 0, sizeof p);
        p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                       UCP_EP_PARAM_FIELD_ERR_HANDLER;
        p.address = reinterpret_cast<const ucp_address_t*>(addr->data());
        p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        p.err_handler.cb = ep_error;
        p.err_handler.arg = this;
        ucp_ep_h ep = nullptr;
        ucs_status_t s = ucp_ep_create(worker_->get(), &p, &ep);
        if (s == UCS_ERR_UNREACHABLE) {
            // Shared-memory transports cannot report a peer's failure; without
            // it UCX can reach the consumer. A dead consumer is still noticed:
            // its RPC connection closes and the transfer is cancelled.
            p.field_mask &=
                ~(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER);
            s = ucp_ep_create(worker_->get(), &p, &ep);
        }
        if (s != UCS_OK)
            return ucx_error(DYAD_RC_UCXEP_FAIL, "ucp_ep_create to consumer " + label, s);
        auto e = std::make_shared<EpEntry>();
        e->key = key;
        e->label = label;
        e->ep = ep;
        describe_endpoint(*e);
        ++(e->put_native ? eps_native_ : eps_emulated_);
        last_transports_ = e->transports;
        DYAD_DEBUG(kSub, "endpoint to %s over %s: %s", label.c_str(), e->transports.c_str(),
                   e->put_native ? "native put" : "put emulated, tagged messages");
        lru_.push_front(e);
        index_[key] = lru_.begin();
        while (lru_.size() > cap_) {  // evict the least recently used
            auto old = lru_.back();
            lru_.pop_back();
            index_.erase(old->key);
            old->cached = false;
            if (old->users == 0) close_ep(*old);
        }
        return e;
    }

    // The consumer's window key for this endpoint.
    Status rkey_for(EpEntry& e, const std::string& b64, uint64_t window) {
        if (e.rkey && e.rkey_blob == b64 && e.window == window) return Status::ok();
        auto blob = base64_decode(b64);
        if (!blob) return blob.status();
        // ucp_ep_rkey_unpack takes no length: the key is checked first,
        // then unpacked from a copy with zeros after it (peer_address.hpp).
        auto checked = parse_ucx_rkey(blob.value());
        if (!checked) {
            ++rkeys_refused_;
            return checked.status();
        }
        blob->append(kUcxRkeyPadding, '\0');
        ucp_rkey_h rk = nullptr;
        ucs_status_t s = ucp_ep_rkey_unpack(e.ep, blob->data(), &rk);
        if (s != UCS_OK)
            return ucx_error(DYAD_RC_UCXRKEY_UNPACK_FAILED,
                             "ucp_ep_rkey_unpack of the consumer's window", s);
        if (e.rkey) ucp_rkey_destroy(e.rkey);  // a new window: a new key
        e.rkey = rk;
        e.rkey_blob = b64;
        e.window = window;
        void* here = nullptr;
        e.window_here = ucp_rkey_ptr(rk, window, &here) == UCS_OK && !no_direct_
                            ? static_cast<char*>(here)
                            : nullptr;
        return Status::ok();
    }

  public:
    size_t cached_endpoints() const { return lru_.size(); }
    bool no_direct_ = false;  // DYAD_UCX_DIRECT=0: always put, never read into the window
    uint64_t put_transfers_ = 0;
    uint64_t direct_transfers_ = 0;
    uint64_t eps_native_ = 0;
    uint64_t eps_emulated_ = 0;
    std::string last_transports_;
    uint64_t tag_transfers_ = 0;
    uint64_t addresses_refused_ = 0;  // failed parse_ucx_worker_address / ucx_address_fits
    uint64_t rkeys_refused_ = 0;      // failed parse_ucx_rkey
    uint64_t eps_failed_ = 0;

  private:
    UcxAddressInfo own_;  // this worker's address, parsed
    asio::io_context& io_;
    std::unique_ptr<Worker> worker_;
    asio::posix::stream_descriptor efd_;
    size_t cap_;
    std::list<std::shared_ptr<EpEntry>> lru_;
    std::unordered_map<std::string, std::list<std::shared_ptr<EpEntry>>::iterator> index_;
    Attributes attrs_;
    bool kick_pending_ = false;
    size_t outstanding_ = 0;  // sends and flushes whose `done` has not run
    asio::steady_timer tick_;
    bool ticking_ = false;
};

void UcxTransfer::write_chunk(const char* p, size_t n, nlohmann::json,
                              std::function<void(bool)> done) {
    sender_->send_chunk(*ep_, tag_, p, n, std::move(done));
}

UcxTransfer::~UcxTransfer() {
    sender_->release(*ep_);
}

// Issues waiting chunks while the consumer has free slots.
void UcxPutTransfer::issue() {
    if (failed_) return;
    for (auto& c : waiting_) {
        if (c.issued) continue;
        if (slots_.full()) break;
        c.issued = true;
        c.slot = static_cast<size_t>(slots_.next_seq() % nslots_);
        slots_.push(c.slot);
        auto self = std::static_pointer_cast<UcxPutTransfer>(shared_from_this());
        Chunk* cp = &c;
        sender_->put_chunk(*ep_, c.p, c.n, window_ + c.slot * kUcxChunk, [self, cp](bool ok) {
            cp->complete = true;
            self->completed(ok);
        });
    }
}

// Completions are announced in file order. After a failure every chunk is
// given back as failed, except puts still in flight: they finish first.
void UcxPutTransfer::completed(bool ok) {
    if (!ok) failed_ = true;
    if (failed_) {
        for (auto it = waiting_.begin(); it != waiting_.end();) {
            if (it->issued && !it->complete) {
                ++it;
                continue;
            }
            auto done = std::move(it->done);
            it = waiting_.erase(it);
            if (done) done(false);
        }
        return;
    }
    while (!waiting_.empty() && waiting_.front().complete) {
        Chunk c = std::move(waiting_.front());
        waiting_.pop_front();
        job().ch->send(proto::UcxPutNotice{c.slot, c.n}.build());
        c.done(true);
    }
}

UcxPutTransfer::~UcxPutTransfer() {
    sender_->release(*ep_);
}

}  // namespace

Result<std::unique_ptr<Sender>> make_sender(asio::io_context& io, const ServiceBind& bind,
                                            const UcxServiceOptions& o) {
    return UcxSender::create(io, bind, o);
}

}  // namespace dyad::dtl::ucx
