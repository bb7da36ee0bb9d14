// SPDX-License-Identifier: Apache-2.0
// DYAD_DTL_MODE=AUTO: which transport moves a file, chosen per transfer by
// score, after UCX's wire-up (seed 004): every service publishes one record
// per way it can be reached (transport, reach, latency, bandwidth, native or
// emulated RMA, address); the consumer scores each record it can use and
// reach for the file's size and takes the fastest. Deterministic (ties go
// by a fixed preference order) and explainable (every candidate, its
// estimate or why it was left out).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.hpp"
#include "proto/transfer.hpp"

namespace dyad::dtl {

// Files up to this size are "small": their cost is mostly per-file latency,
// and the stream transport carries them inline in its first response.
constexpr uint64_t kSmallFile = 1u << 20;

// One way of reaching a service's transport.
// The record of the wire (proto::TransportRecord), with the selector's estimate.
struct TransportRecord : proto::TransportRecord {
    nlohmann::json to_json() const { return build(); }
    static Result<TransportRecord> from_json(const nlohmann::json& j);
    // Estimated microseconds to move `size` bytes.
    double estimate_us(uint64_t size) const;
};

// Where the consumer is relative to the file's owner service.
struct Placement {
    bool same_node = false;  // same DYAD node id (LOCAL may apply)
    bool same_host = false;  // same machine (boot id): shared memory may apply
};

struct Scored {
    std::string name;
    std::string reach;
    double estimate_us = 0;
    bool eligible = false;
    std::string why;  // the figures, or why it was left out
};

struct Selection {
    std::string chosen;      // empty: nothing usable
    std::string size_class;  // "small" or "large"
    uint64_t size = 0;
    std::vector<Scored> scored;  // every record considered, best first
    // Candidates in order of preference (the chosen one first), for falling
    // back when one cannot start.
    std::vector<std::string> order;
    std::string explain() const;
    nlohmann::json to_json() const;
};

// The transports this process can use (`consumer`), the owner's records.
Selection select_transport(uint64_t size, const Placement& where,
                           const std::vector<TransportRecord>& service,
                           const std::vector<std::string>& consumer);

// Default figures per transport and reach ("configuration"), overridable by
// DYAD_DTL_FIGURES on the service: "NAME[@reach]=LAT_US/BW_GBPS,...".
Status apply_figures(const std::string& spec, std::vector<TransportRecord>* records);

// This machine's identity (the kernel's boot id), for `same_host`.
std::string host_id();

}  // namespace dyad::dtl
