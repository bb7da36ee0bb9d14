// SPDX-License-Identifier: Apache-2.0
// What dyadd says about itself: `dyad service status` (JSON), the health
// check and the Prometheus text of the metrics endpoint.
#include <chrono>
#include <string>

#include <dyad/dyad_version.h>

#include "common/settings.hpp"
#include "common/trace.hpp"
#include "service.hpp"

namespace dyad::service {

nlohmann::json Service::status_json() const {
    nlohmann::json j = identity();
    nlohmann::json per = nlohmann::json::object();
    uint64_t files_requested = 0;  // files asked for, one per file of a dyad.fetch_many
    for (const auto& [name, c] : per_transport_) {
        files_requested += c.requests;
        per[name] = {{"requests", c.requests},
                     {"served", c.served},
                     {"errors", c.errors},
                     {"bytes_sent", c.bytes_sent},
                     {"bytes_received", c.bytes_received},
                     {"in_flight", c.in_flight}};
        auto it = senders_.find(name);
        if (it != senders_.end()) {
            auto extra = it->second->stats();
            if (extra.is_object() && !extra.empty()) per[name]["transport"] = extra;
        }
    }
    j["counters"] = {
        {"requests", metrics_->kind(Kind::fetch).requests},
        {"fetch_many_requests", metrics_->kind(Kind::fetch_many).requests},
        {"files_requested", files_requested},
        {"served", total_.served},
        {"errors", total_.errors},
        {"bytes_sent", total_.bytes_sent},
        {"bytes_received", total_.bytes_received},
        {"rejected", rejected_},
        {"published", published_count_.load()},
        {"refused_unproduced", refused_unproduced_.load()},
        {"refused_unreadable", refused_unreadable_.load()},
        {"refused_not_producer", refused_not_producer_.load()},
        {"refused_stale", refused_stale_.load()},
        {"auth_refused", server_ ? server_->auth_refused() : 0},
        {"idle_closed", server_ ? server_->idle_closed() : 0},
        {"refused_peer_connections", server_ ? server_->refused_peer_connections() : 0},
        {"refused_connections_table_full", server_ ? server_->connections_refused() : 0},
        {"reserved_connections_admitted", server_ ? server_->reserved_admitted() : 0},
        {"refused_peer_request_bytes", server_ ? server_->refused_request_bytes_peer() : 0},
        {"refused_request_bytes", server_ ? server_->refused_request_bytes_total() : 0},
        {"refused_peer_fetches", caps_ ? caps_->refused_fetches() : 0},
        {"refused_peer_local", caps_ ? caps_->refused_local() : 0},
        {"in_flight", total_.in_flight},
        {"per_transport", per},
        {"per_kind", metrics_->to_json()}};
    j["connections"] = server_ ? server_->session_count() : 0;
    if (replicas_) j["replicas"] = replicas_->status();
    // The caps per peer (docs/security.md) and how close to them peers are.
    nlohmann::json peers = caps_ ? caps_->stats() : nlohmann::json::object();
    peers["with_connections"] = server_ ? server_->peer_count() : 0;
    peers["busiest_peer_connections"] = server_ ? server_->busiest_peer_connections() : 0;
    peers["max_connections_per_peer"] = opts_.max_connections_per_peer;
    peers["max_fetches_per_peer"] = opts_.max_fetches_per_peer;
    peers["max_local_per_peer"] = opts_.max_local_per_peer;
    peers["memory_per_peer"] = budget_ ? budget_->per_peer() : 0;
    peers["max_request_bytes_per_peer"] = opts_.max_request_bytes_per_peer;
    peers["max_request_bytes"] = opts_.max_request_bytes;
    peers["max_wait_s"] = opts_.max_wait;
    peers["max_connections"] = server_ ? server_->max_connections() : 0;
    if (server_) {
        auto rb = server_->request_bytes_stats();
        peers["request_bytes_held"] = rb["held"];
        peers["busiest_peer_request_bytes"] = rb["busiest_peer"];
    }
    j["peers"] = peers;
    if (budget_) j["memory"] = budget_->stats();
    if (trace::on()) j["trace"] = trace::stats_json();  // --trace: its file and counters
    j["uptime_s"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    if (auto h = store_ ? store_->hosted() : std::nullopt)
        j["store"] = {{"keys", h->records},
                      {"waiters", h->waiters},
                      {"bytes", h->bytes - h->registry_bytes},
                      {"registry_bytes", h->registry_bytes},
                      {"max_bytes", h->limits.max_bytes},
                      {"refused", h->refusals.total()},
                      {"refused_too_large", h->refusals.too_large},
                      {"refused_store_full", h->refusals.store_full},
                      {"refused_namespace_records", h->refusals.ns_records},
                      {"refused_namespace_bytes", h->refusals.ns_bytes},
                      {"max_records_per_namespace", h->limits.max_records_per_ns},
                      {"namespaces", h->namespaces},
                      {"max_namespaces", h->limits.max_namespaces},
                      {"refused_namespaces", h->refusals.namespaces},
                      {"max_bytes_per_namespace", h->ns_byte_quota},
                      {"epoch", h->epoch},
                      {"state_dir", h->state_dir}};
    // The settings this service reads, with where each value came from.
    nlohmann::json mine = nlohmann::json::array();
    for (auto& s : settings::describe())
        if (s["read_by"].get<std::string>().find("dyadd") != std::string::npos) mine.push_back(s);
    j["settings"] = mine;
    return j;
}

void Service::on_status(std::shared_ptr<rpc::Request> r) {
    // With whether the metadata store answers (a remote one may take a
    // probe: the answer comes from the loop once it is known).
    health([this, r](bool ok, std::string why) {
        asio::post(io_, [this, r, ok, why = std::move(why)] {
            if (r->finished()) return;
            nlohmann::json j = status_json();
            j["metadata_store"] = store_json(ok, why);
            j["transports_starting"] = starting_;  // still being set up (late_transports.cpp)
            if (!metrics_endpoint_.empty()) j["metrics"] = metrics_endpoint_;
            r->end(std::move(j));
        });
    });
}

nlohmann::json Service::store_json(bool reachable, const std::string& why) const {
    // A store that knows whether it is reachable says so (etcd); for the
    // others health() found out.
    nlohmann::json j = store_->status();
    if (j.contains("reachable")) {
        if (!j.value("reachable", false)) j["error"] = j.value("error", why);
        return j;
    }
    j["reachable"] = reachable;
    if (!reachable) j["error"] = why;
    return j;
}

void Service::health(std::function<void(bool, std::string)> done) {
    // Through the loop first: a service whose loop does not turn is not
    // healthy, and the caller's deadline says so.
    asio::post(io_, [this, done = std::move(done)]() mutable {
        if (!store_) return done(true, "");
        store_->check(std::move(done));
    });
}

void Service::metrics(std::function<void(std::string)> done) {
    asio::post(io_, [this, done = std::move(done)] { done(metrics_text()); });
}

// Every metric, on the loop (docs/user-guide.md lists them). The counters are
// the ones status_json() shows.
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

std::string Service::metrics_text() const {
    PromText t;
    t.family("dyad_info", "gauge",
             "this service: its id, node, version, authentication scheme and metadata store "
             "(the value is 1)");
    t.sample("dyad_info",
             {{"service_id", id_},
              {"node", opts_.node},
              {"version", dyad_version()},
              {"auth", key_ ? auth::kScheme : "none"},
              {"store", opts_.kvs_uri.empty() ? std::string("embedded") : opts_.kvs_uri}},
             uint64_t{1});
    t.gauge("dyad_start_time_seconds", "when this service started, seconds since the Unix epoch",
            std::chrono::duration<double>(started_wall_.time_since_epoch()).count());
    t.gauge("dyad_uptime_seconds", "seconds since this service started",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());

    metrics_->render(t);

    auto per = [&](const char* name, const char* type, const char* help, auto field) {
        t.family(name, type, help);
        for (const auto& [transport, c] : per_transport_)
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
    for (const auto& [transport, h] : transfer_seconds_)
        t.histogram("dyad_transfer_seconds", {{"transport", transport}}, h->data());
    t.family("dyad_fetch_refused_total", "counter",
             "fetches refused before any byte moved, by reason: a transport this service does not "
             "serve, a file it did not produce, a file changed since it was produced");
    t.sample("dyad_fetch_refused_total", {{"reason", "transport"}}, rejected_);
    t.sample("dyad_fetch_refused_total", {{"reason", "unproduced"}}, refused_unproduced_.load());
    t.sample("dyad_fetch_refused_total", {{"reason", "unreadable"}}, refused_unreadable_.load());
    t.sample("dyad_fetch_refused_total", {{"reason", "stale"}}, refused_stale_.load());
    t.counter("dyad_published_total", "files this service published (dyad produce)",
              published_count_.load());

    render_connections(t, server_.get(), caps_.get());
    if (budget_) render_memory(t, *budget_);
    render_store(t, store_ ? store_->hosted() : std::nullopt,
                 store_ ? store_->outage() : std::nullopt, store_calls_);
    if (replicas_) replicas_->metrics(t);
    return std::move(t.str());
}

}  // namespace dyad::service
