// SPDX-License-Identifier: Apache-2.0
// The embedded store a dyadd hosts (a MemoryStore) as a ServiceStore: its
// calls take a lock and never block, so its topics are answered on the
// service's loop and its own publishes come from file threads.
#pragma once

#include <memory>
#include <mutex>

#include "service_store.hpp"

namespace dyad::kvs {

class EmbeddedStore final : public ServiceStore {
  public:
    // Hosts `store` (state_dir: where its epoch is kept; endpoint and ns:
    // for status).
    EmbeddedStore(std::unique_ptr<MemoryStore> store, std::string state_dir = "",
                  std::string endpoint = "", std::string ns = "");
    // Serves a store owned elsewhere (tests, kvs::serve(server, MemoryStore&)).
    explicit EmbeddedStore(MemoryStore& store);

    Result<Entry> register_service(const std::string& id, const std::string& value,
                                   Deadline d) override;
    Result<uint64_t> put(const std::string& ns, const std::string& key, const std::string& value,
                         const std::string& writer, uint64_t replaces, Deadline d) override;
    Status remove(const std::string& ns, const std::string& key, const std::string& writer,
                  Deadline d) override;
    Result<Entry> get(const std::string& ns, const std::string& key, Deadline d) override;
    uint64_t wait(const std::string& ns, const std::string& key, Deadline d, Done done) override;
    void cancel(uint64_t id) override;
    Result<Page> list(const std::string& ns, const std::string& prefix, const std::string& after,
                      uint64_t limit, Deadline d) override;
    bool takes_peer_puts() const override { return true; }
    bool blocks() const override { return false; }
    size_t max_key() const override { return store_->limits().max_key; }
    nlohmann::json status() const override;
    std::optional<HostedFigures> hosted() const override;
    std::string describe() const override { return "embedded store"; }

  private:
    std::unique_ptr<MemoryStore> owned_;
    MemoryStore* store_;
    std::string state_dir_, endpoint_, ns_;
    mutable std::mutex mu_;
};

}  // namespace dyad::kvs
