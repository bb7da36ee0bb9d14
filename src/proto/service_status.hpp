// SPDX-License-Identifier: Apache-2.0
// The answer of dyad.status (`dyad service status --json`; its fields in
// docs/user-guide.md, "dyad service status"): the service's identity, its
// counters, its caps per peer, and sections other parts of the service
// fill (its memory budget, the embedded store, the metadata store it uses,
// its replicas, the settings it reads, the trace), each under its own key.
//
// The service builds it (service/status.cpp); the tools read it through
// parse(), which never trusts the document: a field of the wrong type fails
// the parse naming it; a field an older service did not send reads as 0
// (or empty). Fields this type does not name are kept as they came (rest)
// and built again unchanged: the document stays what older tools read.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.hpp"
#include "proto/identity.hpp"

namespace dyad::proto {

struct ServiceStatus {
    // The fetch counters of one served transport (counters.per_transport).
    struct TransportCounters {
        uint64_t requests = 0, served = 0, errors = 0, bytes_sent = 0, bytes_received = 0,
                 in_flight = 0;
        nlohmann::json transport;  // the transport's own figures (null: none)
    };
    // What the service counted since it started (counters).
    struct Counters {
        uint64_t requests = 0, fetch_many_requests = 0, files_requested = 0, served = 0, errors = 0,
                 bytes_sent = 0, bytes_received = 0, rejected = 0, published = 0,
                 refused_unproduced = 0, refused_unreadable = 0, refused_not_producer = 0,
                 refused_stale = 0, auth_refused = 0, idle_closed = 0, refused_peer_connections = 0,
                 refused_connections_table_full = 0, reserved_connections_admitted = 0,
                 refused_peer_request_bytes = 0, refused_request_bytes = 0,
                 refused_peer_fetches = 0, refused_peer_local = 0, in_flight = 0;
        std::map<std::string, TransportCounters> per_transport;
        nlohmann::json per_kind = nlohmann::json::object();  // requests by kind
    };
    // The caps per peer (docs/security.md) and how close to them peers are
    // (peers). caps: the fetch caps' own figures, merged in as they come.
    struct Peers {
        uint64_t with_connections = 0, busiest_peer_connections = 0, max_connections_per_peer = 0,
                 max_fetches_per_peer = 0, max_local_per_peer = 0, memory_per_peer = 0,
                 max_request_bytes_per_peer = 0, max_request_bytes = 0, max_connections = 0;
        double max_wait_s = 0;
        nlohmann::json request_bytes_held, busiest_peer_request_bytes;  // null: not known
        nlohmann::json caps = nlohmann::json::object();
    };

    Identity identity;  // its fields at the top level of the document
    Counters counters;
    Peers peers;
    uint64_t connections = 0;
    double uptime_s = 0;
    std::optional<std::string> metrics;  // where the metrics are served
    // Every other section (memory, store, metadata_store, replicas, trace,
    // settings), as it came.
    nlohmann::json rest = nlohmann::json::object();

    nlohmann::json build() const;
    static Result<ServiceStatus> parse(const nlohmann::json& j);

    // The names of the transports it serves (identity.transports).
    std::vector<std::string> transport_names() const;
};

// The metadata store the service uses (the section metadata_store), as the
// tools read it: whether it answers, and an etcd store's watch and lease.
struct StoreHealth {
    bool reachable = true;
    bool starting = false;  // not reached yet since the service started (dyadd --store-late)
    std::string backend, endpoint, error;
    uint64_t rejoined = 0, republished = 0;
    // etcd's
    bool watch_stream_up = false;
    uint64_t watched_keys = 0, waiters = 0, watch_reconnects = 0;
    int64_t lease_id = 0;
    double lease_ttl = 0;
    static Result<StoreHealth> parse(const nlohmann::json& j);
};

// The embedded store the service hosts (the section store), as the tools
// read it.
struct HostedStore {
    uint64_t keys = 0, waiters = 0, epoch = 0;
    static Result<HostedStore> parse(const nlohmann::json& j);
};

// The service's replicas (the section replicas): copies by default, what it
// holds, and every other counter by name.
struct ReplicaFigures {
    uint64_t default_copies = 0, held = 0, bytes = 0, space = 0;
    std::map<std::string, uint64_t> counters;
    static Result<ReplicaFigures> parse(const nlohmann::json& j);
};

}  // namespace dyad::proto
