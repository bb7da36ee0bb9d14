// SPDX-License-Identifier: Apache-2.0
// The producer: publishes the files of the producer directory through the
// node's service (which checks each file and writes its record as its
// owner: clients never write the store, docs/security.md), and takes this
// node's records out again (dyad rm). DYAD_ASYNC_PUBLISH's queue
// (publish_queue.hpp) publishes through it on its own thread.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "cache.hpp"
#include "common/config.hpp"
#include "common/fd.hpp"
#include "common/paths.hpp"
#include "common/status.hpp"
#include "proto/publish.hpp"
#include "service_link.hpp"

namespace dyad::client {

class Producer {
  public:
    Producer(const Config& cfg, const ManagedDir& prod, const ManagedDir& cons, ServiceLink& link,
             Cache& cache)
        : cfg_(cfg), prod_(prod), cons_(cons), link_(link), cache_(cache) {}

    // Publishes a file of the producer directory. Unmanaged paths: UNTRACKED.
    Status produce(const std::string& path);
    // Removes the record of a file this node's service published: NOAUTH
    // for another node's file, NOTFOUND if not published; the file stays.
    Status unpublish(const std::string& path);

  private:
    // The relative path of a file to produce, or why it cannot be.
    // `verb` ("produce", "unpublish") names the call in the errors.
    Result<std::string> relative(const std::string& path, const char* verb) const;
    // What dyad.publish asks for the file `full` (relative path `upath`).
    proto::PublishRequest request(const std::string& upath, const std::string& full,
                                  const ServiceInfo& svc) const;
    // dyad.publish, asked again while the service's store is down (until
    // the deadline), with `proof` (the file, open) passed over a Unix
    // socket. *connect_failed: the service was not reached.
    Result<nlohmann::json> publish(const proto::PublishRequest& req, const std::string& full,
                                   const UniqueFd& proof, bool* connect_failed);
    // A failed publish, said for a user.
    Status publish_failure(const Status& e, bool connect_failed, const std::string& full) const;

    const Config& cfg_;
    const ManagedDir& prod_;
    const ManagedDir& cons_;
    ServiceLink& link_;
    Cache& cache_;
};

}  // namespace dyad::client
