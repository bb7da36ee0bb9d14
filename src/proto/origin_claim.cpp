// SPDX-License-Identifier: Apache-2.0
#include "proto/origin_claim.hpp"

#include <cerrno>

#include "proto/fields.hpp"

namespace dyad::proto {

Result<OriginClaimRequest> OriginClaimRequest::parse(const nlohmann::json& args) {
    Fields f(args, "dyad.origin_claim");
    OriginClaimRequest r;
    r.upath = f.str("upath");
    r.ns = f.opt_str("ns");
    r.key_depth = f.opt_u64("key_depth").value_or(3);
    r.key_bins = f.opt_u64("key_bins").value_or(1024);
    r.takes = f.opt_u64("takes").value_or(0);
    r.release = f.opt_bool("release").value_or(false);
    if (f.ok() && (r.key_depth > 64 || r.key_bins == 0 || r.key_bins > (1u << 30)))
        f.fail("key_depth", "key_depth must be 0..64 and key_bins 1..2^30");
    return finish(f, std::move(r));
}

nlohmann::json OriginClaimRequest::build() const {
    nlohmann::json a = {{"upath", upath}, {"key_depth", key_depth}, {"key_bins", key_bins}};
    if (ns) a["ns"] = *ns;
    if (takes) a["takes"] = takes;
    if (release) a["release"] = true;
    return a;
}

Result<OriginClaimAnswer> OriginClaimAnswer::parse(const nlohmann::json& meta) {
    Fields f(meta, "the answer of dyad.origin_claim");
    OriginClaimAnswer a;
    a.held = f.boolean("held");
    a.holder = f.opt_str("holder").value_or("");
    a.version = f.opt_u64("version").value_or(0);
    return finish(f, std::move(a));
}

nlohmann::json OriginClaimAnswer::build() const {
    return {{"held", held}, {"holder", holder}, {"version", version}};
}

}  // namespace dyad::proto
