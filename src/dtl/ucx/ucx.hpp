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

#include "common/settings.hpp"
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

// A UCP context and one worker with an event fd.
class Worker {
  public:
    // `service`: the worker that connects to consumers' addresses; UCX's
    // unified mode stays off there, whatever UCX_UNIFIED_MODE says, since
    // the address check (peer_address.hpp) knows the layout without it.
    // `bind`: the service's listen policy (service workers only).
    static Result<std::unique_ptr<Worker>> create(bool service = false,
                                                  const ServiceBind* bind = nullptr) {
        std::unique_ptr<Worker> w(new Worker());
        const char* env_tls = std::getenv("UCX_TLS");
        std::string tls_used = env_tls ? env_tls : "";
        ucp_config_t* cfg = nullptr;
        ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg);
        if (s != UCS_OK) return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_config_read", s);
        if (service) {
            s = ucp_config_modify(cfg, "UNIFIED_MODE", "n");
            if (s != UCS_OK) {
                ucp_config_release(cfg);
                return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_config_modify(UNIFIED_MODE=n)", s);
            }
            // No shared memory toward consumers (peer_address.hpp) unless
            // the operator says every key holder may have it.
            auto shm = settings::flag("DYAD_UCX_SHARED_MEMORY");
            if (!shm) {
                ucp_config_release(cfg);
                return shm.status();
            }
            auto tls = shm.value() ? Result<std::string>(std::string(env_tls ? env_tls : "all"))
                                   : ucx_service_tls(env_tls);
            if (!tls) {
                ucp_config_release(cfg);
                return tls.status();
            }
            tls_used = tls.value();
            s = ucp_config_modify(cfg, "TLS", tls->c_str());
            if (s != UCS_OK) {
                ucp_config_release(cfg);
                return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_config_modify(TLS=" + tls.value() + ")",
                                 s);
            }
            // Listeners where the service's policy says, nowhere else.
            if (bind) {
                auto devs = ucx_service_net_devices(*bind, std::getenv("UCX_NET_DEVICES"));
                if (!devs) {
                    ucp_config_release(cfg);
                    return devs.status();
                }
                if (!devs->empty()) {
                    s = ucp_config_modify(cfg, "NET_DEVICES", devs->c_str());
                    if (s != UCS_OK) {
                        ucp_config_release(cfg);
                        return ucx_error(DYAD_RC_UCXINIT_FAIL,
                                         "ucp_config_modify(NET_DEVICES=" + devs.value() + ")", s);
                    }
                    DYAD_INFO(kSub, "the service's UCX worker uses the network devices %s",
                              devs->c_str());
                }
            }
        }
        // (UCX warns of settings no transport took: only where TCP may be used.)
        for (const TcpTuning& t : kTcpTuning) {
            if (!ucx_tls_may_use_tcp(tls_used)) break;
            if (std::getenv(t.env)) continue;  // the user's word
            s = ucp_config_modify(cfg, t.key, t.value);
            if (s != UCS_OK) {
                ucp_config_release(cfg);
                return ucx_error(DYAD_RC_UCXINIT_FAIL,
                                 "ucp_config_modify(" + std::string(t.key) + "=" + t.value + ")",
                                 s);
            }
        }
        ucp_params_t p;
        std::memset(&p, 0, sizeof p);
        p.field_mask = UCP_PARAM_FIELD_FEATURES;
        p.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
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

// The two sides, for the table of backends (worker.cpp).
Result<std::unique_ptr<Receiver>> make_receiver();
Status warmup();
Result<std::unique_ptr<Sender>> make_sender(asio::io_context& io, const ServiceBind& bind);

}  // namespace dyad::dtl::ucx
