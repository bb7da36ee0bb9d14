// SPDX-License-Identifier: Apache-2.0
#include "proto/identity.hpp"

#include "proto/fields.hpp"

namespace dyad::proto {
namespace {
constexpr const char* kRank = "rank";
constexpr const char* kRankSource = "rank_source";
constexpr size_t kMaxEndpoints = 64;
}  // namespace

nlohmann::json Identity::build() const {
    nlohmann::json j = {{"service_id", service_id},
                        {"node", node},
                        {"host_id", host_id},
                        {"namespace", ns},
                        {"producer_dir", producer_dir},
                        {"kvs", kvs},
                        {"endpoints", endpoints},
                        {"transports", transports},
                        {"default_mode", default_mode},
                        {"pid", pid},
                        {"auth", auth},
                        {"wire_version", wire_version}};
    if (rank) {
        j[kRank] = *rank;
        j[kRankSource] = rank_source;
    }
    return j;
}

Result<Identity> Identity::parse(const nlohmann::json& j) {
    Fields f(j, "a service's identity");
    Identity id;
    id.service_id = f.str("service_id");
    id.endpoints = f.strings("endpoints", kMaxEndpoints, kMaxText);
    id.node = f.opt_str("node").value_or("");
    id.host_id = f.opt_str("host_id").value_or("");
    id.ns = f.opt_str("namespace").value_or("");
    id.producer_dir = f.opt_str("producer_dir").value_or("");
    id.kvs = f.opt_str("kvs", kMaxText).value_or("");
    if (const auto* t = f.array("transports", false)) id.transports = *t;
    id.default_mode = f.opt_str("default_mode").value_or("");
    id.pid = f.opt_i64("pid").value_or(0);
    id.auth = f.opt_str("auth").value_or("");
    id.wire_version = f.opt_u64("wire_version").value_or(0);
    if (auto r = f.opt_u64(kRank)) {
        if (*r >= UINT32_MAX)
            f.fail(kRank, "is out of range");
        else
            id.rank = static_cast<uint32_t>(*r);
    }
    id.rank_source = f.opt_str(kRankSource).value_or("");
    return finish(f, std::move(id));
}

std::optional<uint64_t> rank_of(const nlohmann::json& entry) {
    if (!entry.is_object()) return std::nullopt;
    auto r = entry.find(kRank);
    if (r == entry.end() || !r->is_number_unsigned()) return std::nullopt;
    return r->get<uint64_t>();
}

void give_rank(nlohmann::json* entry, uint64_t rank) {
    (*entry)[kRank] = rank;
    (*entry)[kRankSource] = "store";
}

}  // namespace dyad::proto
