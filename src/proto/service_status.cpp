// SPDX-License-Identifier: Apache-2.0
#include "proto/service_status.hpp"

#include "proto/fields.hpp"

namespace dyad::proto {
namespace {

using Counters = ServiceStatus::Counters;
using Peers = ServiceStatus::Peers;
using TransportCounters = ServiceStatus::TransportCounters;

template <typename T>
struct U64 {
    const char* name;
    uint64_t T::*member;
};

constexpr U64<Counters> kCounters[] = {
    {"requests", &Counters::requests},
    {"fetch_many_requests", &Counters::fetch_many_requests},
    {"files_requested", &Counters::files_requested},
    {"served", &Counters::served},
    {"errors", &Counters::errors},
    {"bytes_sent", &Counters::bytes_sent},
    {"bytes_received", &Counters::bytes_received},
    {"rejected", &Counters::rejected},
    {"published", &Counters::published},
    {"refused_unproduced", &Counters::refused_unproduced},
    {"refused_unreadable", &Counters::refused_unreadable},
    {"refused_not_producer", &Counters::refused_not_producer},
    {"refused_stale", &Counters::refused_stale},
    {"auth_refused", &Counters::auth_refused},
    {"idle_closed", &Counters::idle_closed},
    {"refused_peer_connections", &Counters::refused_peer_connections},
    {"refused_connections_table_full", &Counters::refused_connections_table_full},
    {"reserved_connections_admitted", &Counters::reserved_connections_admitted},
    {"refused_peer_request_bytes", &Counters::refused_peer_request_bytes},
    {"refused_request_bytes", &Counters::refused_request_bytes},
    {"refused_peer_fetches", &Counters::refused_peer_fetches},
    {"refused_peer_local", &Counters::refused_peer_local},
    {"in_flight", &Counters::in_flight},
};

constexpr U64<TransportCounters> kTransportCounters[] = {
    {"requests", &TransportCounters::requests},
    {"served", &TransportCounters::served},
    {"errors", &TransportCounters::errors},
    {"bytes_sent", &TransportCounters::bytes_sent},
    {"bytes_received", &TransportCounters::bytes_received},
    {"in_flight", &TransportCounters::in_flight},
};

constexpr U64<Peers> kPeers[] = {
    {"with_connections", &Peers::with_connections},
    {"busiest_peer_connections", &Peers::busiest_peer_connections},
    {"max_connections_per_peer", &Peers::max_connections_per_peer},
    {"max_fetches_per_peer", &Peers::max_fetches_per_peer},
    {"max_local_per_peer", &Peers::max_local_per_peer},
    {"memory_per_peer", &Peers::memory_per_peer},
    {"max_request_bytes_per_peer", &Peers::max_request_bytes_per_peer},
    {"max_request_bytes", &Peers::max_request_bytes},
    {"max_connections", &Peers::max_connections},
};

constexpr const char* kCountersKey = "counters";
constexpr const char* kPerTransport = "per_transport";
constexpr const char* kPerKind = "per_kind";
constexpr const char* kTransportOwn = "transport";
constexpr const char* kPeersKey = "peers";
constexpr const char* kMaxWait = "max_wait_s";
constexpr const char* kRequestBytesHeld = "request_bytes_held";
constexpr const char* kBusiestRequestBytes = "busiest_peer_request_bytes";
constexpr const char* kConnections = "connections";
constexpr const char* kUptime = "uptime_s";
constexpr const char* kMetrics = "metrics";
constexpr size_t kMaxTransports = 64;

template <typename T, size_t N>
void put_all(nlohmann::json& j, const T& v, const U64<T> (&table)[N]) {
    for (const auto& f : table) j[f.name] = v.*f.member;
}

template <typename T, size_t N>
void read_all(Fields& f, T& v, const U64<T> (&table)[N]) {
    for (const auto& x : table) v.*x.member = f.opt_u64(x.name).value_or(0);
}

// A nested section: its Fields read into `out`, or the section's error.
template <typename T, typename Read>
Status section(const nlohmann::json* j, const std::string& what, T& out, Read read) {
    if (!j) return Status::ok();
    Fields f(*j, what);
    read(f, out);
    return f.status();
}

Status parse_counters(const nlohmann::json* j, Counters& c) {
    return section(j, "the status's counters", c, [](Fields& f, Counters& out) {
        read_all(f, out, kCounters);
        if (const auto* k = f.object(kPerKind, false)) out.per_kind = *k;
        const auto* per = f.object(kPerTransport, false);
        if (!per) return;
        if (per->size() > kMaxTransports) return f.fail(kPerTransport, "has too many transports");
        for (const auto& [name, one] : per->items()) {
            TransportCounters t;
            Status s = section(&one, "the status's counters of transport " + name, t,
                               [](Fields& g, TransportCounters& o) {
                                   read_all(g, o, kTransportCounters);
                                   if (const auto* own = g.object(kTransportOwn, false))
                                       o.transport = *own;
                               });
            if (!s) return f.fail(kPerTransport, s.message());
            out.per_transport.emplace(name, std::move(t));
        }
    });
}

Status parse_peers(const nlohmann::json* j, Peers& p) {
    if (j && j->is_object()) p.caps = *j;
    return section(j, "the status's peers", p, [](Fields& f, Peers& out) {
        read_all(f, out, kPeers);
        out.max_wait_s = f.opt_number(kMaxWait).value_or(0);
        for (const auto& x : kPeers) out.caps.erase(x.name);
        for (const char* k : {kMaxWait, kRequestBytesHeld, kBusiestRequestBytes}) {
            auto it = out.caps.find(k);
            if (it == out.caps.end()) continue;
            if (k == kRequestBytesHeld) out.request_bytes_held = *it;
            if (k == kBusiestRequestBytes) out.busiest_peer_request_bytes = *it;
            out.caps.erase(it);
        }
    });
}

}  // namespace

nlohmann::json ServiceStatus::build() const {
    nlohmann::json j = rest.is_object() ? rest : nlohmann::json::object();
    const nlohmann::json id = identity.build();
    for (const auto& [k, v] : id.items()) j[k] = v;
    nlohmann::json per = nlohmann::json::object();
    for (const auto& [name, t] : counters.per_transport) {
        auto& one = per[name];
        put_all(one, t, kTransportCounters);
        if (t.transport.is_object() && !t.transport.empty()) one[kTransportOwn] = t.transport;
    }
    nlohmann::json c;
    put_all(c, counters, kCounters);
    c[kPerTransport] = per;
    c[kPerKind] = counters.per_kind;
    j[kCountersKey] = c;
    nlohmann::json p = peers.caps.is_object() ? peers.caps : nlohmann::json::object();
    put_all(p, peers, kPeers);
    p[kMaxWait] = peers.max_wait_s;
    if (!peers.request_bytes_held.is_null()) p[kRequestBytesHeld] = peers.request_bytes_held;
    if (!peers.busiest_peer_request_bytes.is_null())
        p[kBusiestRequestBytes] = peers.busiest_peer_request_bytes;
    j[kPeersKey] = p;
    j[kConnections] = connections;
    j[kUptime] = uptime_s;
    if (metrics) j[kMetrics] = *metrics;
    return j;
}

Result<ServiceStatus> ServiceStatus::parse(const nlohmann::json& j) {
    auto id = Identity::parse(j);
    if (!id) return Status(id.status()).wrap("the service's status");
    ServiceStatus s;
    s.identity = std::move(id.value());
    Fields f(j, "the service's status");
    s.connections = f.opt_u64(kConnections).value_or(0);
    s.uptime_s = f.opt_number(kUptime).value_or(0);
    s.metrics = f.opt_str(kMetrics, kMaxText);
    if (Status c = parse_counters(f.object(kCountersKey, false), s.counters); !c) return c;
    if (Status p = parse_peers(f.object(kPeersKey, false), s.peers); !p) return p;
    if (!f.ok()) return f.status();
    s.rest = j;
    const nlohmann::json built = s.identity.build();
    for (const auto& [k, v] : built.items()) s.rest.erase(k);
    for (const char* k : {kCountersKey, kPeersKey, kConnections, kUptime, kMetrics})
        s.rest.erase(k);
    return s;
}

std::vector<std::string> ServiceStatus::transport_names() const {
    std::vector<std::string> out;
    if (!identity.transports.is_array()) return out;
    for (const auto& t : identity.transports) {
        if (t.is_string()) {
            out.push_back(t.get<std::string>());
            continue;
        }
        if (!t.is_object()) continue;
        auto name = lenient_str(t, "name");
        if (name) out.push_back(*name);
    }
    return out;
}

Result<StoreHealth> StoreHealth::parse(const nlohmann::json& j) {
    Fields f(j, "the status's metadata store");
    StoreHealth h;
    h.reachable = f.opt_bool("reachable").value_or(true);
    h.starting = f.opt_bool("starting").value_or(false);
    h.backend = f.opt_str("backend").value_or("");
    h.endpoint = f.opt_str("endpoint", kMaxText).value_or("");
    h.error = f.opt_str("error", kMaxText).value_or("");
    h.rejoined = f.opt_u64("rejoined").value_or(0);
    h.republished = f.opt_u64("republished").value_or(0);
    h.watch_stream_up = f.opt_bool("watch_stream_up").value_or(false);
    h.watched_keys = f.opt_u64("watched_keys").value_or(0);
    h.waiters = f.opt_u64("waiters").value_or(0);
    h.watch_reconnects = f.opt_u64("watch_reconnects").value_or(0);
    h.lease_id = f.opt_i64("lease_id").value_or(0);
    h.lease_ttl = f.opt_number("lease_ttl").value_or(0);
    return finish(f, std::move(h));
}

Result<HostedStore> HostedStore::parse(const nlohmann::json& j) {
    Fields f(j, "the status's store");
    HostedStore h;
    h.keys = f.opt_u64("keys").value_or(0);
    h.waiters = f.opt_u64("waiters").value_or(0);
    h.epoch = f.opt_u64("epoch").value_or(0);
    return finish(f, std::move(h));
}

Result<ReplicaFigures> ReplicaFigures::parse(const nlohmann::json& j) {
    Fields f(j, "the status's replicas");
    if (!f.ok()) return f.status();
    ReplicaFigures r;
    constexpr U64<ReplicaFigures> kOwn[] = {{"default_copies", &ReplicaFigures::default_copies},
                                            {"held", &ReplicaFigures::held},
                                            {"bytes", &ReplicaFigures::bytes},
                                            {"space", &ReplicaFigures::space}};
    read_all(f, r, kOwn);
    for (const auto& [k, v] : j.items()) {
        bool own = false;
        for (const auto& x : kOwn) own = own || k == x.name;
        if (!own && v.is_number_unsigned() && r.counters.size() < kMaxTransports * 4)
            r.counters[k] = v.get<uint64_t>();
    }
    return finish(f, std::move(r));
}

}  // namespace dyad::proto
