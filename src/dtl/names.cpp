// SPDX-License-Identifier: Apache-2.0
// The names of the transports: the one place that spells them (with
// registry.cpp's table of backends, which uses them). Apart from that table,
// so that the libfabric plugin, which names its transport, links this alone.
#include <dyad/common/dyad_dtl.h>

#include "dtl.hpp"

namespace dyad::dtl {

namespace {

// The names of every transport DYAD knows, and the other names accepted.
struct Names {
    Kind kind;
    const char* name;
    std::vector<const char*> aliases;
    int dyad_mode;  // the original DYAD's number (dyad_dtl_mode_t), or -1
};
const std::vector<Names>& names() {
    // Each transport's code is in its folder of src/dtl/: stream/, ucx/,
    // ofi/ (the plugin), local/.
    static const std::vector<Names> n = {
        {Kind::stream, "FLUX_RPC", {"STREAM"}, DYAD_DTL_FLUX_RPC},  // stream/
        {Kind::ucx, "UCX", {}, DYAD_DTL_UCX},                       // ucx/
        {Kind::ofi, "MARGO", {"OFI"}, DYAD_DTL_MARGO},              // ofi/
        {Kind::local, "LOCAL", {}, -1},                             // local/
    };
    return n;
}

}  // namespace

const char* name_of(Kind k) {
    for (const auto& n : names())
        if (n.kind == k) return n.name;
    return "?";
}

const char* name_of_dyad_mode(int mode) {
    for (const auto& n : names())
        if (n.dyad_mode == mode) return n.name;
    return nullptr;
}

std::vector<std::string> aliases_of(Kind k) {
    for (const auto& n : names())
        if (n.kind == k) return {n.aliases.begin(), n.aliases.end()};
    return {};
}

}  // namespace dyad::dtl
