// SPDX-License-Identifier: Apache-2.0
// The store's topics served from any ServiceStore (docs/wire-protocol.md):
// kvs.put (from services, under the write rules below), kvs.get with
// wait-for-create, kvs.list (one page: kPageLimit entries, kPageBytes) and
// kvs.get_many. One argument check (proto/kvs.hpp) and one paging rule
// (PageBuilder) for every store.
#pragma once

#include <memory>
#include <string>

#include <asio/thread_pool.hpp>

#include "service_store.hpp"

namespace dyad::rpc {
class Server;
class Request;
}  // namespace dyad::rpc

namespace dyad::kvs {

// Serves `store` on `server` while it lives (the server's handlers refer
// to it): a store whose calls block is called from a pool of its own.
// Only services write (docs/security.md): a put must come from a peer that
// said it is a service (and proved the job's key where there is one), it
// may register only its own id in the registry and only records that name
// it as their owner; and only into a store that takes_peer_puts().
class StoreServer {
  public:
    StoreServer(rpc::Server& server, std::shared_ptr<ServiceStore> store);
    // Ends the pool (its calls finish first); the server's handlers then
    // answer nothing more.
    ~StoreServer();
    StoreServer(const StoreServer&) = delete;
    StoreServer& operator=(const StoreServer&) = delete;

    struct Topics;  // the handlers' state, shared with them (serve.cpp)

  private:
    std::shared_ptr<Topics> topics_;
};

// (serve(server, MemoryStore&), for a store the caller owns: store.hpp.)
// (The write rules, check_put and key_collision: store.hpp.)

}  // namespace dyad::kvs
