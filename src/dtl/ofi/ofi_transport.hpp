// SPDX-License-Identifier: Apache-2.0
// The libfabric transport (DYAD_DTL_MODE=MARGO, alias OFI): what its
// consumer side (ofi_receiver.cpp), service side (ofi_sender.cpp) and row of
// the table of backends (ofi.cpp) share. The overview is in ofi.cpp.
#pragma once

#include <memory>

#include <asio/io_context.hpp>

#include "dtl/dtl.hpp"
#include "dtl/options.hpp"

namespace dyad::dtl::ofi {

constexpr const char* kSub = "ofi";
// The transport in messages ("an OFI fetch"); its name is name_of(Kind::ofi).
constexpr const char* kWhat = "OFI";
// 1 MiB: the consumer's reads go through a registered window of kDepth
// chunks, which every process touches for the first time (docs/design.md,
// MARGO, "Where the reads land").
constexpr size_t kOfiChunk = 1u << 20;
constexpr int kDepth = 4;            // descriptors out per transfer
constexpr size_t kPoolBuffers = 16;  // registered chunk buffers per protocol (service)
constexpr size_t kAvCacheSize = 64;  // service addresses kept per consumer endpoint
// Read windows (kDepth chunks each) per consumer process and protocol: at
// most this many receives run at once; more wait for one.
constexpr size_t kMaxWindows = 16;

// `probe` lists the protocols that work here (libfabric's first fi_getinfo
// in a process loads every provider: only `dyad config` pays for it).
Attributes ofi_attributes(const OfiOptions& o, bool probe);

// The two sides, each with its settings.
Result<std::unique_ptr<Receiver>> make_receiver(const OfiOptions& o);
Status warmup(const OfiOptions& o);
std::unique_ptr<Sender> make_sender(asio::io_context& io, const ServiceBind& bind,
                                    const OfiOptions& o);

}  // namespace dyad::dtl::ofi
