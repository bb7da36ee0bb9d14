// SPDX-License-Identifier: Apache-2.0
// The status reporter: the part of the service that says what it is and
// does (status.cpp): dyad.status (`dyad service status`, the document
// proto::ServiceStatus types), the health check and the Prometheus text of
// the metrics endpoint. It reads the other parts; it changes nothing.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core.hpp"
#include "proto/service_status.hpp"
#include "rpc/server.hpp"

namespace dyad::service {

class FileServer;     // file_server.hpp
class Publisher;      // publisher.hpp
class ReplicaHolder;  // replica_holder.hpp

class StatusReporter {
  public:
    // `identity`: the service's identity (Service::identity).
    StatusReporter(Core& core, const std::unique_ptr<rpc::Server>& server, const FileServer& files,
                   const Publisher& publisher, const ReplicaHolder& replicas,
                   std::function<proto::Identity()> identity)
        : core_(core),
          server_(server),
          files_(files),
          publisher_(publisher),
          replicas_(replicas),
          identity_(std::move(identity)) {}

    // When the service started (Service::start).
    void started();
    // Where the metrics are served ("" for nowhere), for the status.
    void set_metrics_endpoint(std::string url) { metrics_endpoint_ = std::move(url); }
    // The transports still being set up (loop; Service's late_transports.cpp).
    void set_starting(std::function<std::set<std::string>()> starting) {
        starting_ = std::move(starting);
    }

    void on_status(std::shared_ptr<rpc::Request> r);
    // See Service::health and Service::metrics.
    void health(std::function<void(bool ok, std::string why)> done);
    void metrics(std::function<void(std::string text)> done);

  private:
    proto::ServiceStatus status() const;  // without the metadata store's health
    proto::ServiceStatus::Counters counters() const;
    proto::ServiceStatus::Peers peers() const;
    // The metadata store this service uses: backend, endpoint, reachable.
    nlohmann::json store_json(bool reachable, const std::string& why) const;
    std::string metrics_text() const;  // loop only
    void render_transfers(PromText& t) const;

    Core& core_;
    const std::unique_ptr<rpc::Server>& server_;
    const FileServer& files_;
    const Publisher& publisher_;
    const ReplicaHolder& replicas_;
    std::function<proto::Identity()> identity_;
    std::string metrics_endpoint_;
    std::function<std::set<std::string>()> starting_;
    std::chrono::system_clock::time_point started_wall_;
    std::chrono::steady_clock::time_point started_;
};

}  // namespace dyad::service
