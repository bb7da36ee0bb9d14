// SPDX-License-Identifier: Apache-2.0
// The client's link to its node's service: the hello (who the service is),
// the metadata store it uses, the pool of connections every request of
// the client goes over, and a fresh start in a child after fork().
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.hpp"
#include "common/status.hpp"
#include "kvs/store.hpp"
#include "rpc/client.hpp"

namespace dyad::client {

// Identity of the node's service, from its hello.
struct ServiceInfo {
    std::string id, node, ns, producer_dir, kvs;
    std::vector<std::string> endpoints;
    uint32_t rank = UINT32_MAX;  // the node's rank (DYAD_RANK_UNKNOWN if it did not say)
    // The hello itself, shared: a ServiceInfo is copied for every call
    // (service()), the document is not.
    std::shared_ptr<const nlohmann::json> raw;
    // producer_dir resolved (canonical_path) once, when the service was
    // first reached: a produce compares it with DYAD_PATH_PRODUCER's.
    std::string producer_dir_canonical;
    // The one place the hello is read (service_link.cpp), through
    // proto::Hello: a field of the wrong type is an error naming it.
    static Result<ServiceInfo> from_hello(const nlohmann::json& hello);
};

class ServiceLink {
  public:
    // `idle_per_uri`: idle connections the pool keeps per URI.
    ServiceLink(const Config& cfg, rpc::Credentials creds, size_t idle_per_uri);

    // The node's service (its hello, asked once; refused: why, and what to do).
    Result<ServiceInfo> service();
    // Has the service been reached (service() succeeded)?
    bool reached();
    // The metadata store the node's service uses (reached through it, or
    // directly when it names another).
    Result<kvs::Store*> store();
    // The namespace of the records: DYAD_KVS_NAMESPACE, else the service's.
    std::string ns(const ServiceInfo& svc) const;
    // A store operation that could not reach the store, said so (others
    // unchanged).
    Status store_failure(const Status& e, const ServiceInfo& svc) const;
    // dyad.status of the node's service, or of the service at `uri`.
    Result<nlohmann::json> status(const std::string& uri);
    // Every request of the client goes over these connections.
    rpc::ConnectionPool& pool() { return *pool_; }
    // In a child after fork(): drop the connections shared with the parent.
    void reset_after_fork();

  private:
    std::string store_uri(const ServiceInfo& svc) const;

    const Config& cfg_;
    const rpc::Credentials creds_;  // DYAD_AUTH_KEY_FILE
    const size_t idle_per_uri_;
    const bool slurm_job_;  // DYAD_JOB_MANAGER=slurm: the job's services are not the user's
    std::shared_ptr<rpc::ConnectionPool> pool_;
    std::mutex mu_;
    std::optional<ServiceInfo> svc_;     // under mu_
    std::unique_ptr<kvs::Store> store_;  // under mu_
};

}  // namespace dyad::client
