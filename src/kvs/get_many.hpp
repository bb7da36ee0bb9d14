// SPDX-License-Identifier: Apache-2.0
// kvs.get_many: many keys of one namespace looked up in one request, without
// waiting (docs/wire-protocol.md, section 7). The consumer's pipeline
// (Client::consume_many) uses it to learn in one round trip which of the
// files it wants are produced already.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "proto/kvs.hpp"
#include "store.hpp"

namespace dyad::kvs {

// Keys one request may carry (more: EINVAL / BADUNPACK).
constexpr size_t kGetManyMaxKeys = proto::kvs::kMaxKeys;
// Bytes of values one answer carries at most; the keys past it are answered
// "later" and asked for again.
constexpr size_t kGetManyAnswerBudget = 512u << 10;

// The compact answer (a request with "answer": "raw"; docs/wire-protocol.md,
// section 7): the values travel as the end frame's data instead of JSON
// strings in its meta, which a consumer parsed twice (the meta, then each
// record). Per key, in order, one byte: 0 absent, 2 later, or 1 found
// followed by the version (u64, little-endian), the value's length (u32,
// little-endian) and the value. append_raw_entry writes one key's entry;
// parse_raw_entries reads `count` entries that must fill `data` exactly.
void append_raw_entry(std::string* out, const Lookup& l);
Result<std::vector<Lookup>> parse_raw_entries(const std::string& data, size_t count);

// Asks the embedded store at `uri` for `keys` (at most kGetManyMaxKeys),
// through `pool`. One Lookup per key, in order. A service that does not
// know the topic (an older dyadd): DYAD_RC_BADRPC with errno ENOSYS.
Result<std::vector<Lookup>> get_many(rpc::ConnectionPool& pool, const std::string& uri,
                                     const std::string& ns, const std::vector<std::string>& keys,
                                     Deadline deadline);

}  // namespace dyad::kvs
