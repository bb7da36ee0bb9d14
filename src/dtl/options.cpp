// SPDX-License-Identifier: Apache-2.0
#include "options.hpp"

#include <sched.h>

#include <cctype>
#include <utility>

#include "common/settings.hpp"

namespace dyad::dtl {
namespace {

// The write-behind overlap needs a core to spare: on 2 CPUs, with the
// sending service on one of them, 8 consumers at once were 20-40% slower
// written behind (docs/design.md, "Receiving").
bool spare_cpus() {
    static const bool spare = [] {
        cpu_set_t set;
        CPU_ZERO(&set);
        if (sched_getaffinity(0, sizeof set, &set) != 0) return false;
        return CPU_COUNT(&set) >= 4;
    }();
    return spare;
}

// A Mercury protocol name split as Mercury reads it: [CLASS+]PROTOCOL[://ADDRESS],
// in lower case. `address` is what follows "://" (Mercury's host and port).
struct MercuryName {
    std::string cls, protocol, address;
};

MercuryName split_mercury(const std::string& value) {
    std::string v;
    for (char c : value) v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    MercuryName m;
    if (size_t s = v.find("://"); s != std::string::npos) {
        m.address = v.substr(s + 3);
        v.resize(s);
    }
    if (size_t plus = v.find('+'); plus != std::string::npos) {
        m.cls = v.substr(0, plus);
        m.protocol = v.substr(plus + 1);
    } else {
        m.protocol = v;
    }
    return m;
}

// Mercury's protocols that a libfabric provider DYAD knows serves, with or
// without Mercury's "ofi+" class (Mercury without a class picks the first
// plugin that has the protocol: libfabric's, in its default build).
constexpr std::pair<const char*, const char*> kLibfabricNames[] = {
    {"tcp", "ofi+tcp"}, {"tcp;ofi_rxm", "ofi+tcp"}, {"sockets", "ofi+sockets"},
    {"shm", "ofi+shm"}, {"verbs", "ofi+verbs"},     {"verbs;ofi_rxm", "ofi+verbs"},
    {"cxi", "ofi+cxi"},
};

}  // namespace

std::string margo_protocol(const std::string& value) {
    MercuryName m = split_mercury(value);
    if (!m.address.empty()) return value;  // refused: mercury_only_advice
    // Mercury's own shared-memory plugin (na+sm, or sm alone): libfabric's
    // shared-memory provider does the same between the processes of a node.
    if (m.protocol == "sm" && (m.cls.empty() || m.cls == "na")) return "ofi+shm";
    if (m.cls.empty() || m.cls == "ofi")
        for (const auto& [mercury, ours] : kLibfabricNames)
            if (m.protocol == mercury) return ours;
    return m.cls.empty() ? m.protocol : m.cls + "+" + m.protocol;
}

std::string mercury_only_advice(const std::string& value) {
    MercuryName m = split_mercury(value);
    const std::string libfabric =
        "or stay on libfabric with DYAD_MARGO_PROTO=ofi+tcp (ofi+shm within a node, ofi+verbs "
        "or ofi+cxi on RDMA networks)";
    if (!m.address.empty())
        return "a Mercury address ('" + m.address +
               "' after '://'): DYAD's libfabric transport takes the protocol alone and listens "
               "where dyadd's --listen says; drop the '://" +
               m.address + "'";
    if (m.cls == "ucx" || (m.cls.empty() && m.protocol == "ucx")) {
        const bool any =
            m.cls.empty() || m.protocol == "all" || m.protocol == "*" || m.protocol.empty();
        return "a Mercury-only protocol name (Mercury's UCX plugin; DYAD's MARGO transport is "
               "libfabric without Mercury): for UCX use DYAD_DTL_MODE=UCX" +
               (any ? std::string() : " with UCX_TLS=" + m.protocol) + ", " + libfabric;
    }
    if (!m.cls.empty() && m.cls != "ofi" && !(m.cls == "na" && m.protocol == "sm"))
        return "a Mercury-only protocol name (Mercury's '" + m.cls +
               "' plugin; DYAD's MARGO transport is libfabric without Mercury): use "
               "DYAD_DTL_MODE=FLUX_RPC (TCP or the Unix socket), " +
               libfabric;
    return "";
}

WriteBehindOption WriteBehindOption::from_settings() {
    WriteBehindOption o;
    auto v = settings::choice("DYAD_WRITE_BEHIND", {"auto", "on", "off"}, {"1", "0"});
    if (!v)
        o.on = v.status();
    else if (v.value() == "on" || v.value() == "1")
        o.on = true;
    else if (v.value() == "off" || v.value() == "0")
        o.on = false;
    else
        o.on = spare_cpus();
    return o;
}

Result<StreamOptions> StreamOptions::from_settings() {
    StreamOptions o;
    auto sendfile = settings::flag("DYAD_STREAM_SENDFILE");
    if (!sendfile) return sendfile.status();
    o.sendfile = sendfile.value();
    o.write_behind = WriteBehindOption::from_settings();
    return o;
}

Result<UcxConsumerOptions> UcxConsumerOptions::from_settings() {
    UcxConsumerOptions o;
    auto proto = settings::choice("DYAD_UCX_PROTO", {"auto", "tag", "put"}, {}, DYAD_RC_BADDTLMODE);
    if (!proto) return proto.status();
    o.proto = proto.value();
    // At least one 4 MiB chunk (ucx.hpp, kUcxChunk).
    auto win = settings::size("DYAD_UCX_WINDOW", 4u << 20, 1ull << 31,
                              "[4M, 2G] (at least one 4 MiB chunk)");
    if (!win) return win.status();
    o.window = win.value();
    o.write_behind = WriteBehindOption::from_settings();
    return o;
}

Result<UcxServiceOptions> UcxServiceOptions::from_settings() {
    UcxServiceOptions o;
    auto cap = settings::count("DYAD_UCX_EP_CACHE_SIZE", 1, 1u << 20);
    if (!cap) return cap.status();
    o.ep_cache = cap.value();
    auto direct = settings::flag("DYAD_UCX_DIRECT");
    if (!direct) return direct.status();
    o.direct = direct.value();
    auto shm = settings::flag("DYAD_UCX_SHARED_MEMORY");
    if (!shm) return shm.status();
    o.shared_memory = shm.value();
    return o;
}

Result<OfiOptions> OfiOptions::from_settings() {
    OfiOptions o;
    o.proto = margo_protocol(settings::text("DYAD_MARGO_PROTO"));
    auto place = settings::flag("DYAD_OFI_PLACEMENT");
    if (!place) return place.status();
    o.placement = place.value();
    auto no_thread = settings::flag("DYAD_OFI_NO_PROGRESS_THREAD");
    if (!no_thread) return no_thread.status();
    o.no_progress_thread = no_thread.value();
    return o;
}

}  // namespace dyad::dtl
