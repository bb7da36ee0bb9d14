// UCX backend (DYAD_DTL_MODE=UCX). File bytes move as UCX tagged messages
// from the service's worker to the consumer's worker; the fetch RPC carries
// the request (the consumer's worker address and tag), the size, errors and
// the end trailer.
//
// Consumer: one process-wide UCP context and worker with the wakeup feature;
// a bounded registered receive window (DYAD_UCX_WINDOW, default 64 MiB) cut
// into chunk slots; receives are posted ahead into free slots and completed
// in order. Waiting is event-driven: poll() on the worker's event fd and the
// RPC socket together, with the inactivity deadline, so an error or the
// service's death ends the wait at once.
//
// Service: one worker on the event loop (its event fd watched by Asio); an
// endpoint cache keyed by the consumer's identity (node, pid, process start
// time) with LRU eviction (DYAD_UCX_EP_CACHE_SIZE, default 64) and an error
// handler that drops broken endpoints. Sends go through the shared chunk
// pipeline (bounded memory per transfer).
#include <poll.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <list>
#include <mutex>
#include <unordered_map>

#include "chunked.hpp"
#include "common/base64.hpp"
#include "common/config.hpp"
#include "common/log.hpp"
#include "dtl.hpp"

namespace dyad::dtl {
namespace {

constexpr const char* kSub = "ucx";
constexpr size_t kUcxChunk = 4u << 20;  // bytes per tagged message
constexpr int kUcxDepth = 4;            // chunks in flight per transfer (service)

std::string ucs_text(ucs_status_t s) {
    return ucs_status_string(s);
}

Status ucx_error(dyad_rc_t rc, const std::string& what, ucs_status_t s) {
    return Status(rc, what + ": " + ucs_text(s), EIO);
}

Attributes ucx_attributes() {
    Attributes a;
    a.name = "UCX";
    a.latency_us = 10;
    a.bandwidth_gbps = 6.0;
    a.rma_native = false;  // this backend moves bytes by tagged messages
    a.max_message = kUcxChunk;
    unsigned maj = 0, min = 0, rel = 0;
    ucp_get_version(&maj, &min, &rel);
    auto tls = env("UCX_TLS");
    a.info = "UCX " + std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel) +
             ", UCX_TLS=" + (tls ? *tls : std::string("all"));
    return a;
}

// A UCP context and one worker with an event fd.
class Worker {
  public:
    static Result<std::unique_ptr<Worker>> create() {
        std::unique_ptr<Worker> w(new Worker());
        ucp_config_t* cfg = nullptr;
        ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg);
        if (s != UCS_OK) return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_config_read", s);
        ucp_params_t p;
        std::memset(&p, 0, sizeof p);
        p.field_mask = UCP_PARAM_FIELD_FEATURES;
        p.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
        s = ucp_init(&p, cfg, &w->ctx_);
        ucp_config_release(cfg);
        if (s != UCS_OK) return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_init", s);
        ucp_worker_params_t wp;
        std::memset(&wp, 0, sizeof wp);
        wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        wp.thread_mode = UCS_THREAD_MODE_SINGLE;
        s = ucp_worker_create(w->ctx_, &wp, &w->worker_);
        if (s != UCS_OK) return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_worker_create", s);
        s = ucp_worker_get_efd(w->worker_, &w->efd_);
        if (s != UCS_OK) return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_worker_get_efd", s);
        ucp_address_t* addr = nullptr;
        size_t len = 0;
        s = ucp_worker_get_address(w->worker_, &addr, &len);
        if (s != UCS_OK) return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_worker_get_address", s);
        w->address_.assign(reinterpret_cast<const char*>(addr), len);
        ucp_worker_release_address(w->worker_, addr);
        return w;
    }
    ~Worker() {
        if (worker_) ucp_worker_destroy(worker_);
        if (ctx_) ucp_cleanup(ctx_);
    }
    ucp_context_h context() const { return ctx_; }
    ucp_worker_h get() const { return worker_; }
    int efd() const { return efd_; }
    const std::string& address() const { return address_; }
    // Progresses until idle; true if anything happened.
    bool progress() {
        bool any = false;
        while (ucp_worker_progress(worker_) != 0) any = true;
        return any;
    }

  private:
    Worker() = default;
    ucp_context_h ctx_ = nullptr;
    ucp_worker_h worker_ = nullptr;
    int efd_ = -1;
    std::string address_;
};

// "node/pid/start-time": a consumer process, even across pid reuse.
std::string process_identity() {
    std::string start = "0";
    std::ifstream f("/proc/self/stat");
    std::string line;
    if (std::getline(f, line)) {
        size_t rp = line.rfind(')');
        if (rp != std::string::npos) {
            std::string rest = line.substr(rp + 2);
            size_t field = 3, pos = 0;  // rest starts at field 3 (state)
            while (field < 22 && pos != std::string::npos) {
                pos = rest.find(' ', pos);
                if (pos != std::string::npos) ++pos;
                ++field;
            }
            if (pos != std::string::npos) start = rest.substr(pos, rest.find(' ', pos) - pos);
        }
    }
    return hostname() + "/" + std::to_string(::getpid()) + "/" + start;
}

// ---------------- consumer side ----------------

struct RecvSlot {
    void* req = nullptr;  // null when the receive completed at once
    bool active = false;  // posted and not yet consumed
    bool done = false;
    ucp_tag_recv_info_t info{};
    ucs_status_t status = UCS_OK;
    size_t length = 0;
    size_t expect = 0;
    char* buf = nullptr;
};

void recv_cb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
    (void)request;
    auto* slot = static_cast<RecvSlot*>(user_data);
    slot->done = true;
    slot->status = status;
    slot->length = info ? info->length : 0;
}

class UcxConsumer {
  public:
    static Result<UcxConsumer*> instance() {
        static std::mutex mu;
        static UcxConsumer* inst = nullptr;
        static Status failed;
        std::lock_guard<std::mutex> lk(mu);
        if (inst) return inst;
        if (!failed.is_ok()) return failed;
        auto w = Worker::create();
        if (!w) {
            failed = w.status();
            return failed;
        }
        size_t window = 64u << 20;
        if (auto v = env("DYAD_UCX_WINDOW"); v && !v->empty()) {
            auto u = parse_uint("DYAD_UCX_WINDOW", *v, 2 * 65536, 1u << 31);
            if (!u) {
                failed = u.status();
                return failed;
            }
            window = u.value();
        }
        ucp_mem_map_params_t mp;
        std::memset(&mp, 0, sizeof mp);
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        mp.length = window;
        mp.flags = UCP_MEM_MAP_ALLOCATE;
        ucp_mem_h mem = nullptr;
        ucs_status_t s = ucp_mem_map(w.value()->context(), &mp, &mem);
        if (s != UCS_OK) {
            failed = ucx_error(DYAD_RC_UCXMMAP_FAIL, "ucp_mem_map of the receive window", s);
            return failed;
        }
        ucp_mem_attr_t ma;
        ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
        ucp_mem_query(mem, &ma);
        inst =
            new UcxConsumer(std::move(w.value()), mem, static_cast<char*>(ma.address), ma.length);
        return inst;
    }

    std::mutex& mutex() { return mu_; }
    Worker& worker() { return *worker_; }
    char* window() { return window_; }
    size_t window_size() const { return window_size_; }
    uint64_t next_tag() { return (static_cast<uint64_t>(::getpid()) << 32) | ++counter_; }
    const std::string& identity() const { return identity_; }

  private:
    UcxConsumer(std::unique_ptr<Worker> w, ucp_mem_h mem, char* win, size_t len)
        : worker_(std::move(w)),
          mem_(mem),
          window_(win),
          window_size_(len),
          identity_(process_identity()) {}
    std::unique_ptr<Worker> worker_;
    ucp_mem_h mem_;
    char* window_;
    size_t window_size_;
    std::string identity_;
    std::mutex mu_;
    std::atomic<uint32_t> counter_{0};
};

class UcxReceiver : public Receiver {
  public:
    explicit UcxReceiver(UcxConsumer* c) : c_(c), attrs_(ucx_attributes()) {}
    const Attributes& attributes() const override { return attrs_; }
    nlohmann::json describe() override {
        tag_ = c_->next_tag();
        return {{"ucx_worker", base64_encode(c_->worker().address())},
                {"ucx_tag", tag_},
                {"ucx_consumer", c_->identity()}};
    }

    Result<nlohmann::json> receive(rpc::Connection& conn, uint32_t tag, Sink& sink,
                                   double idle_s) override {
        std::lock_guard<std::mutex> lk(c_->mutex());  // the worker is single-threaded
        // First frame: the size and chunk size (or an error).
        auto f = conn.read_frame(Deadline::after(idle_s));
        if (!f) return f.status();
        if (f->header.type == rpc::Type::error)
            return rpc::Connection::error_status(f.value(), "fetch");
        if (f->header.type != rpc::Type::response || f->header.tag != tag ||
            f->header.data_len != 0)
            return Status(DYAD_RC_BADRPC, "unexpected first frame in a UCX fetch", EPROTO);
        uint64_t size = f->meta.value("size", 0ull);
        size_t chunk = f->meta.value("chunk", static_cast<size_t>(kUcxChunk));
        if (chunk == 0 || chunk > (64u << 20))
            return Status(DYAD_RC_BADRPC, "bad UCX chunk size", EPROTO);
        size_t nslots = std::max<size_t>(1, c_->window_size() / chunk);
        std::vector<RecvSlot> slots(nslots);
        uint64_t posted = 0, received = 0;  // bytes
        size_t head = 0, next = 0;          // slot indices (ring)
        size_t inflight = 0;
        nlohmann::json trailer;
        bool have_trailer = false;
        Status err;
        // Wakeups without data (keepalives) do not extend the wait.
        Deadline idle = Deadline::after(idle_s);

        auto post = [&]() -> Status {
            while (inflight < nslots && posted < size) {
                RecvSlot& s = slots[next];
                s = RecvSlot();
                s.expect = static_cast<size_t>(std::min<uint64_t>(chunk, size - posted));
                s.buf = c_->window() + next * chunk;
                ucp_request_param_t p;
                std::memset(&p, 0, sizeof p);
                // Always a request and a callback, even for a message already
                // waiting (UCX 1.13 does not report its length otherwise).
                p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                 UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
                p.cb.recv = recv_cb;
                p.user_data = &s;
                p.recv_info.tag_info = &s.info;
                ucs_status_ptr_t r =
                    ucp_tag_recv_nbx(c_->worker().get(), s.buf, s.expect, tag_, ~0ull, &p);
                if (UCS_PTR_IS_ERR(r))
                    return ucx_error(DYAD_RC_UCXCOMM_FAIL, "ucp_tag_recv_nbx", UCS_PTR_STATUS(r));
                s.active = true;
                if (r == nullptr) {  // not expected with NO_IMM_CMPL; handled anyway
                    s.done = true;
                    s.status = UCS_OK;
                    s.length = s.info.length;
                } else {
                    s.req = r;
                }
                posted += s.expect;
                ++inflight;
                next = (next + 1) % nslots;
            }
            return Status::ok();
        };
        auto cancel_all = [&] {
            for (auto& s : slots) {
                if (s.req && !s.done) ucp_request_cancel(c_->worker().get(), s.req);
            }
            // Cancelled requests complete on the next progress calls.
            for (int i = 0; i < 1000; ++i) {
                c_->worker().progress();
                bool pending = false;
                for (auto& s : slots) pending |= (s.req && !s.done);
                if (!pending) break;
            }
            for (auto& s : slots) {
                if (s.req) ucp_request_free(s.req);
                s.req = nullptr;
            }
        };

        err = post();
        while (err.is_ok() && received < size) {
            if (c_->worker().progress()) idle = Deadline::after(idle_s);
            RecvSlot& s = slots[head];
            if (s.active && s.done) {
                if (s.status != UCS_OK) {
                    err = ucx_error(DYAD_RC_UCXCOMM_FAIL, "UCX receive", s.status);
                    break;
                }
                if (s.length != s.expect) {
                    err = Status(DYAD_RC_BADFETCH,
                                 "UCX chunk of " + std::to_string(s.length) + " bytes, expected " +
                                     std::to_string(s.expect),
                                 EIO);
                    break;
                }
                if (s.req) ucp_request_free(s.req);
                s.req = nullptr;
                s.active = false;
                Status w = sink.write(s.buf, s.length);
                if (!w) {
                    err = w;
                    break;
                }
                received += s.length;
                idle = Deadline::after(idle_s);  // progress: the inactivity clock restarts
                --inflight;
                head = (head + 1) % nslots;
                err = post();
                continue;
            }
            // Nothing ready: sleep on the worker's event fd and the RPC socket.
            ucs_status_t as = ucp_worker_arm(c_->worker().get());
            if (as == UCS_ERR_BUSY) continue;
            if (as != UCS_OK) {
                err = ucx_error(DYAD_RC_UCXWAIT_FAIL, "ucp_worker_arm", as);
                break;
            }
            struct pollfd pf[2] = {{c_->worker().efd(), POLLIN, 0}, {conn.fd(), POLLIN, 0}};
            int n = ::poll(pf, 2, idle.poll_ms());
            if (n < 0 && errno == EINTR) continue;
            if (n == 0 || idle.expired()) {
                err = Status(DYAD_RC_TIMEOUT, "no UCX data for " + std::to_string(idle_s) + " s",
                             ETIMEDOUT);
                break;
            }
            if (pf[1].revents) {
                // The service spoke on the RPC: an error, or (rarely before the
                // last chunk is processed here) the end trailer.
                auto g = conn.read_frame(Deadline::after(idle_s));
                if (!g) {
                    err = g.status();
                    break;
                }
                if (g->header.type == rpc::Type::error) {
                    err = rpc::Connection::error_status(g.value(), "fetch");
                    break;
                }
                if (g->header.type == rpc::Type::end && g->header.tag == tag) {
                    trailer = g->meta;
                    have_trailer = true;
                }
            }
        }
        if (!err.is_ok()) {
            cancel_all();
            return err;
        }
        if (!have_trailer) {
            auto g = conn.read_frame(Deadline::after(idle_s));
            if (!g) return g.status();
            if (g->header.type == rpc::Type::error)
                return rpc::Connection::error_status(g.value(), "fetch");
            if (g->header.type != rpc::Type::end)
                return Status(DYAD_RC_BADRPC, "expected the end of a UCX fetch", EPROTO);
            trailer = g->meta;
        }
        return trailer;
    }

  private:
    UcxConsumer* c_;
    Attributes attrs_;
    uint64_t tag_ = 0;
};

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
    std::string key;
    ucp_ep_h ep = nullptr;
    int users = 0;
    bool broken = false;
    bool cached = true;
};

class UcxTransfer : public ChunkedTransfer {
  public:
    UcxTransfer(std::shared_ptr<FetchJob> job, SendDone done, UcxSender* s,
                std::shared_ptr<EpEntry> ep, uint64_t tag)
        : ChunkedTransfer(std::move(job), std::move(done), kUcxChunk, kUcxDepth),
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
        return {{"size", job().size}, {"transport", "UCX"}, {"chunk", kUcxChunk}};
    }

  private:
    UcxSender* sender_;
    std::shared_ptr<EpEntry> ep_;
    uint64_t tag_;
};

class UcxSender : public Sender {
  public:
    static Result<std::unique_ptr<Sender>> create(asio::io_context& io) {
        auto w = Worker::create();
        if (!w) return w.status();
        size_t cap = 64;
        if (auto v = env("DYAD_UCX_EP_CACHE_SIZE"); v && !v->empty()) {
            auto u = parse_uint("DYAD_UCX_EP_CACHE_SIZE", *v, 1, 1u << 20);
            if (!u) return u.status();
            cap = u.value();
        }
        std::unique_ptr<UcxSender> s(new UcxSender(io, std::move(w.value()), cap));
        s->watch();
        return std::unique_ptr<Sender>(std::move(s));
    }
    ~UcxSender() override {
        asio::error_code ec;
        efd_.cancel(ec);
        for (auto& e : lru_) close_ep(e->ep, true);
        lru_.clear();
        index_.clear();
        worker_->progress();
    }
    const Attributes& attributes() const override { return attrs_; }

    void send(std::shared_ptr<FetchJob> job, SendDone done) override {
        const auto& a = job->transport_args;
        auto addr_it = a.find("ucx_worker");
        auto tag_it = a.find("ucx_tag");
        auto id_it = a.find("ucx_consumer");
        if (addr_it == a.end() || !addr_it->is_string() || tag_it == a.end() ||
            !tag_it->is_number_unsigned() || id_it == a.end() || !id_it->is_string()) {
            done(Status(DYAD_RC_BADUNPACK, "UCX fetch without ucx_worker, ucx_tag and ucx_consumer",
                        EINVAL),
                 0, "");
            return;
        }
        auto ep = endpoint(*id_it, *addr_it);
        if (!ep) {
            done(ep.status(), 0, "");
            return;
        }
        std::make_shared<UcxTransfer>(std::move(job), std::move(done), this, ep.value(),
                                      tag_it->get<uint64_t>())
            ->start();
        kick();
    }

    void send_chunk(EpEntry& ep, uint64_t tag, const char* p, size_t n,
                    std::function<void(bool)> done) {
        if (ep.broken) {
            asio::post(io_, [done = std::move(done)] { done(false); });
            return;
        }
        auto* ctx = new SendCtx{std::move(done)};
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

    // A transfer let go of its endpoint.
    void release(EpEntry& e) {
        if (--e.users == 0 && !e.cached) close_ep(e.ep, e.broken);
    }

  private:
    UcxSender(asio::io_context& io, std::unique_ptr<Worker> w, size_t cap)
        : io_(io),
          worker_(std::move(w)),
          efd_(io, ::dup(worker_->efd())),
          cap_(cap),
          attrs_(ucx_attributes()) {}

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
    // before the fd ever fires).
    void kick() {
        if (kick_pending_) return;
        kick_pending_ = true;
        asio::post(io_, [this] {
            kick_pending_ = false;
            worker_->progress();
        });
    }

    static void ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
        auto* self = static_cast<UcxSender*>(arg);
        DYAD_WARN(kSub, "endpoint failed (%s): dropped from the cache", ucs_text(status).c_str());
        for (auto it = self->lru_.begin(); it != self->lru_.end(); ++it) {
            if ((*it)->ep == ep) {
                auto e = *it;
                e->broken = true;
                e->cached = false;
                self->index_.erase(e->key);
                self->lru_.erase(it);
                // Closing from inside the callback is not allowed: do it next.
                if (e->users == 0)
                    asio::post(self->io_, [self, e] { self->close_ep(e->ep, true); });
                break;
            }
        }
    }

    void close_ep(ucp_ep_h ep, bool force) {
        ucp_request_param_t p;
        std::memset(&p, 0, sizeof p);
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
        if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);  // completes in the background
    }

    Result<std::shared_ptr<EpEntry>> endpoint(const std::string& key, const std::string& addr_b64) {
        auto it = index_.find(key);
        if (it != index_.end()) {
            lru_.splice(lru_.begin(), lru_, it->second);
            return *it->second;
        }
        auto addr = base64_decode(addr_b64);
        if (!addr) return addr.status();
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
            return ucx_error(DYAD_RC_UCXEP_FAIL, "ucp_ep_create to consumer " + key, s);
        auto e = std::make_shared<EpEntry>();
        e->key = key;
        e->ep = ep;
        lru_.push_front(e);
        index_[key] = lru_.begin();
        while (lru_.size() > cap_) {  // evict the least recently used
            auto old = lru_.back();
            lru_.pop_back();
            index_.erase(old->key);
            old->cached = false;
            if (old->users == 0) close_ep(old->ep, false);
        }
        return e;
    }

  public:
    size_t cached_endpoints() const { return lru_.size(); }

  private:
    asio::io_context& io_;
    std::unique_ptr<Worker> worker_;
    asio::posix::stream_descriptor efd_;
    size_t cap_;
    std::list<std::shared_ptr<EpEntry>> lru_;
    std::unordered_map<std::string, std::list<std::shared_ptr<EpEntry>>::iterator> index_;
    Attributes attrs_;
    bool kick_pending_ = false;
};

void UcxTransfer::write_chunk(const char* p, size_t n, nlohmann::json,
                              std::function<void(bool)> done) {
    sender_->send_chunk(*ep_, tag_, p, n, std::move(done));
}

UcxTransfer::~UcxTransfer() {
    sender_->release(*ep_);
}

}  // namespace

Backend ucx_backend() {
    return {"UCX",
            {},
            ucx_attributes,
            []() -> Result<std::unique_ptr<Receiver>> {
                auto c = UcxConsumer::instance();
                if (!c) return c.status();
                return std::unique_ptr<Receiver>(new UcxReceiver(c.value()));
            },
            [](asio::io_context& io) { return UcxSender::create(io); }};
}

}  // namespace dyad::dtl
