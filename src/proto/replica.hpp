// SPDX-License-Identifier: Apache-2.0
// Replicas of produced files (docs/design.md, "Replicas"): the owner's
// dyad.replicate request to a replica holder, and the entry a holder
// writes in the metadata store once its copy is durable. The entry is the
// holder's own record (its "owner" is the holder), so the store's write
// rule (a service writes only records naming itself) holds unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.hpp"

namespace dyad::proto {

// The namespace holding the replica entries of namespace `ns`, and the key
// of holder `holder`'s entry for the file of DYAD key `key` (all entries of
// one file share the prefix replica_prefix(key)).
std::string replica_namespace(const std::string& ns);
std::string replica_prefix(const std::string& key);
std::string replica_key(const std::string& key, const std::string& holder);

// dyad.replicate: the owner asks a holder to pull the file `upath`
// (record `key` in `ns`, at `generation`) and keep it.
struct ReplicateRequest {
    std::string ns, key, upath;
    uint64_t generation = 0;
    uint64_t size = 0;  // the record's: what the holder reserves
    // BADRPC naming the field when one is missing or of another type.
    static Result<ReplicateRequest> parse(const nlohmann::json& args);
    nlohmann::json build() const;
};

// dyad.replicate_many: several files of one namespace in one request, so
// that a holder pulls them with one batched consume (dyad.fetch_many)
// instead of one whole consume per file. At most kMaxFiles files; every
// file as in dyad.replicate.
struct ReplicateBatch {
    static constexpr size_t kMaxFiles = 256;
    std::string ns;
    std::vector<ReplicateRequest> files;  // each with ns set to the batch's
    // BADRPC naming the field (or the file's index) when one is missing, of
    // another type, or when the batch is empty or too long.
    static Result<ReplicateBatch> parse(const nlohmann::json& args);
    nlohmann::json build() const;
};

// Its answer: the holder, and per file (in the request's order) the bytes
// held, or the holder's refusal of that file.
struct ReplicateBatchAnswer {
    struct Item {
        bool held = false;
        uint64_t bytes = 0;
        int err = 0;  // errno of a refusal
        std::string error;
    };
    std::string holder;
    std::vector<Item> files;
    // BADRPC unless an object with the holder and `expected` items.
    static Result<ReplicateBatchAnswer> parse(const nlohmann::json& answer, size_t expected);
    nlohmann::json build() const;
};

// dyad.unreplicate: the owner of `upath` (record `key` in `ns`), having
// removed its record of generation `generation`, asks a holder to drop its
// replica of that generation (its copy and its entry).
struct UnreplicateRequest {
    std::string ns, key, upath;
    uint64_t generation = 0;
    // BADRPC naming the field when one is missing or of another type.
    static Result<UnreplicateRequest> parse(const nlohmann::json& args);
    nlohmann::json build() const;
};

// A holder's entry: where a copy of generation `generation` of `upath`
// (produced by `of`) is served from.
struct ReplicaEntry {
    std::string upath;
    std::string holder;  // the entry's "owner": the service that wrote it
    std::string node;
    std::vector<std::string> endpoints;
    std::string of;  // the file's owner
    uint64_t generation = 0;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    nlohmann::json to_json() const;
    // Any text: an error (BADMETADATA) unless an object with every field.
    static Result<ReplicaEntry> parse(const std::string& text);
};

// The `k` services of `ids` (without `self`) that hold the replicas of
// `key`: rendezvous hashing (highest random weight), so the choice is the
// same for everyone who knows the ids, and removing one service moves only
// the replicas it held. Fewer when there are fewer services.
std::vector<std::string> replica_holders(const std::string& key, std::vector<std::string> ids,
                                         const std::string& self, size_t k);

}  // namespace dyad::proto
