// SPDX-License-Identifier: Apache-2.0
// The HTTP endpoint of dyadd --metrics-listen: GET /metrics (Prometheus text
// format 0.0.4) and GET /healthz, served with Boost.Beast on a thread and an
// io_context of its own (docs/design.md, "Metrics and health"). Part of the
// dyadd program only: Boost never enters libdyad.so.
//
// Robustness: a read deadline per request, several connections at once on
// one thread (asynchronous), at most kMaxConnections (beyond them a few more
// are answered /healthz only, the rest closed at once, all counted), header
// and body limits, the service's loop asked for the metrics text at most
// every 200 ms whatever the number of scrapers; anything that does not parse as an
// HTTP/1.x request gets an error response and the connection is closed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.hpp"

namespace dyad::service {

// What the endpoint serves, asked from the HTTP thread; each answers through
// its callback, from any thread (Service::metrics and Service::health).
struct MetricsSource {
    std::function<void(std::function<void(std::string)>)> metrics;
    std::function<void(std::function<void(bool, std::string)>)> health;
};

class MetricsHttp {
  public:
    static constexpr size_t kMaxConnections = 32;
    // Beyond kMaxConnections, this many more connections are answered
    // GET /healthz only (1 s to send it); the rest are closed at once.
    static constexpr size_t kHealthReserve = 8;
    static constexpr size_t kHeaderLimit = 8192;  // bytes of request line and headers
    static constexpr int kReadTimeoutS = 5;       // to receive one whole request
    static constexpr int kServiceTimeoutS = 3;    // for the service's loop to answer

    explicit MetricsHttp(MetricsSource src);
    ~MetricsHttp();
    MetricsHttp(const MetricsHttp&) = delete;
    MetricsHttp& operator=(const MetricsHttp&) = delete;

    // Binds HOST:PORT (port 0 picks one); returns the bound "HOST:PORT".
    Result<std::string> listen(const std::string& host, uint16_t port);
    // Serves on a thread of its own until stop() (or destruction).
    void start();
    void stop();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace dyad::service
