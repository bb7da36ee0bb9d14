// SPDX-License-Identifier: Apache-2.0
#include "options.hpp"

#include <sched.h>

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

}  // namespace

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
    o.proto = settings::text("DYAD_MARGO_PROTO");
    auto place = settings::flag("DYAD_OFI_PLACEMENT");
    if (!place) return place.status();
    o.placement = place.value();
    auto no_thread = settings::flag("DYAD_OFI_NO_PROGRESS_THREAD");
    if (!no_thread) return no_thread.status();
    o.no_progress_thread = no_thread.value();
    return o;
}

}  // namespace dyad::dtl
