// SPDX-License-Identifier: Apache-2.0
// dyad.publish (docs/wire-protocol.md, section 7): a producer asks its
// node's dyadd to publish a file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.hpp"

namespace dyad::proto {

// The most replicas one file may have (DYAD_REPLICAS, dyadd --replicas).
inline constexpr uint64_t kMaxReplicas = 16;

struct PublishRequest {
    std::string upath;              // relative to the producer directory
    std::optional<std::string> ns;  // absent: the service's namespace
    uint64_t key_depth = 3;
    uint64_t key_bins = 1024;
    uint64_t replaces = 0;  // the version of another owner's record this takes over
    // Replicas of the file on other services (DYAD_REPLICAS; absent: the
    // service's --replicas), and whether the answer waits for them
    // (DYAD_REPLICAS_SYNC).
    std::optional<uint64_t> replicas;
    bool replicas_sync = false;

    // EINVAL / BADUNPACK "publish request without 'upath'"; numbers absent
    // or not unsigned integers take their defaults (the protocol's rule);
    // the ranges (depth 0..64, bins 1..2^30) are checked by check().
    static Result<PublishRequest> parse(const nlohmann::json& args);
    Status check() const;
    nlohmann::json build() const;
};

// dyad.unpublish: a producer asks its node's dyadd to remove the record of
// a file it published (the file stays). The answer: UnpublishAnswer.
struct UnpublishRequest {
    std::string upath;              // relative to the producer directory
    std::optional<std::string> ns;  // absent: the service's namespace
    uint64_t key_depth = 3;
    uint64_t key_bins = 1024;
    // EINVAL / BADUNPACK "unpublish request without 'upath'".
    static Result<UnpublishRequest> parse(const nlohmann::json& args);
    nlohmann::json build() const;
};

// The answer of dyad.unpublish: the key removed and the version it had.
struct UnpublishAnswer {
    std::string key;
    uint64_t version = 0;
    nlohmann::json build() const;
    static Result<UnpublishAnswer> parse(const nlohmann::json& meta);
};

// The answer: the record's version (its generation), its key, the record;
// with replicas asked for and waited for (replicas_sync), how many were
// made, and a warning when fewer than asked.
struct PublishAnswer {
    uint64_t version = 0;
    std::string key;
    nlohmann::json record;
    std::optional<uint64_t> replicas;
    std::optional<std::string> replicas_warning;
    nlohmann::json build() const;
    static Result<PublishAnswer> parse(const nlohmann::json& meta);
};

}  // namespace dyad::proto
