// SPDX-License-Identifier: Apache-2.0
// The metadata record of a produced file, as the store holds it (the value
// of a metadata entry; kvs::Record names it too). Only the owner service
// writes it (docs/security.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.hpp"

namespace dyad::proto {

// The metadata record of a produced file.
struct Record {
    std::string upath;
    std::string owner;  // service id
    std::string node;
    std::string producer_dir;
    std::vector<std::string> endpoints;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    uint32_t mode = 0644;
    uint64_t ino = 0;              // the producer's file (0: a record of the first release)
    uint64_t generation = 0;       // the store's version of the key
    std::optional<uint32_t> rank;  // the owner node's rank (docs/user-guide.md, "Ranks")
    nlohmann::json to_json() const;
    static Result<Record> from_json(const std::string& text, uint64_t generation);
    uint32_t owner_rank() const;
};

// The two readings Record::from_json combines, for the tests and the fuzzer
// that hold them to each other (the generation is left 0).
namespace record_detail {
// Only the text to_json().dump() writes (ASCII, no escapes, no whitespace,
// integers of at most 64 bits); nullopt for anything else, right or wrong.
std::optional<Record> read_canonical(std::string_view text);
// Any JSON text, with the record format's rules and errors.
Result<Record> read_any(const std::string& text);
}  // namespace record_detail

// What the store's write rules read of a value, whatever it is (a record
// or not): the path a record names ("" for none) and its owner (nullopt
// unless a JSON object with a string owner).
std::string record_path(const std::string& value);
std::optional<std::string> record_owner(const std::string& value);

}  // namespace dyad::proto
