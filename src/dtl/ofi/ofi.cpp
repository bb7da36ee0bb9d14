// SPDX-License-Identifier: Apache-2.0
// libfabric transport (DYAD_DTL_MODE=MARGO, alias OFI): the pull model of
// DYAD's Margo backend, built directly on libfabric.
//
// Service: for each chunk, file bytes are read straight into a buffer of a
// pool registered once per protocol (FI_REMOTE_READ); the consumer is sent a
// descriptor {seq, addr, key, len} on the fetch RPC; it pulls with fi_read and
// acknowledges with an UPDATE frame {ack: seq}; the buffer goes back to the
// pool. At most kDepth chunks per transfer and kPoolBuffers per protocol are
// out, so the service's memory is bounded whatever the files and consumers.
// A progress thread per manual-progress provider waits in fi_cq_sread.
//
// Consumer: one endpoint per process and protocol, service addresses in an AV
// with LRU eviction. Reads run in the consumer's chunk window
// (receive_window.hpp, shared with UCX) and land in a registered window of
// kDepth chunk slots written out with write(2), or, with DYAD_OFI_PLACEMENT=1, in the
// destination file itself (blocks reserved with fallocate, one mapping per
// chunk, hashed in place: class Placement; slower here). Waits sleep on the CQ's fd
// (fi_trywait + poll) within the inactivity deadline, and on the RPC socket
// for frames.
//
// Files: ofi_receiver.cpp (consumer), ofi_consumer.cpp (its endpoint), ofi_sender.cpp (service),
// ofi_endpoint.cpp (libfabric plumbing, ofi.hpp), this file (attributes, the
// row of the table of backends, the plugin's entry point).
#include "common/log.hpp"
#include "ofi.hpp"
#include "ofi_transport.hpp"
#include "dtl/plugin.h"

namespace dyad::dtl {
namespace ofi {

Attributes ofi_attributes(const OfiOptions& o, bool probe) {
    Attributes a;
    a.name = name_of(Kind::ofi);
    a.latency_us = 400;
    a.bandwidth_gbps = 0.43;
    a.rma_native = true;  // the consumer reads the service's memory
    a.max_message = kOfiChunk;
    std::string list;
    if (probe)
        for (const auto& p : available_protocols()) list += (list.empty() ? "" : " ") + p;
    std::string prov;
    for (const auto& p : protocols())
        if (o.proto == p.name) prov = std::string(" (") + p.provider + ")";
    a.info = "libfabric " + library_version() + ", DYAD_MARGO_PROTO=" + o.proto + prov;
    if (probe) a.info += ", available: " + (list.empty() ? std::string("none") : list);
    return a;
}

}  // namespace ofi

// The transport's row: each side gets its settings when made.
Backend ofi_backend() {
    Backend b;
    b.name = name_of(Kind::ofi);
    b.aliases = aliases_of(Kind::ofi);
    b.attributes = [] {
        auto o = OfiOptions::from_settings();
        OfiOptions defaults;
        return ofi::ofi_attributes(o ? o.value() : defaults, true);
    };
    b.make_receiver = []() -> Result<std::unique_ptr<Receiver>> {
        auto o = OfiOptions::from_settings();
        if (!o) return o.status();
        return ofi::make_receiver(o.value());
    };
    b.make_sender = [](asio::io_context& io,
                       const ServiceBind& bind) -> Result<std::unique_ptr<Sender>> {
        auto o = OfiOptions::from_settings();
        if (!o) return o.status();
        return ofi::make_sender(io, bind, o.value());
    };
    b.warmup = []() -> Status {
        auto o = OfiOptions::from_settings();
        if (!o) return o.status();
        return ofi::warmup(o.value());
    };
    return b;
}

}  // namespace dyad::dtl

// The plugin's entry point (plugin.h; registry.cpp loads it with dlopen and
// checks the ABI version and build id before calling backend()).
namespace {
// The build id, after a marker that registry.cpp can find in the file when
// the plugin cannot be loaded at all (symbols of another DYAD missing).
constexpr char kBuildIdRecord[] = DYAD_DTL_BUILD_ID_MARKER DYAD_DTL_BUILD_ID;

void* make_ofi_backend() {
    static dyad::dtl::Backend* backend = new dyad::dtl::Backend(dyad::dtl::ofi_backend());
    return backend;
}

void use_log(const void* host) {
    dyad::log::use_host(static_cast<const dyad::log::Host*>(host));
}
}  // namespace

extern "C" __attribute__((visibility("default"))) const dyad_dtl_plugin_t* dyad_dtl_plugin_v1() {
    static const dyad_dtl_plugin_t plugin = {
        DYAD_DTL_PLUGIN_ABI_VERSION,
        static_cast<uint32_t>(sizeof(dyad_dtl_plugin_t)),
        kBuildIdRecord + sizeof(DYAD_DTL_BUILD_ID_MARKER) - 1,
        dyad::dtl::name_of(dyad::dtl::Kind::ofi),
        make_ofi_backend,
        use_log,
    };
    return &plugin;
}
