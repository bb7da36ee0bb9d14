// SPDX-License-Identifier: Apache-2.0
// What dyadd says about itself: `dyad service status` (JSON), the health
// check and the Prometheus text of the metrics endpoint.
#include <chrono>
#include <string>

#include <dyad/dyad_version.h>

#include "common/settings.hpp"
#include "common/trace.hpp"
#include "common/seconds.hpp"
#include "file_server.hpp"
#include "publisher.hpp"
#include "replica_holder.hpp"
#include "status_reporter.hpp"

namespace dyad::service {

void StatusReporter::started() {
    started_ = std::chrono::steady_clock::now();
    started_wall_ = std::chrono::system_clock::now();
}

proto::ServiceStatus::Counters StatusReporter::counters() const {
    proto::ServiceStatus::Counters c;
    for (const auto& [name, n] : files_.per_transport()) {
        c.files_requested += n.requests;  // files asked for, one per file of a dyad.fetch_many
        auto& one = c.per_transport[name];
        one.requests = n.requests;
        one.served = n.served;
        one.errors = n.errors;
        one.bytes_sent = n.bytes_sent;
        one.bytes_received = n.bytes_received;
        one.in_flight = n.in_flight;
        auto it = files_.senders().find(name);
        if (it != files_.senders().end()) one.transport = it->second->stats();
    }
    const auto& total = files_.total();
    const auto& refused = files_.refused();
    c.requests = core_.metrics.kind(Kind::fetch).requests;
    c.fetch_many_requests = core_.metrics.kind(Kind::fetch_many).requests;
    c.served = total.served;
    c.errors = total.errors;
    c.bytes_sent = total.bytes_sent;
    c.bytes_received = total.bytes_received;
    c.in_flight = total.in_flight;
    c.rejected = refused.transport;
    c.refused_unproduced = refused.unproduced.load();
    c.refused_unreadable = refused.unreadable.load();
    c.refused_stale = refused.stale.load();
    c.published = publisher_.published();
    c.refused_not_producer = publisher_.refused_not_producer();
    if (const rpc::Server* server = server_.get()) {
        c.auth_refused = server->auth_refused();
        c.idle_closed = server->idle_closed();
        c.refused_peer_connections = server->refused_peer_connections();
        c.refused_connections_table_full = server->connections_refused();
        c.reserved_connections_admitted = server->reserved_admitted();
        c.refused_peer_request_bytes = server->refused_request_bytes_peer();
        c.refused_request_bytes = server->refused_request_bytes_total();
    }
    if (const PeerCaps* caps = core_.caps.get()) {
        c.refused_peer_fetches = caps->refused_fetches();
        c.refused_peer_local = caps->refused_local();
    }
    c.per_kind = core_.metrics.to_json();
    return c;
}

// The caps per peer (docs/security.md) and how close to them peers are.
proto::ServiceStatus::Peers StatusReporter::peers() const {
    const auto& o = core_.opts;
    proto::ServiceStatus::Peers p;
    if (core_.caps) p.caps = core_.caps->stats();
    p.max_connections_per_peer = o.max_connections_per_peer;
    p.max_fetches_per_peer = o.max_fetches_per_peer;
    p.max_local_per_peer = o.max_local_per_peer;
    p.memory_per_peer = core_.budget ? core_.budget->per_peer() : 0;
    p.max_request_bytes_per_peer = o.max_request_bytes_per_peer;
    p.max_request_bytes = o.max_request_bytes;
    p.max_wait_s = o.max_wait;
    if (const rpc::Server* server = server_.get()) {
        p.with_connections = server->peer_count();
        p.busiest_peer_connections = server->busiest_peer_connections();
        p.max_connections = server->max_connections();
        auto rb = server->request_bytes_stats();
        p.request_bytes_held = rb["held"];
        p.busiest_peer_request_bytes = rb["busiest_peer"];
    }
    return p;
}

namespace {

// The embedded store's figures (docs/user-guide.md, "dyad service status").
nlohmann::json hosted_json(const kvs::HostedFigures& h) {
    return {{"keys", h.records},
            {"waiters", h.waiters},
            {"bytes", h.bytes - h.registry_bytes},
            {"registry_bytes", h.registry_bytes},
            {"max_bytes", h.limits.max_bytes},
            {"refused", h.refusals.total()},
            {"refused_too_large", h.refusals.too_large},
            {"refused_store_full", h.refusals.store_full},
            {"refused_namespace_records", h.refusals.ns_records},
            {"refused_namespace_bytes", h.refusals.ns_bytes},
            {"max_records_per_namespace", h.limits.max_records_per_ns},
            {"namespaces", h.namespaces},
            {"max_namespaces", h.limits.max_namespaces},
            {"refused_namespaces", h.refusals.namespaces},
            {"max_bytes_per_namespace", h.ns_byte_quota},
            {"epoch", h.epoch},
            {"state_dir", h.state_dir}};
}

}  // namespace

proto::ServiceStatus StatusReporter::status() const {
    proto::ServiceStatus st;
    st.identity = identity_();
    st.counters = counters();
    st.peers = peers();
    st.connections = server_ ? server_->session_count() : 0;
    st.uptime_s = seconds_since(started_);
    if (!metrics_endpoint_.empty()) st.metrics = metrics_endpoint_;
    auto& j = st.rest;
    if (const Replicas* r = replicas_.replicas()) j["replicas"] = r->status();
    if (core_.budget) j["memory"] = core_.budget->stats();
    if (trace::on()) j["trace"] = trace::stats_json();  // --trace: its file and counters
    if (auto h = core_.store ? core_.store->hosted() : std::nullopt) j["store"] = hosted_json(*h);
    // The settings this service reads, with where each value came from.
    nlohmann::json mine = nlohmann::json::array();
    for (auto& s : settings::describe())
        if (s["read_by"].get<std::string>().find("dyadd") != std::string::npos) mine.push_back(s);
    j["settings"] = mine;
    return st;
}

void StatusReporter::on_status(std::shared_ptr<rpc::Request> r) {
    // With whether the metadata store answers (a remote one may take a
    // probe: the answer comes from the loop once it is known).
    health([this, r](bool ok, std::string why) {
        asio::post(core_.io, [this, r, ok, why = std::move(why)] {
            if (r->finished()) return;
            proto::ServiceStatus st = status();
            st.rest["metadata_store"] = store_json(ok, why);
            // Still being set up (late_transports.cpp).
            st.rest["transports_starting"] = starting_ ? starting_() : std::set<std::string>();
            r->end(st.build());
        });
    });
}

nlohmann::json StatusReporter::store_json(bool reachable, const std::string& why) const {
    // A store that knows whether it is reachable says so (etcd); for the
    // others health() found out.
    nlohmann::json j = core_.store->status();
    if (j.contains("reachable")) {
        if (!j.value("reachable", false)) j["error"] = j.value("error", why);
        return j;
    }
    j["reachable"] = reachable;
    if (!reachable) j["error"] = why;
    return j;
}

void StatusReporter::health(std::function<void(bool, std::string)> done) {
    // Through the loop first: a service whose loop does not turn is not
    // healthy, and the caller's deadline says so.
    asio::post(core_.io, [this, done = std::move(done)]() mutable {
        if (!core_.store) return done(true, "");
        core_.store->check(std::move(done));
    });
}

void StatusReporter::metrics(std::function<void(std::string)> done) {
    asio::post(core_.io, [this, done = std::move(done)] { done(metrics_text()); });
}

// Every metric, on the loop (docs/user-guide.md lists them). The counters are
// the ones status() shows.
namespace {

// The connections and the caps per peer (docs/security.md).
void render_connections(PromText& t, const rpc::Server* server, const PeerCaps* caps) {
    t.counter("dyad_auth_refused_total",
              "peers refused in their hello (no or wrong job key, uid not allowed)",
              server ? server->auth_refused() : 0);
    t.gauge("dyad_connections", "open connections of the DYAD port and socket",
            static_cast<double>(server ? server->session_count() : 0));
    t.counter("dyad_connections_refused_total",
              "connections closed at once because the connection table was full (for "
              "them: the last slots are kept for the service's own uid)",
              server ? server->connections_refused() : 0);
    t.counter("dyad_connections_idle_closed_total",
              "connections closed because they stayed idle for --idle-timeout",
              server ? server->idle_closed() : 0);
    t.family("dyad_peer_refused_total", "counter",
             "requests refused because their peer (host, or local process) was at a cap, by cap: "
             "connections (--max-connections-per-peer), fetches (--max-fetches-per-peer), local "
             "(--max-local-per-peer)");
    t.sample("dyad_peer_refused_total", {{"cap", "connections"}},
             server ? server->refused_peer_connections() : 0);
    t.sample("dyad_peer_refused_total", {{"cap", "fetches"}}, caps ? caps->refused_fetches() : 0);
    t.sample("dyad_peer_refused_total", {{"cap", "local"}}, caps ? caps->refused_local() : 0);
    t.sample("dyad_peer_refused_total", {{"cap", "request_bytes"}},
             server ? server->refused_request_bytes_peer() : 0);
    t.counter("dyad_request_bytes_refused_total",
              "requests refused because the requests in progress of all peers held "
              "--max-request-bytes of arguments",
              server ? server->refused_request_bytes_total() : 0);
}

// The transfer-memory budget.
void render_memory(PromText& t, const dtl::MemoryBudget& budget) {
    auto m = budget.stats();
    t.gauge("dyad_memory_budget_bytes",
            "size of the transfer buffer budget (--memory, DYAD_SERVICE_MEMORY)",
            m.value("limit", 0.0));
    t.gauge("dyad_memory_in_use_bytes", "transfer buffer memory held by transfers now",
            m.value("in_use", 0.0));
    t.gauge("dyad_memory_peak_bytes", "most transfer buffer memory held at once",
            m.value("peak", 0.0));
    t.gauge("dyad_memory_cached_bytes", "transfer buffers kept for reuse", m.value("cached", 0.0));
    t.gauge("dyad_memory_waiting_transfers", "transfers parked until memory is returned",
            m.value("waiting", 0.0));
    t.counter("dyad_memory_parked_total", "times a transfer was parked for memory",
              m.value("parked_total", uint64_t{0}));
    t.counter("dyad_memory_peer_limited_total",
              "times a transfer found its peer holding its share of the budget "
              "(--memory-per-peer)",
              m.value("peer_limited_total", uint64_t{0}));
}

// The metadata store: the embedded one's figures, and this service's calls.
void render_store(PromText& t, const std::optional<kvs::HostedFigures>& hosted,
                  const std::optional<kvs::OutageView>& outage, const Histogram (&calls)[2]) {
    t.gauge("dyad_store_embedded", "1 when this service hosts the metadata store, 0 with --kvs",
            hosted ? 1 : 0);
    // The embedded store is the service itself: up while this answers.
    const kvs::OutageView o = outage.value_or(kvs::OutageView{});
    t.gauge("dyad_store_up",
            "1 when the metadata store answers this service (etcd, or the store host with "
            "--kvs tcp://), 0 while it is unreachable",
            o.up ? 1 : 0);
    t.gauge("dyad_store_down_seconds", "seconds the metadata store has been unreachable (0: up)",
            o.up ? 0.0 : o.down_s);
    t.counter("dyad_store_errors_total",
              "calls and streams of this service to its metadata store that failed (unreachable, "
              "no answer in time)",
              o.errors);
    t.counter("dyad_store_outages_total",
              "times the metadata store went from answering to unreachable", o.outages);
    if (hosted) {
        t.gauge("dyad_store_records", "records (keys) in the embedded metadata store",
                static_cast<double>(hosted->records));
        t.gauge("dyad_store_bytes", "bytes of keys and values in the embedded metadata store",
                static_cast<double>(hosted->bytes));
        t.gauge("dyad_store_max_bytes", "bytes the embedded metadata store may hold (--store-max)",
                static_cast<double>(hosted->limits.max_bytes));
        t.gauge("dyad_store_waiters", "requests waiting for a key to be put",
                static_cast<double>(hosted->waiters));
        t.counter("dyad_store_puts_refused_total",
                  "puts the embedded metadata store refused for a size limit (key, value, "
                  "--store-max)",
                  hosted->refusals.total());
    }
    t.family("dyad_store_call_seconds", "histogram",
             "time this service's own metadata calls took (publish, fetch checks), embedded or "
             "remote, by operation");
    t.histogram("dyad_store_call_seconds", {{"op", "put"}}, calls[0].data());
    t.histogram("dyad_store_call_seconds", {{"op", "get"}}, calls[1].data());
}

}  // namespace

// The file server's figures: its transfers by transport, its refusals.
void StatusReporter::render_transfers(PromText& t) const {
    using Counters = FileServer::Counters;
    auto per = [&](const char* name, const char* type, const char* help, auto field) {
        t.family(name, type, help);
        for (const auto& [transport, c] : files_.per_transport())
            t.sample(name, {{"transport", transport}}, static_cast<uint64_t>(field(c)));
    };
    per("dyad_fetch_requests_total", "counter",
        "fetch requests for a transport this service serves, by transport",
        [](const Counters& c) { return c.requests; });
    per("dyad_bytes_sent_total", "counter", "bytes of files sent to consumers, by transport",
        [](const Counters& c) { return c.bytes_sent; });
    per("dyad_bytes_received_total", "counter", "bytes received from consumers, by transport",
        [](const Counters& c) { return c.bytes_received; });
    per("dyad_transfers_total", "counter",
        "fetches served completely (the consumer got the END trailer), by transport",
        [](const Counters& c) { return c.served; });
    per("dyad_transfer_failures_total", "counter",
        "fetches this service failed (refused, file gone or changed, transport error, consumer "
        "not reading), by transport",
        [](const Counters& c) { return c.errors; });
    per("dyad_transfers_in_flight", "gauge", "transfers sending now, by transport",
        [](const Counters& c) { return c.in_flight; });
    t.family("dyad_transfer_seconds", "histogram",
             "time this service took to send a file, from the first read to the transport's "
             "completion, successful transfers, by transport");
    for (const auto& [transport, h] : files_.transfer_seconds())
        t.histogram("dyad_transfer_seconds", {{"transport", transport}}, h->data());
    const auto& refused = files_.refused();
    t.family("dyad_fetch_refused_total", "counter",
             "fetches refused before any byte moved, by reason: a transport this service does not "
             "serve, a file it did not produce, a file changed since it was produced");
    t.sample("dyad_fetch_refused_total", {{"reason", "transport"}}, refused.transport);
    t.sample("dyad_fetch_refused_total", {{"reason", "unproduced"}}, refused.unproduced.load());
    t.sample("dyad_fetch_refused_total", {{"reason", "unreadable"}}, refused.unreadable.load());
    t.sample("dyad_fetch_refused_total", {{"reason", "stale"}}, refused.stale.load());
}

std::string StatusReporter::metrics_text() const {
    PromText t;
    t.family("dyad_info", "gauge",
             "this service: its id, node, version, authentication scheme and metadata store "
             "(the value is 1)");
    t.sample("dyad_info",
             {{"service_id", core_.id},
              {"node", core_.opts.node},
              {"version", dyad_version()},
              {"auth", core_.key ? auth::kScheme : "none"},
              {"store", core_.opts.kvs_uri.empty() ? std::string("embedded") : core_.opts.kvs_uri}},
             uint64_t{1});
    t.gauge("dyad_start_time_seconds", "when this service started, seconds since the Unix epoch",
            std::chrono::duration<double>(started_wall_.time_since_epoch()).count());
    t.gauge("dyad_uptime_seconds", "seconds since this service started", seconds_since(started_));

    core_.metrics.render(t);
    render_transfers(t);
    t.counter("dyad_published_total", "files this service published (dyad produce)",
              publisher_.published());

    render_connections(t, server_.get(), core_.caps.get());
    if (core_.budget) render_memory(t, *core_.budget);
    render_store(t, core_.store ? core_.store->hosted() : std::nullopt,
                 core_.store ? core_.store->outage() : std::nullopt, core_.calls.histograms());
    if (const Replicas* r = replicas_.replicas()) r->metrics(t);
    return std::move(t.str());
}

}  // namespace dyad::service
