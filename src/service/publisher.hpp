// SPDX-License-Identifier: Apache-2.0
// The publisher: the part of the service that publishes the files of its
// producer directory (dyad.publish, dyad.unpublish: publish.cpp) and keeps
// what it published, its PublishLedger (publish_ledger.hpp): the check of
// every served file, the publish again after a remote store lost the
// service, and after the store's host restarted (its durable copy).
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core.hpp"
#include "kvs/record.hpp"
#include "proto/fetch.hpp"
#include "proto/origin_claim.hpp"
#include "publish_ledger.hpp"
#include "rpc/server.hpp"

namespace dyad::service {

class ReplicaHolder;  // replica_holder.hpp

class Publisher {
  public:
    Publisher(Core& core, ReplicaHolder& replicas) : core_(core), replicas_(replicas) {}

    void on_publish(std::shared_ptr<rpc::Request> r);
    void on_unpublish(std::shared_ptr<rpc::Request> r);
    // dyad.origin_claim (origin_claim.cpp): claims (or releases) an origin
    // file for this service, so that one node reads it from the origin.
    void on_origin_claim(std::shared_ptr<rpc::Request> r);

    // After the store is up, before serving: opens the ledger's durable
    // copy; the store's host publishes again what it published before it
    // restarted (docs/design.md, "The embedded store across restarts").
    Status restore();
    // Publishes again every file still as published, counting them in
    // `republished`; false: not finished (the store's kvs::Rejoin).
    bool republish(const std::function<bool()>& stopping, uint64_t& republished);
    // Whether the file as `sb` (its fstat under the lock) says it is, is `up`
    // as this service published it (`req`: the fetch's ns, key and
    // generation): its snapshot if so (file thread).
    Status check_served(const proto::FetchRequest& req, const struct stat& sb,
                        const std::string& up, Snapshot* snap);

    uint64_t published() const { return published_.load(); }
    uint64_t refused_not_producer() const { return refused_not_producer_.load(); }

  private:
    Result<proto::OriginClaimAnswer> origin_claim(const proto::OriginClaimRequest& req,
                                                  const std::string& up, const std::string& ns);
    Result<nlohmann::json> publish(const std::string& upath, const std::string& ns, unsigned depth,
                                   unsigned bins, uint64_t replaces, const rpc::Request& from);
    Result<nlohmann::json> unpublish(const std::string& upath, const std::string& ns,
                                     unsigned depth, unsigned bins);
    // Whether `from` may publish `up` (open as `sb`): access.hpp.
    Status may_publish(const rpc::Request& from, const std::string& up, const struct stat& sb);
    // A keyless publish or unpublish of `up` by `peer`: allowed to dyadd's
    // uid and root, else only for the uid that published it (publish.cpp);
    // `absent_ok`: also when this service has not published it.
    Status may_change(const rpc::Peer& peer, const std::string& up, const char* what,
                      bool absent_ok);
    // The record publish() writes for the file `up` as `sb` says it is.
    // The record of `up` as this service's, without the file's figures
    // (a claim of an origin file; record_of adds them).
    kvs::Record own_record(const std::string& up) const;
    kvs::Record record_of(const std::string& up, const struct stat& sb) const;
    // Opens a regular file beneath the producer directory (errors say why
    // not), for a publish or a re-join (publish.cpp).
    Result<UniqueFd> open_served_file(const std::string& upath);

    Core& core_;
    ReplicaHolder& replicas_;
    PublishLedger ledger_;  // what this service published
    std::atomic<uint64_t> published_{0};
    std::atomic<uint64_t> refused_not_producer_{0};  // keyless publishes/unpublishes refused
};

}  // namespace dyad::service
