// SPDX-License-Identifier: Apache-2.0
// dyad.origin_claim (docs/wire-protocol.md, "Claims of origin files"): a
// consumer with DYAD_ORIGIN_PUBLISH asks its node's dyadd to claim an
// origin file before reading it from the origin, so that the other nodes
// wait for this node's publish instead of reading the shared file system
// too; or to release the claim once it published the file (or failed).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.hpp"

namespace dyad::proto {

inline constexpr const char* kOriginClaim = "dyad.origin_claim";

// The namespace that holds the claims of namespace `ns` (records named by
// the file's key, owned by the claiming service).
inline std::string claims_namespace(const std::string& ns) {
    return ns + ".origin-claims";
}

struct OriginClaimRequest {
    std::string upath;              // relative to the managed directories
    std::optional<std::string> ns;  // absent: the service's namespace
    uint64_t key_depth = 3;
    uint64_t key_bins = 1024;
    // The version of another service's claim this one takes over (its
    // holder is gone, or held it past the deadline); 0: none.
    uint64_t takes = 0;
    bool release = false;  // drop this service's claim instead
    // EINVAL / BADUNPACK naming the field; ranges as dyad.publish's.
    static Result<OriginClaimRequest> parse(const nlohmann::json& args);
    nlohmann::json build() const;
};

// The answer: held (this service holds the claim now) or not; the holder's
// service id and the claim's version either way (release: held false).
struct OriginClaimAnswer {
    bool held = false;
    std::string holder;
    uint64_t version = 0;
    static Result<OriginClaimAnswer> parse(const nlohmann::json& meta);
    nlohmann::json build() const;
};

}  // namespace dyad::proto
