// SPDX-License-Identifier: Apache-2.0
// The transports' settings, read from the settings table
// (common/settings.hpp) in this one place and handed to each component when
// it is made: components look nothing up. A value that does not parse is an
// error naming the variable (settings.hpp's one rule); where a transport
// used a setting only for some files, the error is kept and reported there.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.hpp"

namespace dyad::dtl {

// DYAD_WRITE_BEHIND, for the receivers that write behind (stream, UCX tag):
// on, off, or (auto) on where this process may run on 4 CPUs or more. Its
// error, if the value is bad, is the receivers' when a file is large enough
// to be written behind.
struct WriteBehindOption {
    Result<bool> on = false;
    static WriteBehindOption from_settings();
};

// The stream transport (FLUX_RPC).
struct StreamOptions {
    bool sendfile = false;  // DYAD_STREAM_SENDFILE (service)
    WriteBehindOption write_behind;
    static Result<StreamOptions> from_settings();
};

// The UCX consumer (one per process).
struct UcxConsumerOptions {
    std::string proto = "auto";   // DYAD_UCX_PROTO: auto, tag or put
    uint64_t window = 64u << 20;  // DYAD_UCX_WINDOW: the registered receive window
    WriteBehindOption write_behind;
    static Result<UcxConsumerOptions> from_settings();
};

// The UCX service side.
struct UcxServiceOptions {
    unsigned ep_cache = 64;      // DYAD_UCX_EP_CACHE_SIZE
    bool direct = true;          // DYAD_UCX_DIRECT
    bool shared_memory = false;  // DYAD_UCX_SHARED_MEMORY
    static Result<UcxServiceOptions> from_settings();
};

// The libfabric transport (MARGO), both sides.
struct OfiOptions {
    std::string proto = "ofi+tcp";    // DYAD_MARGO_PROTO (margo_protocol)
    bool placement = false;           // DYAD_OFI_PLACEMENT (consumer)
    bool no_progress_thread = false;  // DYAD_OFI_NO_PROGRESS_THREAD (service)
    static Result<OfiOptions> from_settings();
};

// DYAD_MARGO_PROTO as DYAD's libfabric protocol. Upstream DYAD hands the
// value to Mercury (margo_init), whose names are [CLASS+]PROTOCOL[://]: the
// ones libfabric serves are mapped to ours (`sm` and `na+sm` to `ofi+shm`,
// `tcp` and `ofi+tcp;ofi_rxm` to `ofi+tcp`, `verbs` to `ofi+verbs`...);
// any other value is returned as given (lower case), for the transport to
// check against the protocols it knows (ofi.hpp, validate_protocol).
std::string margo_protocol(const std::string& value);
// For a DYAD_MARGO_PROTO value that only Mercury understands (its UCX, BMI,
// MPI or PSM plugins, an address after "://"): why, and what to use with
// DYAD instead; empty for any other value.
std::string mercury_only_advice(const std::string& value);

}  // namespace dyad::dtl
