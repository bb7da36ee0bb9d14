// SPDX-License-Identifier: Apache-2.0
// The UCX transport (DYAD_DTL_MODE=UCX): what its consumer side
// (receiver.cpp) and service side (sender.cpp) share: the worker, errors,
// attributes. The transport's overview is in sender.cpp.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "dtl/options.hpp"
#include "dtl/dtl.hpp"
#include "dtl/peer_address.hpp"

namespace dyad::dtl::ucx {

constexpr const char* kSub = "ucx";
constexpr size_t kUcxChunk = 4u << 20;  // bytes per put, and per slot of the window
constexpr int kUcxDepth = 4;            // chunks in flight per transfer (service)
// Bytes per tagged message (tag mode). 1 MiB, not kUcxChunk: a consumer
// receives into a few slots of its window, and each process touches them
// for the first time; with 4 MiB messages that was 20 MiB of fresh pages
// per process (6,700 page faults for 256 MiB over TCP, against 2,900), and
// UCX over TCP moved 256 MiB at 0.83x the stream, against 1.02x with 1 MiB
// (docs/design.md, UCX, "Tag").
constexpr size_t kUcxTagChunk = 1u << 20;
// Receives a consumer posts ahead in tag mode: one more than the service
// has in flight, so every message finds its receive posted. They cycle
// through the first kUcxTagPosted slots of the window only (5 MiB of it).
constexpr size_t kUcxTagPosted = kUcxDepth + 1;
// Received slots a tag-mode consumer's writer thread may hold (written
// behind, DYAD_WRITE_BEHIND) while the next receives are posted: 2 more
// slots, 7 in all.
constexpr size_t kUcxWriteQueued = 2;
// Fetches a consumer process runs over UCX at once: each has its own lane
// (worker and receive window, receiver.cpp); more wait for a lane. Few:
// the service keeps an endpoint per consumer connection and lane, and
// connections and lanes pair up at random. 1,000 x 64 KiB over TCP in one
// process (DYAD_CONSUME_WINDOW 16): 16 lanes made the service create 324-365
// endpoints (its cache holds 64), 4 lanes 15-16 (docs/design.md, "UCX
// concurrency").
constexpr size_t kUcxLanes = 4;

inline std::string ucs_text(ucs_status_t s) {
    return ucs_status_string(s);
}

inline Status ucx_error(dyad_rc_t rc, const std::string& what, ucs_status_t s) {
    return Status(rc, what + ": " + ucs_text(s), EIO);
}

Attributes ucx_attributes();
// "node/pid/start-time": a consumer process, even across pid reuse.
std::string process_identity();

// UCX's TCP transport, tuned for files rather than messages, on both sides
// unless the user set the variable: 256 MiB between two nodes, 9 interleaved
// rounds each, median 0.89 GB/s against 0.81 with UCX's 8 KiB send segments
// and default socket buffers (docs/design.md, "UCX over TCP").
// ucp_config_modify takes a transport's field by its name without the
// transport's prefix (`SNDBUF`, not `TCP_SNDBUF`: UCX warns of the latter as
// unused); these names are the TCP transport's alone in UCX 1.13.
struct TcpTuning {
    const char* env;  // the user's variable, which wins
    const char* key;
    const char* value;
};
inline constexpr TcpTuning kTcpTuning[] = {
    {"UCX_TCP_TX_SEG_SIZE", "TX_SEG_SIZE", "64K"},
    {"UCX_TCP_RX_SEG_SIZE", "RX_SEG_SIZE", "256K"},
    {"UCX_TCP_SNDBUF", "SNDBUF", "4M"},
    {"UCX_TCP_RCVBUF", "RCVBUF", "4M"},
};

// The UCX network devices (UCX_NET_DEVICES) a service's worker may use
// under its listen policy: UCX's TCP transport listens on every device it
// uses. Empty: no restriction (a keyed service on a wildcard address). A
// keyless service: the loopback interface only. A service on one address:
// that address's interface, plus the RDMA devices (which listen on no TCP
// port). `env`: the user's UCX_NET_DEVICES, kept where the policy allows it.
Result<std::string> ucx_service_net_devices(const ServiceBind& bind, const char* env);

// How a worker is made.
struct WorkerOptions {
    // The worker that connects to consumers' addresses; UCX's unified mode
    // stays off there, whatever UCX_UNIFIED_MODE says, since the address
    // check (peer_address.hpp) knows the layout without it.
    bool service = false;
    // The service's listen policy (service workers only).
    const ServiceBind* bind = nullptr;
    // DYAD_UCX_SHARED_MEMORY (service workers): UCX's shared-memory
    // transports toward consumers too.
    bool shared_memory = false;
    // The context will also carry sibling workers used by other threads at
    // the same time (the consumer's lanes: UCP's mt_workers_shared).
    bool shared_context = false;
};

// A UCP context and one worker with an event fd.
class Worker {
  public:
    static Result<std::unique_ptr<Worker>> create(const WorkerOptions& o = {});
    // Another worker on `parent`'s context (made with shared_context), for
    // another thread; `parent` must outlive it.
    static Result<std::unique_ptr<Worker>> sibling(const Worker& parent);
    ~Worker() {
        if (worker_) ucp_worker_destroy(worker_);
        if (ctx_ && owns_ctx_) ucp_cleanup(ctx_);
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
    Status make_worker();
    ucp_context_h ctx_ = nullptr;
    bool owns_ctx_ = true;
    ucp_worker_h worker_ = nullptr;
    int efd_ = -1;
    std::string address_;
};

// The two sides, for the table of backends (worker.cpp): each gets its
// settings when made (options.hpp).
Result<std::unique_ptr<Receiver>> make_receiver();
Status warmup();
Result<std::unique_ptr<Sender>> make_sender(asio::io_context& io, const ServiceBind& bind,
                                            const UcxServiceOptions& o);

}  // namespace dyad::dtl::ucx
