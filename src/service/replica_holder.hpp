// SPDX-License-Identifier: Apache-2.0
// The replica holder: the part of the service that speaks for its replicas
// (docs/design.md, "Replicas"; the mechanism is Replicas, replicas.hpp):
// made at start, dyad.replicate, dyad.replicate_many and dyad.unreplicate
// (a holder asked by an owner), the pushes after a publish, and the files
// a replica fetch opens (replicate.cpp).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core.hpp"
#include "proto/fetch.hpp"
#include "replicas.hpp"
#include "rpc/server.hpp"
#include "serve_file.hpp"

namespace dyad::service {

class ReplicaHolder {
  public:
    explicit ReplicaHolder(Core& core) : core_(core) {}
    // Ends the pulls in progress and the pushes' worker (before the store
    // and the loop go).
    void shutdown();

    // Once the service is registered (its endpoints known).
    Status start();

    void on_replicate(std::shared_ptr<rpc::Request> r);
    void on_replicate_many(std::shared_ptr<rpc::Request> r);
    void on_unreplicate(std::shared_ptr<rpc::Request> r);
    // The owner's pushes after a publish: answers r, at once or once k
    // copies are durable with `sync` (from a file thread).
    void replicate_then_answer(const std::shared_ptr<rpc::Request>& r, nlohmann::json answer,
                               const std::string& ns, uint64_t k, bool sync);
    // A replica fetch's file, beneath the namespace's replica directory.
    Result<ServedFile> open(const proto::FetchRequest& req);
    // Whether the file `sb` is the replica a fetch asks for (file thread).
    Status check(const proto::FetchRequest& req, const ServedFile& f);
    // The record of `key` in `ns` was removed: its replicas go too.
    void forget(const std::string& ns, const std::string& key, const kvs::Record& rec);

    // Null before start().
    const Replicas* replicas() const { return replicas_.get(); }

  private:
    Replicas::Hooks hooks();

    Core& core_;
    std::unique_ptr<Replicas> replicas_;
    // Pulls of replicas (they block for a whole transfer: not the file threads).
    asio::thread_pool pool_{2};
};

}  // namespace dyad::service
