// SPDX-License-Identifier: Apache-2.0
// dyadd's metrics: histograms, the Prometheus text exposition format (0.0.4)
// and the request observer that counts every RPC by kind, times the store's
// operations and wait-for-create, and writes one log line per request. The
// service's other counters (bytes, transfers, memory, store) stay where
// `dyad service status` reads them; Service::metrics() renders both.
#pragma once

#include <array>
#include <functional>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/rate_limit.hpp"
#include "common/seconds.hpp"
#include "rpc/server.hpp"

namespace dyad::service {

// Bucket bounds (seconds): store operations (microseconds to a second),
// waits and transfers (milliseconds to minutes).
extern const std::vector<double> kFastBuckets;
extern const std::vector<double> kSlowBuckets;

// A Prometheus histogram: counts per bucket, sum and count. Thread-safe.
class Histogram {
  public:
    explicit Histogram(std::vector<double> bounds);
    void observe(double v);
    struct Data {
        std::vector<double> bounds;
        std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
        uint64_t count = 0;
        double sum = 0;
    };
    Data data() const;

  private:
    mutable std::mutex mu_;
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_;  // per bucket, the last one above every bound
    double sum_ = 0;
};

// Observes, into a histogram, the seconds from its construction to the end
// of its scope.
class ScopedTimer {
  public:
    explicit ScopedTimer(Histogram& h) : h_(h), t0_(std::chrono::steady_clock::now()) {}
    ~ScopedTimer() { h_.observe(seconds_since(t0_)); }
    ScopedTimer(const ScopedTimer&) = delete;
    ScopedTimer& operator=(const ScopedTimer&) = delete;

  private:
    Histogram& h_;
    std::chrono::steady_clock::time_point t0_;
};

using Labels = std::vector<std::pair<std::string, std::string>>;

// Writes the text format: a family's HELP and TYPE once, then its samples.
class PromText {
  public:
    void family(const std::string& name, const char* type, const std::string& help);
    void sample(const std::string& name, const Labels& labels, double v);
    void sample(const std::string& name, const Labels& labels, uint64_t v);
    // The _bucket, _sum and _count samples of one histogram.
    void histogram(const std::string& name, const Labels& labels, const Histogram::Data& d);
    // A family with one unlabelled sample.
    void counter(const std::string& name, const std::string& help, uint64_t v);
    void gauge(const std::string& name, const std::string& help, double v);
    std::string& str() { return out_; }

  private:
    void labels(const Labels& l, const char* le = nullptr);
    std::string out_;
};

// Escapes a label value (\, ", newline).
std::string escape_label(const std::string& v);

// What a request is, as a label with a fixed set of values (a peer cannot
// make up new ones): the RPC topic, kvs.get split by whether it waits.
enum class Kind : uint8_t {
    fetch,
    publish,
    status,
    kvs_put,
    kvs_get,
    kvs_wait,
    kvs_list,
    fetch_many,
    other
};
constexpr size_t kKinds = 9;
const char* kind_name(Kind k);
Kind kind_of(const rpc::Request& r);

// Sees every request of the service's RPC server, on the loop.
class RequestMetrics : public rpc::RequestObserver {
  public:
    struct PerKind {
        uint64_t requests = 0;   // arrived
        uint64_t errors = 0;     // answered with an error (one warning each)
        uint64_t cancelled = 0;  // the peer cancelled or went away first
        uint64_t in_flight = 0;  // arrived, not ended
    };
    RequestMetrics();

    void started(const rpc::Request& r) override;
    void finished(const rpc::Request& r, const rpc::Outcome& o) override;
    // What the service learnt of a request in progress, for its log line
    // (loop only; ignored once the request ended).
    void note(const rpc::Request& r, const std::string& transport, uint64_t bytes);

    const PerKind& kind(Kind k) const { return kinds_[static_cast<size_t>(k)]; }
    // Loop only (with a consistent view of the counters).
    void render(PromText& t) const;
    nlohmann::json to_json() const;

  private:
    struct Note {
        std::string transport;
        uint64_t bytes = 0;
    };
    // How the request of `kind` ended (result label; *failed: an error of
    // its own, not a normal negative answer), counted.
    const char* result_of(Kind kind, const rpc::Outcome& o, PerKind& k, bool* failed);
    // Its log line: warn when it failed (rate-limited), else debug.
    void log_line(const rpc::Request& r, Kind kind, const Note& note, double secs,
                  const char* result, const rpc::Outcome& o, bool failed);
    std::array<PerKind, kKinds> kinds_{};
    // A failed request's warning is a peer's doing: at most 20 every 10 s
    // (then one line saying how many were left out); every failure is
    // counted in the status anyway. Debug logs them all.
    log::RateLimit failed_lines_{"dyadd", "failed requests"};
    uint64_t not_found_ = 0;     // kvs.get of an absent key
    uint64_t store_down_ = 0;    // kvs.* refused while the store is down
    uint64_t wait_expired_ = 0;  // kvs.get with wait whose deadline passed first
    std::unordered_map<const rpc::Request*, Note> notes_;
    Histogram wait_for_create_;
    std::array<Histogram, 3> store_ops_;  // put, get, list
};

}  // namespace dyad::service
