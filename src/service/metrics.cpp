// SPDX-License-Identifier: Apache-2.0
#include "metrics.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/log.hpp"
#include "common/seconds.hpp"
#include "common/trace.hpp"

namespace dyad::service {
namespace {
// Requests refused at once while the metadata store is down: the store's
// topics (kvs.get_many counts as "other") and publishes.
bool store_refusable(Kind k) {
    return k == Kind::kvs_get || k == Kind::kvs_wait || k == Kind::kvs_list || k == Kind::other ||
           k == Kind::publish;
}

constexpr const char* kSub = "dyadd";

std::string fmt_double(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    // The shortest form that reads back the same (0.1, not 0.10000000000000001).
    for (int p = 1; p < 17; ++p) {
        char b2[40];
        std::snprintf(b2, sizeof b2, "%.*g", p, v);
        if (std::strtod(b2, nullptr) == v) return b2;
    }
    return buf;
}

// A peer's string in a log line: printable ASCII, at most 200 bytes; the
// rest as \xNN (a path with a newline cannot forge a line).
std::string printable(const std::string& s) {
    std::string out;
    size_t n = std::min<size_t>(s.size(), 200);
    for (size_t i = 0; i < n; ++i) {
        auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x21 && c < 0x7f && c != '\\') {
            out += static_cast<char>(c);
        } else {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", c);
            out += b;
        }
    }
    if (s.size() > n) out += "...";
    return out.empty() ? "-" : out;
}

const std::string* str_arg(const nlohmann::json& a, const char* name) {
    auto it = a.find(name);
    if (it == a.end() || !it->is_string()) return nullptr;
    return &it->get_ref<const std::string&>();
}

// The trace event of a request this service served (DYAD_TRACE): serving a
// fetch, a batch, or a store operation, with what the peer asked (cut at
// 1 KiB: a peer chooses its strings) and what was sent.
void trace_request(const rpc::Request& r, Kind kind, const std::string& transport, uint64_t bytes,
                   double secs, const char* result) {
    const char* name = nullptr;
    switch (kind) {
        case Kind::fetch:
            name = "service.fetch";
            break;
        case Kind::fetch_many:
            name = "service.fetch_many";
            break;
        case Kind::kvs_put:
            name = "store.put";
            break;
        case Kind::kvs_get:
            name = "store.get";
            break;
        case Kind::kvs_wait:
            name = "store.wait";
            break;
        default:
            return;  // dyad.publish has its own event (publish.cpp)
    }
    nlohmann::json args = {{"result", result}, {"peer_pid", r.peer().pid}};
    for (const char* k : {"upath", "key", "ns"})
        if (const std::string* v = str_arg(r.args(), k)) args[k] = v->substr(0, 1024);
    if (auto g = r.args().find("generation"); g != r.args().end() && g->is_number_unsigned())
        args["generation"] = g->get<uint64_t>();
    if (auto f = r.args().find("files"); f != r.args().end() && f->is_array())
        args["files"] = f->size();
    if (!r.peer_service().empty()) args["peer_service"] = r.peer_service().substr(0, 1024);
    if (!transport.empty()) args["transport"] = transport;
    if (kind == Kind::fetch || kind == Kind::fetch_many) args["bytes"] = bytes;
    const double us = secs * 1e6;
    trace::complete(name, "service", trace::now_us() - static_cast<int64_t>(us), us, args);
}

const char* errno_name(int e) {
    const char* name = e > 0 ? ::strerrorname_np(e) : nullptr;
    return name ? name : "E?";
}

}  // namespace

const std::vector<double> kFastBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                          0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5};
const std::vector<double> kSlowBuckets = {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1,
                                          2.5,   5,     10,   30,   60,  120,  300};

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    std::lock_guard<std::mutex> lk(mu_);
    counts_[i]++;
    sum_ += v;
}

Histogram::Data Histogram::data() const {
    Data d;
    d.bounds = bounds_;
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t acc = 0;
    for (uint64_t c : counts_) {
        acc += c;
        d.cumulative.push_back(acc);
    }
    d.count = acc;
    d.sum = sum_;
    return d;
}

std::string escape_label(const std::string& v) {
    std::string out;
    out.reserve(v.size());
    for (char c : v) {
        if (c == '\\')
            out += "\\\\";
        else if (c == '"')
            out += "\\\"";
        else if (c == '\n')
            out += "\\n";
        else
            out += c;
    }
    return out;
}

void PromText::family(const std::string& name, const char* type, const std::string& help) {
    std::string h;
    for (char c : help) {
        if (c == '\\')
            h += "\\\\";
        else if (c == '\n')
            h += "\\n";
        else
            h += c;
    }
    out_ += "# HELP " + name + " " + h + "\n# TYPE " + name + " " + type + "\n";
}

void PromText::labels(const Labels& l, const char* le) {
    if (l.empty() && !le) return;
    out_ += '{';
    bool first = true;
    for (const auto& [k, v] : l) {
        if (!first) out_ += ',';
        first = false;
        out_ += k + "=\"" + escape_label(v) + "\"";
    }
    if (le) {
        if (!first) out_ += ',';
        out_ += std::string("le=\"") + le + "\"";
    }
    out_ += '}';
}

void PromText::sample(const std::string& name, const Labels& l, double v) {
    out_ += name;
    labels(l);
    out_ += " " + fmt_double(v) + "\n";
}

void PromText::sample(const std::string& name, const Labels& l, uint64_t v) {
    out_ += name;
    labels(l);
    out_ += " " + std::to_string(v) + "\n";
}

void PromText::histogram(const std::string& name, const Labels& l, const Histogram::Data& d) {
    for (size_t i = 0; i < d.cumulative.size(); ++i) {
        std::string le = i < d.bounds.size() ? fmt_double(d.bounds[i]) : "+Inf";
        out_ += name + "_bucket";
        labels(l, le.c_str());
        out_ += " " + std::to_string(d.cumulative[i]) + "\n";
    }
    sample(name + "_sum", l, d.sum);
    sample(name + "_count", l, d.count);
}

void PromText::counter(const std::string& name, const std::string& help, uint64_t v) {
    family(name, "counter", help);
    sample(name, {}, v);
}

void PromText::gauge(const std::string& name, const std::string& help, double v) {
    family(name, "gauge", help);
    sample(name, {}, v);
}

const char* kind_name(Kind k) {
    switch (k) {
        case Kind::fetch:
            return "fetch";
        case Kind::publish:
            return "publish";
        case Kind::status:
            return "status";
        case Kind::kvs_put:
            return "kvs_put";
        case Kind::kvs_get:
            return "kvs_get";
        case Kind::kvs_wait:
            return "kvs_wait";
        case Kind::kvs_list:
            return "kvs_list";
        case Kind::fetch_many:
            return "fetch_many";
        case Kind::other:
            break;
    }
    return "other";
}

Kind kind_of(const rpc::Request& r) {
    const std::string& t = r.topic();
    if (t == "dyad.fetch") return Kind::fetch;
    if (t == "dyad.fetch_many") return Kind::fetch_many;
    if (t == "dyad.publish") return Kind::publish;
    if (t == "dyad.status") return Kind::status;
    if (t == "kvs.put") return Kind::kvs_put;
    if (t == "kvs.list") return Kind::kvs_list;
    if (t == "kvs.get") {
        auto w = r.args().find("wait");
        bool wait = w != r.args().end() && w->is_boolean() && w->get<bool>();
        return wait ? Kind::kvs_wait : Kind::kvs_get;
    }
    return Kind::other;
}

RequestMetrics::RequestMetrics()
    : wait_for_create_(kSlowBuckets),
      store_ops_{Histogram(kFastBuckets), Histogram(kFastBuckets), Histogram(kFastBuckets)} {}

void RequestMetrics::started(const rpc::Request& r) {
    auto& k = kinds_[static_cast<size_t>(kind_of(r))];
    k.requests++;
    k.in_flight++;
}

void RequestMetrics::note(const rpc::Request& r, const std::string& transport, uint64_t bytes) {
    if (r.finished()) return;
    auto& n = notes_[&r];
    n.transport = transport;
    n.bytes = std::max(n.bytes, bytes);
}

void RequestMetrics::finished(const rpc::Request& r, const rpc::Outcome& o) {
    Kind kind = kind_of(r);
    auto& k = kinds_[static_cast<size_t>(kind)];
    if (k.in_flight) k.in_flight--;
    Note note;
    if (auto it = notes_.find(&r); it != notes_.end()) {
        note = std::move(it->second);
        notes_.erase(it);
    }
    const double secs = seconds_since(r.arrived());
    bool failed = false;
    const char* result = result_of(kind, o, k, &failed);
    if (failed) k.errors++;
    if (trace::on()) trace_request(r, kind, note.transport, note.bytes, secs, result);
    using How = rpc::Outcome::How;
    if (o.how == How::ended && kind == Kind::kvs_wait) wait_for_create_.observe(secs);
    if (o.how == How::ended || (o.how == How::error && !failed)) {
        if (kind == Kind::kvs_put) store_ops_[0].observe(secs);
        if (kind == Kind::kvs_get) store_ops_[1].observe(secs);
        if (kind == Kind::kvs_list) store_ops_[2].observe(secs);
    }
    log_line(r, kind, note, secs, result, o, failed);
}

// The result: ok, or one of the normal negative answers (an absent key,
// a wait whose slice ended: the client asks again), or a failure.
const char* RequestMetrics::result_of(Kind kind, const rpc::Outcome& o, PerKind& k, bool* failed) {
    using How = rpc::Outcome::How;
    switch (o.how) {
        case How::ended:
            return "ok";
        case How::error:
            if (kind == Kind::kvs_get && o.errnum == ENOENT) {
                not_found_++;
                return "not_found";
            }
            if (store_refusable(kind) && o.errnum == EHOSTUNREACH && o.rc == DYAD_RC_CONNFAIL) {
                // Refused while the store is down (kvs/outage.hpp): the
                // outage is logged once and counted by the store's figures,
                // not once per request a waiting client repeats.
                store_down_++;
                return "store_down";
            }
            *failed = true;
            return "error";
        case How::expired:
            if (kind == Kind::kvs_wait) {
                wait_expired_++;
                return "wait_expired";
            }
            *failed = true;
            return "error";
        case How::cancelled:
            k.cancelled++;
            return "cancelled";
    }
    return "ok";
}

void RequestMetrics::log_line(const rpc::Request& r, Kind kind, const Note& note, double secs,
                              const char* result, const rpc::Outcome& o, bool failed) {
    if (!failed && !log::enabled(log::Level::debug)) return;
    // A failure's warning is the peer's doing: rate-limited (debug logs all).
    if (failed && !log::enabled(log::Level::debug) && !failed_lines_.allow()) return;
    // One line per request: debug, or warn when it failed.
    const auto& a = r.args();
    std::string what;
    if (kind == Kind::fetch || kind == Kind::publish) {
        const std::string* p = str_arg(a, "upath");
        what = "path=" + printable(p ? *p : "");
    } else if (kind == Kind::kvs_put || kind == Kind::kvs_get || kind == Kind::kvs_wait ||
               kind == Kind::kvs_list) {
        const std::string* ns = str_arg(a, "ns");
        const std::string* key = str_arg(a, kind == Kind::kvs_list ? "prefix" : "key");
        what = "path=" + printable(ns ? *ns : "") + "/" + printable(key ? *key : "");
    } else if (kind == Kind::fetch_many) {
        auto f = a.find("files");
        what = "files=" + std::to_string(f != a.end() && f->is_array() ? f->size() : 0);
    } else {
        what = "path=-";
    }
    const auto& peer = r.peer();
    std::string who = "peer=" + printable(peer.address) + " pid=" + std::to_string(peer.pid);
    if (peer.role == "service") who += " service=" + printable(peer.service_id);
    char head[96];
    std::snprintf(head, sizeof head, "req=%llu.%u", static_cast<unsigned long long>(r.connection()),
                  r.tag());
    std::string line = std::string(head) + " " + who + " topic=" + printable(r.topic()) + " " +
                       what + " transport=" + (note.transport.empty() ? "-" : note.transport) +
                       " bytes=" + std::to_string(note.bytes);
    char tail[64];
    std::snprintf(tail, sizeof tail, " duration_ms=%.3f result=%s", secs * 1e3, result);
    line += tail;
    using How = rpc::Outcome::How;
    if (failed) {
        line += " errno=" + std::string(errno_name(o.errnum)) + " msg=\"" + printable(o.msg) + "\"";
        DYAD_WARN(kSub, "request failed: %s", line.c_str());
    } else {
        if (o.how != How::ended && !o.msg.empty()) line += " msg=\"" + printable(o.msg) + "\"";
        DYAD_DEBUG(kSub, "request: %s", line.c_str());
    }
}

void RequestMetrics::render(PromText& t) const {
    t.family("dyad_requests_total", "counter", "RPC requests received, by kind");
    for (size_t i = 0; i < kKinds; ++i)
        t.sample("dyad_requests_total", {{"kind", kind_name(static_cast<Kind>(i))}},
                 kinds_[i].requests);
    t.family("dyad_errors_total", "counter",
             "RPC requests answered with an error, by kind (each also logged as a warning)");
    for (size_t i = 0; i < kKinds; ++i)
        t.sample("dyad_errors_total", {{"kind", kind_name(static_cast<Kind>(i))}},
                 kinds_[i].errors);
    t.family("dyad_requests_cancelled_total", "counter",
             "RPC requests whose client cancelled them or went away before the answer, by kind");
    for (size_t i = 0; i < kKinds; ++i)
        t.sample("dyad_requests_cancelled_total", {{"kind", kind_name(static_cast<Kind>(i))}},
                 kinds_[i].cancelled);
    t.family("dyad_requests_in_flight", "gauge", "RPC requests in progress, by kind");
    for (size_t i = 0; i < kKinds; ++i)
        t.sample("dyad_requests_in_flight", {{"kind", kind_name(static_cast<Kind>(i))}},
                 kinds_[i].in_flight);
    t.counter("dyad_kvs_get_not_found_total",
              "metadata lookups (kvs.get without wait) of an absent key", not_found_);
    t.counter("dyad_kvs_store_down_total",
              "metadata requests answered at once that the metadata store is unreachable (the "
              "client asks again until its deadline)",
              store_down_);
    t.counter("dyad_kvs_wait_expired_total",
              "waits for a key (kvs.get with wait) whose deadline passed before the key was put "
              "(a consumer waiting longer asks again)",
              wait_expired_);
    t.family("dyad_wait_for_create_seconds", "histogram",
             "time a wait for a key spent in this service's metadata store until the key was "
             "put (0 when it existed already); one wait request of at most 30 s each");
    t.histogram("dyad_wait_for_create_seconds", {}, wait_for_create_.data());
    t.family("dyad_store_operation_seconds", "histogram",
             "time this service's metadata store took to answer a put, get or list request");
    static const char* ops[] = {"put", "get", "list"};
    for (size_t i = 0; i < 3; ++i)
        t.histogram("dyad_store_operation_seconds", {{"op", ops[i]}}, store_ops_[i].data());
}

nlohmann::json RequestMetrics::to_json() const {
    nlohmann::json j = nlohmann::json::object();
    for (size_t i = 0; i < kKinds; ++i) {
        const auto& k = kinds_[i];
        j[kind_name(static_cast<Kind>(i))] = {{"requests", k.requests},
                                              {"errors", k.errors},
                                              {"cancelled", k.cancelled},
                                              {"in_flight", k.in_flight}};
    }
    return j;
}

}  // namespace dyad::service
