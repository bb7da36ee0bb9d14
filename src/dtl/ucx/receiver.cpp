// SPDX-License-Identifier: Apache-2.0
// The UCX transport, consumer side: one process-wide UCP context and
// worker with the wakeup feature; a bounded registered receive window
// (DYAD_UCX_WINDOW, default 64 MiB) cut into chunk slots; receives are
// posted ahead into free slots and completed in order (tag mode), or the
// service puts into the slots and says so on the fetch channel (put mode).
// Waiting is event-driven: poll() on the worker's event fd and the fetch
// channel together, with the inactivity deadline, so an error or the
// service's death ends the wait at once.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/base64.hpp"
#include "common/log.hpp"
#include "common/settings.hpp"
#include "common/json_text.hpp"
#include "dtl/write_behind.hpp"
#include "ucx.hpp"

namespace dyad::dtl::ucx {
namespace {

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
    bool held = false;      // with the writer, until its write is done
    uint64_t write_no = 0;  // the writer's number for it
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
        static pid_t owner = 0;
        std::lock_guard<std::mutex> lk(mu);
        // UCX is not fork-safe: a forked child (a DataLoader worker) makes
        // its own context and leaves the parent's alone (not destroyed: it
        // shares state with the parent).
        if (owner != ::getpid()) {
            inst = nullptr;
            failed = Status::ok();
            owner = ::getpid();
        }
        if (inst) return inst;
        if (!failed.is_ok()) return failed;
        std::string proto = settings::text("DYAD_UCX_PROTO");
        if (proto != "auto" && proto != "tag" && proto != "put") {
            failed = Status(DYAD_RC_BADDTLMODE,
                            "DYAD_UCX_PROTO='" + proto + "': use auto, tag or put", EINVAL);
            return failed;
        }
        auto win = settings::size("DYAD_UCX_WINDOW");
        if (win && (win.value() < kUcxChunk || win.value() > (1ull << 31)))
            win = Status(DYAD_RC_NOCTX,
                         "DYAD_UCX_WINDOW=" + std::to_string(win.value()) +
                             " is outside [4M, 2G] (at least one 4 MiB chunk)",
                         EINVAL);
        if (!win) {
            failed = win.status();
            return failed;
        }
        size_t window = static_cast<size_t>(win.value());
        auto w = Worker::create();
        if (!w) {
            failed = w.status();
            return failed;
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
        // The window's remote key, packed once: producers put into it.
        void* rk = nullptr;
        size_t rklen = 0;
        s = ucp_rkey_pack(w.value()->context(), mem, &rk, &rklen);
        if (s != UCS_OK) {
            ucp_mem_unmap(w.value()->context(), mem);
            failed =
                ucx_error(DYAD_RC_UCXRKEY_PACK_FAILED, "ucp_rkey_pack of the receive window", s);
            return failed;
        }
        std::string rkey(static_cast<const char*>(rk), rklen);
        ucp_rkey_buffer_release(rk);
        inst = new UcxConsumer(std::move(w.value()), mem, static_cast<char*>(ma.address), ma.length,
                               base64_encode(rkey), proto);
        return inst;
    }

    std::mutex& mutex() { return mu_; }
    Worker& worker() { return *worker_; }
    char* window() { return window_; }
    size_t window_size() const { return window_size_; }
    uint64_t next_tag() { return (static_cast<uint64_t>(::getpid()) << 32) | ++counter_; }
    const std::string& identity() const { return identity_; }
    const std::string& rkey_b64() const { return rkey_b64_; }
    const std::string& proto() const { return proto_; }

  private:
    UcxConsumer(std::unique_ptr<Worker> w, ucp_mem_h mem, char* win, size_t len,
                std::string rkey_b64, std::string proto)
        : worker_(std::move(w)),
          mem_(mem),
          window_(win),
          window_size_(len),
          identity_(process_identity()),
          rkey_b64_(std::move(rkey_b64)),
          proto_(std::move(proto)) {}
    std::unique_ptr<Worker> worker_;
    ucp_mem_h mem_;
    char* window_;
    size_t window_size_;
    std::string identity_;
    std::string rkey_b64_;
    std::string proto_;
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
                {"ucx_consumer", c_->identity()},
                {"ucx_proto", c_->proto()},
                {"ucx_rkey", c_->rkey_b64()},
                {"ucx_window", reinterpret_cast<uintptr_t>(c_->window())},
                {"ucx_window_size", c_->window_size()}};
    }

    Result<nlohmann::json> receive(FetchChannel& ch, Sink& sink) override {
        std::lock_guard<std::mutex> lk(c_->mutex());  // the worker is single-threaded
        const double idle_s = ch.idle_s();
        // First answer: the size and chunk size (or an error).
        auto f = ch.first("UCX");
        if (!f) return f.status();
        auto size_field = meta_u64(f->meta, "size");
        size_t chunk = meta_u64(f->meta, "chunk").value_or(kUcxChunk);
        if (!size_field || f->data_len != 0 || chunk == 0 || chunk > (64u << 20))
            return Status(DYAD_RC_BADRPC,
                          "bad first answer in a UCX fetch: " +
                              f->meta.dump(-1, ' ', false, kBadUtf8Replaced),
                          EPROTO);
        uint64_t size = *size_field;
        // Every receive lands in the window: a chunk larger than the window
        // would be written past its end.
        if (chunk > c_->window_size())
            return Status(DYAD_RC_BADRPC,
                          "UCX chunk of " + std::to_string(chunk) + " bytes exceeds the " +
                              std::to_string(c_->window_size()) + "-byte DYAD_UCX_WINDOW",
                          EPROTO);
        size_t nslots = c_->window_size() / chunk;
        if (meta_str(f->meta, "mode").value_or("tag") == "put")
            return receive_put(ch, sink, size, chunk, nslots);
        // Files of more than kUcxTagPosted chunks are written behind where
        // DYAD_WRITE_BEHIND says so: a writer thread hashes and writes each
        // received slot while the next ones are received into the others.
        std::unique_ptr<BackgroundWriter> writer;
        if (size > kUcxTagPosted * chunk) {
            auto on = write_behind();
            if (!on) return on.status();
            if (on.value()) writer = std::make_unique<BackgroundWriter>(sink);
        }
        // Tag mode uses a ring of at most kUcxTagPosted slots, and
        // kUcxWriteQueued more for the writer (ucx.hpp).
        nslots = std::min(nslots, kUcxTagPosted + (writer ? kUcxWriteQueued : 0));
        const size_t max_posted = std::min(nslots, kUcxTagPosted);
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
            while (inflight < max_posted && posted < size) {
                RecvSlot& s = slots[next];
                // Slots are reused in turn: the next one may still be
                // queued for the writer.
                if (s.held && writer->written() <= s.write_no) break;
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
                if (writer) {
                    auto k = writer->submit(s.buf, s.length);
                    if (!k) {
                        err = k.status();
                        break;
                    }
                    s.held = true;
                    s.write_no = k.value();
                } else {
                    Status w = sink.write(s.buf, s.length);
                    if (!w) {
                        err = w;
                        break;
                    }
                }
                received += s.length;
                idle = Deadline::after(idle_s);  // progress: the inactivity clock restarts
                --inflight;
                head = (head + 1) % nslots;
                err = post();
                continue;
            }
            if (inflight == 0) {
                // Nothing posted: every free slot is with the writer. Its
                // write is local, so this wait has no network deadline.
                if (!writer || !slots[next].held) {
                    err = Status(DYAD_RC_BADFETCH, "UCX receive ring stalled", EIO);
                    break;
                }
                err = writer->wait_written(slots[next].write_no + 1);
                if (err.is_ok()) err = post();
                continue;
            }
            // Nothing ready: sleep on the worker's event fd and the RPC socket.
            ucs_status_t as = ucp_worker_arm(c_->worker().get());
            if (as == UCS_ERR_BUSY) continue;
            if (as != UCS_OK) {
                err = ucx_error(DYAD_RC_UCXWAIT_FAIL, "ucp_worker_arm", as);
                break;
            }
            struct pollfd pf[2] = {{c_->worker().efd(), POLLIN, 0}, {ch.fd(), POLLIN, 0}};
            const bool ready = ch.buffered();
            int n = ::poll(pf, 2, ready ? 0 : idle.poll_ms());
            if (n < 0 && errno == EINTR) continue;
            if (ready) pf[1].revents |= POLLIN;
            if ((n == 0 && !ready) || idle.expired()) {
                err = Status(DYAD_RC_TIMEOUT, "no UCX data for " + std::to_string(idle_s) + " s",
                             ETIMEDOUT);
                break;
            }
            if (pf[1].revents) {
                // The service spoke: an error, or (rarely before the last
                // chunk is processed here) the end trailer.
                auto g = ch.next();
                if (!g) {
                    err = g.status();
                    break;
                }
                if (g->kind != FetchChannel::Kind::end) {
                    err = Status(DYAD_RC_BADRPC, "unexpected frame in a UCX fetch", EPROTO);
                    break;
                }
                trailer = g->meta;
                have_trailer = true;
            }
        }
        if (err.is_ok() && writer) err = writer->finish();
        if (!err.is_ok()) {
            cancel_all();
            return err;
        }
        if (!have_trailer) return ch.end("UCX");
        return trailer;
    }

  private:
    // Put mode: the service writes chunk k into window slot k % nslots and
    // says so on the RPC (`{"slot", "len"}`, in order); each slot written to
    // the file goes back as a credit (an UPDATE frame).
    Result<nlohmann::json> receive_put(FetchChannel& ch, Sink& sink, uint64_t size, size_t chunk,
                                       size_t nslots) {
        if (chunk > c_->window_size())
            return Status(DYAD_RC_BADRPC, "UCX put chunk larger than the window", EPROTO);
        const double idle_s = ch.idle_s();
        uint64_t received = 0, seq = 0;
        Deadline idle = Deadline::after(idle_s);
        for (;;) {
            // Emulated put (forced over TCP) needs this worker's progress;
            // native put does not, and then this is one cheap call per chunk.
            c_->worker().progress();
            ucs_status_t as = ucp_worker_arm(c_->worker().get());
            if (as == UCS_ERR_BUSY) continue;
            if (as != UCS_OK) return ucx_error(DYAD_RC_UCXWAIT_FAIL, "ucp_worker_arm", as);
            struct pollfd pf[2] = {{ch.fd(), POLLIN, 0}, {c_->worker().efd(), POLLIN, 0}};
            const bool ready = ch.buffered();
            int n = ::poll(pf, 2, ready ? 0 : idle.poll_ms());
            if (n < 0 && errno == EINTR) continue;
            if (ready) pf[0].revents |= POLLIN;
            if ((n == 0 && !ready) || idle.expired())
                return Status(DYAD_RC_TIMEOUT,
                              "no UCX put notice for " + std::to_string(idle_s) + " s", ETIMEDOUT);
            if (!pf[0].revents) continue;  // UCX events only
            idle = Deadline::after(idle_s);
            auto g = ch.next();
            if (!g) return g.status();
            if (g->data_len != 0)
                return Status(DYAD_RC_BADRPC, "unexpected data in a UCX put fetch", EPROTO);
            if (g->kind == FetchChannel::Kind::end) {
                if (received != size)
                    return Status(DYAD_RC_BADFETCH,
                                  "UCX put fetch ended after " + std::to_string(received) + " of " +
                                      std::to_string(size) + " bytes",
                                  EIO);
                return g->meta;
            }
            // Chunk `seq` is in slot seq % nslots: hand it over, acknowledge it.
            auto slot = meta_u64(g->meta, "slot");
            auto len = meta_u64(g->meta, "len");
            uint64_t expect = std::min<uint64_t>(chunk, size - received);
            if (!slot || !len || *slot != seq % nslots || *len != expect)
                return Status(DYAD_RC_BADFETCH,
                              "UCX put notice " + g->meta.dump(-1, ' ', false, kBadUtf8Replaced) +
                                  ", expected slot " + std::to_string(seq % nslots) + " (" +
                                  std::to_string(expect) + " bytes)",
                              EPROTO);
            Status w = sink.write(c_->window() + *slot * chunk, static_cast<size_t>(*len));
            if (!w) return w;
            received += *len;
            if (received < size) {
                // `credit` too, for a service of the first release.
                Status u = ch.update({{"ack", seq}, {"credit", 1}});
                if (!u) return u;
            }
            ++seq;
        }
    }

    UcxConsumer* c_;
    Attributes attrs_;
    uint64_t tag_ = 0;
};

}  // namespace

Result<std::unique_ptr<Receiver>> make_receiver() {
    auto c = UcxConsumer::instance();
    if (!c) return c.status();
    return std::unique_ptr<Receiver>(new UcxReceiver(c.value()));
}

Status warmup() {
    return UcxConsumer::instance().status();
}

}  // namespace dyad::dtl::ucx
