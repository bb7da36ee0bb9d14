// SPDX-License-Identifier: Apache-2.0
// The HTTP endpoint of dyadd --metrics-listen: GET /metrics (Prometheus text
// format 0.0.4) and GET /healthz, served with Boost.Beast on a thread and an
// io_context of its own (docs/design.md, "Metrics and health"). Part of the
// dyadd program only: Boost never enters libdyad.so.
//
// Robustness: a short deadline for each request's headers, several
// connections at once on one thread (asynchronous), at most kMaxConnections
// and kMaxPerPrincipal of them for one principal (a local uid, a remote
// host: rpc::principal_of, what the kernel says). Beyond the slots a few
// more are answered /healthz only (kHealthReserve, kHealthPerPrincipal of
// them for one principal), and the last kTrustedReserve are kept for the
// service's own uid and root; the rest are closed at once, all counted. So
// other users' connections (a reconnecting slowloris, a header flood, many
// scrapers) never make /healthz fail for the operator's probe. Header and
// body limits; the service's loop asked for the metrics text at most every
// 200 ms whatever the number of scrapers; anything that does not parse as
// an HTTP/1.x request gets an error response and the connection is closed.
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
    static constexpr size_t kMaxPerPrincipal = 8;  // of the kMaxConnections
    // Beyond kMaxConnections (or a principal's kMaxPerPrincipal), this many
    // more connections are answered GET /healthz only (kHealthTimeoutS to
    // send it), kHealthPerPrincipal of them for one principal; then
    // kTrustedReserve more, for the service's own uid and root only. The
    // rest are closed at once.
    static constexpr size_t kHealthReserve = 8;
    static constexpr size_t kHealthPerPrincipal = 2;
    static constexpr size_t kTrustedReserve = 2;
    static constexpr size_t kHeaderLimit = 8192;  // bytes of request line and headers
    // To receive one whole request (a GET is its headers), from the accept
    // or the previous answer; in a /healthz-only slot, kHealthTimeoutS.
    static constexpr int kReadTimeoutS = 2;
    static constexpr int kHealthTimeoutS = 1;
    static constexpr int kServiceTimeoutS = 3;  // for the service's loop to answer

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
