// SPDX-License-Identifier: Apache-2.0
// The registry of services (kServicesNamespace): each service's identity
// (proto/identity.hpp) under its id, with a dense rank given in
// registration order unless the service brought its own (dyadd --rank,
// DYAD_NODE_RANK, the resource manager's node rank). Used by the embedded
// and the etcd stores, which differ only in how they find the next rank.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "store.hpp"

namespace dyad::kvs::registry {

// The next rank: a number, none left (nullopt: the service goes without),
// or the store's error.
using NextRank = std::function<Result<std::optional<uint64_t>>()>;

// The registration `value` of service `id` as the registry keeps it: as
// sent when it carries a rank, else with next()'s. BADPACK when it is no
// JSON object.
Result<std::string> with_rank(const std::string& id, const std::string& value,
                              const NextRank& next);

// The dense rank of `id` among the registry's `entries`: the one it holds,
// else one more than the highest (nullopt when none is left below 2^32).
std::optional<uint64_t> dense_rank(const std::string& id,
                                   const std::map<std::string, Entry>& entries);

// The rank a registration carries, below 2^32 (nullopt: none).
std::optional<uint32_t> rank_of(const std::string& value);

}  // namespace dyad::kvs::registry
