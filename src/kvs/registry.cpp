// SPDX-License-Identifier: Apache-2.0
#include "registry.hpp"

#include <algorithm>
#include <cerrno>

#include "common/json_text.hpp"
#include "proto/identity.hpp"

namespace dyad::kvs::registry {

Result<std::string> with_rank(const std::string& id, const std::string& value,
                              const NextRank& next) {
    auto j = nlohmann::json::parse(value, nullptr, false);
    if (!j.is_object())
        return Status(DYAD_RC_BADPACK, "registration of '" + id + "' is not a JSON object", EINVAL);
    if (proto::rank_of(j)) return value;
    auto rank = next();
    if (!rank) return rank.status();
    if (!rank.value()) return value;
    proto::give_rank(&j, *rank.value());
    return j.dump(-1, ' ', false, kBadUtf8Replaced);
}

std::optional<uint64_t> dense_rank(const std::string& id,
                                   const std::map<std::string, Entry>& entries) {
    int64_t highest = -1;
    for (const auto& [k, e] : entries) {
        auto r = proto::rank_of(nlohmann::json::parse(e.value, nullptr, false));
        if (!r) continue;
        if (k == id) return *r;
        highest = std::max<int64_t>(highest, static_cast<int64_t>(*r));
    }
    const uint64_t next = static_cast<uint64_t>(highest + 1);
    if (next >= UINT32_MAX) return std::nullopt;
    return next;
}

std::optional<uint32_t> rank_of(const std::string& value) {
    auto r = proto::rank_of(nlohmann::json::parse(value, nullptr, false));
    if (!r || *r >= UINT32_MAX) return std::nullopt;
    return static_cast<uint32_t>(*r);
}

}  // namespace dyad::kvs::registry
