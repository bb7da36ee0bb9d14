// SPDX-License-Identifier: Apache-2.0
// The UCX transport, consumer side: one process-wide UCP context with the
// wakeup feature and up to kUcxLanes lanes, each a worker and a bounded
// registered receive window (DYAD_UCX_WINDOW, default 64 MiB, for the
// first) held by one fetch at a time, so fetches run in parallel; the
// window is cut into chunk slots, run by the consumer's chunk window
// (receive_window.hpp). Receives are posted ahead
// into free slots and completed in order (tag mode), or the service puts
// into the slots and says so on the fetch channel (put mode). Waiting is
// event-driven: poll() on the worker's event fd and the fetch channel
// together, with the inactivity deadline, so an error or the service's
// death ends the wait at once.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "common/base64.hpp"
#include "common/json_text.hpp"
#include "common/log.hpp"
#include "dtl/per_process.hpp"
#include "dtl/receive_window.hpp"
#include "dtl/write_behind.hpp"
#include "proto/transfer.hpp"
#include "ucx.hpp"

namespace dyad::dtl::ucx {
namespace {

// One receive at a time: a worker on the process's UCP context and a
// registered window whose remote key is packed once (producers put into
// it). A lane is leased by one fetch from its receiver's creation to its
// end, so its worker is only ever progressed by that fetch's thread and
// only that fetch's chunks land in its window.
struct Lane {
    std::unique_ptr<Worker> worker;
    ucp_mem_h mem = nullptr;
    char* window = nullptr;
    size_t window_size = 0;
    std::string address_b64;
    std::string rkey_b64;
    bool busy = false;
};

// The consumer's UCX state, per process: one UCP context, lanes made on
// demand up to kUcxLanes (receives beyond that wait for a lane to come
// back; every holder is a fetch bounded by its own deadlines).
class UcxConsumer {
  public:
    static Result<UcxConsumer*> instance() {
        struct State {
            UcxConsumer* inst = nullptr;
            Status failed;
        };
        static PerProcess<State> state;
        auto st = state.lock();
        if (st->inst) return st->inst;
        if (!st->failed.is_ok()) return st->failed;
        auto made = create();
        if (!made)
            st->failed = made.status();
        else
            st->inst = made.value();
        return made;
    }

    // A free lane for one fetch: the first free in the order they were
    // made (so a process that runs few fetches at once keeps to few lanes,
    // and the service to few endpoints), a new one while fewer than
    // kUcxLanes exist, or the first to come back.
    Result<Lane*> acquire() {
        std::unique_lock<std::mutex> lk(mu_);
        for (;;) {
            for (auto& l : lanes_)
                if (!l->busy) {
                    l->busy = true;
                    return l.get();
                }
            if (lanes_.size() < kUcxLanes) {
                // Later lanes get a window of kUcxDepth chunks at most: the
                // service keeps that many in flight; a process running many
                // fetches at once does not map many full windows.
                auto l = make_lane(Worker::sibling(*lanes_.front()->worker),
                                   std::min<uint64_t>(opts_.window, kUcxDepth * kUcxChunk));
                if (!l) return l.status();
                l.value()->busy = true;
                lanes_.push_back(std::move(l.value()));
                return lanes_.back().get();
            }
            freed_.wait(lk);
        }
    }
    void release(Lane* l) {
        {
            std::lock_guard<std::mutex> lk(mu_);
            l->busy = false;
        }
        freed_.notify_one();
    }

    uint64_t next_tag() { return (static_cast<uint64_t>(::getpid()) << 32) | ++counter_; }
    const std::string& identity() const { return identity_; }
    const std::string& proto() const { return opts_.proto; }
    const WriteBehindOption& write_behind() const { return opts_.write_behind; }

  private:
    UcxConsumer(UcxConsumerOptions o, std::unique_ptr<Lane> first)
        : opts_(std::move(o)), identity_(process_identity()) {
        lanes_.push_back(std::move(first));
    }

    // The context with its first lane (a window of DYAD_UCX_WINDOW).
    static Result<UcxConsumer*> create() {
        auto o = UcxConsumerOptions::from_settings();
        if (!o) return o.status();
        WorkerOptions wo;
        wo.shared_context = true;
        auto l = make_lane(Worker::create(wo), o->window);
        if (!l) return l.status();
        return new UcxConsumer(std::move(o.value()), std::move(l.value()));
    }

    static Result<std::unique_ptr<Lane>> make_lane(Result<std::unique_ptr<Worker>> w,
                                                   uint64_t window) {
        if (!w) return w.status();
        auto l = std::make_unique<Lane>();
        l->worker = std::move(w.value());
        ucp_context_h ctx = l->worker->context();
        ucp_mem_map_params_t mp;
        std::memset(&mp, 0, sizeof mp);
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        mp.length = static_cast<size_t>(window);
        mp.flags = UCP_MEM_MAP_ALLOCATE;
        ucs_status_t s = ucp_mem_map(ctx, &mp, &l->mem);
        if (s != UCS_OK)
            return ucx_error(DYAD_RC_UCXMMAP_FAIL, "ucp_mem_map of the receive window", s);
        ucp_mem_attr_t ma;
        ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
        ucp_mem_query(l->mem, &ma);
        void* rk = nullptr;
        size_t rklen = 0;
        s = ucp_rkey_pack(ctx, l->mem, &rk, &rklen);
        if (s != UCS_OK) {
            ucp_mem_unmap(ctx, l->mem);
            return ucx_error(DYAD_RC_UCXRKEY_PACK_FAILED, "ucp_rkey_pack of the receive window", s);
        }
        l->rkey_b64 = base64_encode(std::string(static_cast<const char*>(rk), rklen));
        ucp_rkey_buffer_release(rk);
        l->window = static_cast<char*>(ma.address);
        l->window_size = ma.length;
        l->address_b64 = base64_encode(l->worker->address());
        return l;
    }

    UcxConsumerOptions opts_;
    std::string identity_;
    std::mutex mu_;
    std::condition_variable freed_;
    std::vector<std::unique_ptr<Lane>> lanes_;  // lanes_[0] owns the context
    std::atomic<uint32_t> counter_{0};
};

// What the tag and put movers share: the worker's wait, on its event fd
// and the fetch channel together, within the window's deadline. True: the
// channel has something to read; false: UCX events only (or a wait to do
// again); TIMEOUT ("no UCX <what> for N s") when nothing came in time.
Result<bool> wait_ucx_or_channel(Lane& l, FetchChannel& ch, const ReceiveWindow& w,
                                 const char* what) {
    ucs_status_t as = ucp_worker_arm(l.worker->get());
    if (as == UCS_ERR_BUSY) return false;
    if (as != UCS_OK) return ucx_error(DYAD_RC_UCXWAIT_FAIL, "ucp_worker_arm", as);
    struct pollfd pf[2] = {{ch.fd(), POLLIN, 0}, {l.worker->efd(), POLLIN, 0}};
    const bool ready = ch.buffered();
    int n = ::poll(pf, 2, ready ? 0 : w.idle().poll_ms());
    if (n < 0 && errno == EINTR) return false;
    if (ready) pf[0].revents |= POLLIN;
    if ((n == 0 && !ready) || w.idle().expired())
        return Status(
            DYAD_RC_TIMEOUT,
            std::string("no UCX ") + what + " for " + std::to_string(w.shape().idle_s) + " s",
            ETIMEDOUT);
    return pf[0].revents != 0;
}

// Tag mode: a receive posted ahead into each slot, tagged with this fetch's
// tag; the service sends the chunks in order.
class TagMover : public ChunkMover {
  public:
    TagMover(Lane& l, FetchChannel& ch, uint64_t tag, size_t slots)
        : l_(l), ch_(ch), tag_(tag), ops_(slots) {}

    Result<bool> start(ReceiveWindow& w, ChunkSlot& s, bool) override {
        free_request(s);  // (already free: handed over or cancelled)
        Op& op = ops_[s.index];
        op = Op();
        op.w = &w;
        op.slot = &s;
        ucp_request_param_t p;
        std::memset(&p, 0, sizeof p);
        // Always a request and a callback, even for a message already
        // waiting (UCX 1.13 does not report its length otherwise).
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        p.cb.recv = done;
        p.user_data = &op;
        p.recv_info.tag_info = &op.info;
        ucs_status_ptr_t r = ucp_tag_recv_nbx(l_.worker->get(), s.buf, s.len, tag_, ~0ull, &p);
        if (UCS_PTR_IS_ERR(r))
            return ucx_error(DYAD_RC_UCXCOMM_FAIL, "ucp_tag_recv_nbx", UCS_PTR_STATUS(r));
        if (r == nullptr)  // not expected with NO_IMM_CMPL; handled anyway
            w.complete(s, Status::ok(), op.info.length);
        else
            op.req = r;
        return true;
    }

    Status wait(ReceiveWindow& w) override {
        if (l_.worker->progress()) {
            w.progressed();
            return Status::ok();
        }
        auto spoke = wait_ucx_or_channel(l_, ch_, w, "data");
        if (!spoke) return spoke.status();
        if (!spoke.value()) return Status::ok();
        // The service spoke: an error, or (rarely before the last chunk is
        // processed here) the end trailer.
        auto g = ch_.next();
        if (!g) return g.status();
        if (g->kind != FetchChannel::Kind::end)
            return Status(DYAD_RC_BADRPC, "unexpected frame in a UCX fetch", EPROTO);
        trailer_ = g->meta;
        return Status::ok();
    }

    // The chunk is with the sink or the writer: its request goes (no
    // acknowledgement in tag mode).
    Status handed_over(const ReceiveWindow&, const ChunkSlot& s) override {
        free_request(s);
        return Status::ok();
    }

    Result<nlohmann::json> end(ReceiveWindow&) override {
        if (trailer_) return *trailer_;
        return ch_.end(name_of(Kind::ucx));
    }

    void cancel(ChunkSlot& s) override {
        if (ops_[s.index].req) ucp_request_cancel(l_.worker->get(), ops_[s.index].req);
    }
    // Cancelled requests complete on the next progress calls.
    void settle() override { l_.worker->progress(); }
    double cancel_seconds() const override { return 1e9; }  // 1,000 rounds bound it
    void cancelled(ReceiveWindow& w, bool) override {
        for (auto& s : w.slots()) free_request(s);
    }

  private:
    struct Op {
        ucp_tag_recv_info_t info{};
        void* req = nullptr;
        ReceiveWindow* w = nullptr;
        ChunkSlot* slot = nullptr;
    };
    static void done(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
        auto* op = static_cast<Op*>(user);
        op->w->complete(*op->slot,
                        status == UCS_OK ? Status::ok()
                                         : ucx_error(DYAD_RC_UCXCOMM_FAIL, "UCX receive", status),
                        info ? info->length : 0);
    }
    void free_request(const ChunkSlot& s) {
        Op& op = ops_[s.index];
        if (op.req) ucp_request_free(op.req);
        op.req = nullptr;
    }

    Lane& l_;
    FetchChannel& ch_;
    uint64_t tag_;
    std::vector<Op> ops_;  // by slot
    std::optional<nlohmann::json> trailer_;
};

// Put mode: the service writes chunk k into window slot k % slots and says
// so on the fetch channel (a put notice, proto::UcxPutNotice, in order); each slot written
// to the file goes back as a credit (an UPDATE frame).
class PutMover : public ChunkMover {
  public:
    PutMover(Lane& l, FetchChannel& ch) : l_(l), ch_(ch) {}

    // Every free slot is open to the service's puts.
    Result<bool> start(ReceiveWindow&, ChunkSlot&, bool) override { return true; }

    Status wait(ReceiveWindow& w) override {
        // Emulated put (forced over TCP) needs this worker's progress;
        // native put does not, and then this is one cheap call per chunk.
        l_.worker->progress();
        auto spoke = wait_ucx_or_channel(l_, ch_, w, "put notice");
        if (!spoke) return spoke.status();
        if (!spoke.value()) return Status::ok();  // UCX events only
        w.progressed();
        return notice(w);
    }

    Status handed_over(const ReceiveWindow& w, const ChunkSlot& s) override {
        if (w.received() >= w.size()) return Status::ok();
        // `credit` too, for a service of the first release.
        return ch_.update(proto::UcxAck::of(s.seq).build());
    }

    Result<nlohmann::json> end(ReceiveWindow& w) override {
        while (!trailer_) {
            Status st = wait(w);
            if (!st) return st;
        }
        return *trailer_;
    }

    // Nothing of ours is in flight: the service's puts land or not.
    void cancel(ChunkSlot&) override {}
    void settle() override {}
    int cancel_rounds() const override { return 0; }

  private:
    // One frame of the service: the notice of the oldest chunk, or the end.
    Status notice(ReceiveWindow& w) {
        auto g = ch_.next();
        if (!g) return g.status();
        if (g->data_len != 0)
            return Status(DYAD_RC_BADRPC, "unexpected data in a UCX put fetch", EPROTO);
        if (g->kind == FetchChannel::Kind::end) {
            if (w.received() != w.size())
                return Status(DYAD_RC_BADFETCH,
                              "UCX put fetch ended after " + std::to_string(w.received()) + " of " +
                                  std::to_string(w.size()) + " bytes",
                              EIO);
            trailer_ = g->meta;
            return Status::ok();
        }
        // Chunk `seq` is in slot seq % slots: hand it over (the window
        // acknowledges it).
        const size_t nslots = w.shape().slots;
        const uint64_t seq = w.delivered();
        ChunkSlot* head = w.head();
        uint64_t expect = head ? head->len : 0;
        auto n = proto::UcxPutNotice::parse(g->meta);
        if (!head || !n || n->slot != seq % nslots || n->len != expect)
            return Status(DYAD_RC_BADFETCH,
                          "UCX put notice " + g->meta.dump(-1, ' ', false, kBadUtf8Replaced) +
                              ", expected slot " + std::to_string(seq % nslots) + " (" +
                              std::to_string(expect) + " bytes)",
                          EPROTO);
        w.complete(*head, Status::ok(), static_cast<size_t>(n->len));
        return Status::ok();
    }

    Lane& l_;
    FetchChannel& ch_;
    std::optional<nlohmann::json> trailer_;
};

class UcxReceiver : public Receiver {
  public:
    UcxReceiver(UcxConsumer* c, Lane* l) : c_(c), l_(l), attrs_(ucx_attributes()) {}
    ~UcxReceiver() override { c_->release(l_); }
    UcxReceiver(const UcxReceiver&) = delete;
    UcxReceiver& operator=(const UcxReceiver&) = delete;
    const Attributes& attributes() const override { return attrs_; }
    nlohmann::json describe() override {
        tag_ = c_->next_tag();
        proto::UcxRequest r;
        r.worker = l_->address_b64;
        r.tag = tag_;
        r.consumer = c_->identity();
        r.proto = c_->proto();
        r.window = proto::UcxRequest::Window{reinterpret_cast<uintptr_t>(l_->window),
                                             l_->window_size, l_->rkey_b64};
        return r.build();
    }

    Result<nlohmann::json> receive(FetchChannel& ch, Sink& sink) override {
        // First answer: the size and chunk size (or an error).
        auto f = ch.first(name_of(Kind::ucx));
        if (!f) return f.status();
        auto start = proto::UcxStart::parse(f->meta);
        if (!start) return start.status();
        if (f->data_len != 0)
            return Status(DYAD_RC_BADRPC,
                          "bad first answer in a UCX fetch: " +
                              f->meta.dump(-1, ' ', false, kBadUtf8Replaced),
                          EPROTO);
        size_t chunk = start->chunk.value_or(kUcxChunk);
        // Every receive lands in the window: a chunk larger than the window
        // would be written past its end.
        if (chunk > l_->window_size)
            return Status(DYAD_RC_BADRPC,
                          "UCX chunk of " + std::to_string(chunk) + " bytes exceeds the " +
                              std::to_string(l_->window_size) + "-byte DYAD_UCX_WINDOW",
                          EPROTO);
        WindowShape shape;
        shape.size = start->start.size;
        shape.chunk = chunk;
        shape.slots = l_->window_size / chunk;
        shape.depth = shape.slots;
        shape.memory = l_->window;
        shape.idle_s = ch.idle_s();
        shape.what = name_of(Kind::ucx);
        if (start->put()) {
            ReceiveWindow w(shape);
            PutMover put(*l_, ch);
            return w.run(put, sink);
        }
        return receive_tag(ch, sink, shape);
    }

  private:
    // Files of more than kUcxTagPosted chunks are written behind where
    // DYAD_WRITE_BEHIND says so: a writer thread hashes and writes each
    // received slot while the next ones are received into the others. Tag
    // mode uses a ring of at most kUcxTagPosted slots, and kUcxWriteQueued
    // more for the writer (ucx.hpp).
    Result<nlohmann::json> receive_tag(FetchChannel& ch, Sink& sink, WindowShape shape) {
        std::unique_ptr<BackgroundWriter> writer;
        if (shape.size > kUcxTagPosted * shape.chunk) {
            const auto& on = c_->write_behind().on;
            if (!on) return on.status();
            if (on.value()) writer = std::make_unique<BackgroundWriter>(sink);
        }
        shape.slots = std::min(shape.slots, kUcxTagPosted + (writer ? kUcxWriteQueued : 0));
        shape.depth = std::min(shape.slots, kUcxTagPosted);
        ReceiveWindow w(shape);
        TagMover tag(*l_, ch, tag_, shape.slots);
        return w.run(tag, sink, writer.get());
    }

    UcxConsumer* c_;
    Lane* l_;  // this fetch's alone until the receiver goes
    Attributes attrs_;
    uint64_t tag_ = 0;
};

}  // namespace

Result<std::unique_ptr<Receiver>> make_receiver() {
    auto c = UcxConsumer::instance();
    if (!c) return c.status();
    auto l = c.value()->acquire();
    if (!l) return l.status();
    return std::unique_ptr<Receiver>(new UcxReceiver(c.value(), l.value()));
}

Status warmup() {
    return UcxConsumer::instance().status();
}

}  // namespace dyad::dtl::ucx
