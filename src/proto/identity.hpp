// SPDX-License-Identifier: Apache-2.0
// The identity of a service: what it registers in the store's registry
// (kvs::kServicesNamespace, key: its id) and says in its hello and status
// (docs/wire-protocol.md, "The registry").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.hpp"

namespace dyad::proto {

struct Identity {
    std::string service_id;
    std::string node;
    std::string host_id;  // the machine (same host: Unix sockets reach it)
    std::string ns;       // its default namespace ("namespace")
    std::string producer_dir;
    std::string kvs;  // where its clients find the store: "local" or a uri
    std::vector<std::string> endpoints;
    nlohmann::json transports = nlohmann::json::array();  // dtl::TransportRecord, each
    std::string default_mode;
    int64_t pid = 0;
    std::string auth;  // the authentication scheme, or "none"
    uint64_t wire_version = 0;
    std::optional<uint32_t> rank;  // the node's rank (docs/user-guide.md, "Ranks")
    std::string rank_source;       // where the rank came from ("store": the registry gave it)

    nlohmann::json build() const;
    // Requires service_id and endpoints; the rest as far as present.
    static Result<Identity> parse(const nlohmann::json& j);
};

// What the registry reads and writes of an entry, whatever else it holds:
// the rank it carries (an unsigned number below 2^32), and the rank the
// store gives it (with rank_source "store").
std::optional<uint64_t> rank_of(const nlohmann::json& entry);
void give_rank(nlohmann::json* entry, uint64_t rank);

}  // namespace dyad::proto
