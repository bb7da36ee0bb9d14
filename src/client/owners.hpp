// SPDX-License-Identifier: Apache-2.0
// The owner directory: what the client knows of the services that own the
// files it fetches: their registry entries (transports, host), the
// endpoint to reach each at, and which could not be reached a moment ago
// (their files go to a replica first for a few seconds: failover.cpp).
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.hpp"
#include "record.hpp"
#include "service_link.hpp"

namespace dyad::client {

class OwnerDirectory {
  public:
    explicit OwnerDirectory(ServiceLink& link) : link_(link) {}

    // The owner service's registry entry (transport records, host), cached.
    Result<nlohmann::json> info(const std::string& owner, const ServiceInfo& svc);
    // False when `owner` is no longer in the registry (stopped, or its
    // lease in etcd ran out); drops what was cached of it.
    bool registered(const std::string& owner);
    // The owner's endpoint to fetch `rec` from: its Unix socket when on
    // this node, else its TCP address ("" if it lists neither).
    static std::string endpoint(const Record& rec, const ServiceInfo& svc);
    // Owners whose endpoint could not be reached lately: their files go to
    // a replica first for a few seconds.
    bool down(const std::string& owner);
    void note_down(const std::string& owner);
    void reset_after_fork();

  private:
    ServiceLink& link_;
    std::mutex mu_;
    std::map<std::string, nlohmann::json> owners_;                       // under mu_
    std::map<std::string, std::chrono::steady_clock::time_point> down_;  // owner -> when (mu_)
};

}  // namespace dyad::client
