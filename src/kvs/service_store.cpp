// SPDX-License-Identifier: Apache-2.0
#include "service_store.hpp"

#include "embedded_store.hpp"
#include "epoch.hpp"
#include "remote_store.hpp"

namespace dyad::kvs {

Result<std::shared_ptr<ServiceStore>> make_service_store(StoreSetup s) {
    if (s.external) return std::move(s.external);
    if (s.uri.empty()) {
        // Generations never repeat across restarts: each run has an epoch.
        auto epoch = next_epoch(s.state_dir);
        if (!epoch) return Status(epoch.status()).wrap("embedded metadata store");
        return std::shared_ptr<ServiceStore>(std::make_shared<EmbeddedStore>(
            std::make_unique<MemoryStore>(s.limits, epoch.value()), std::move(s.state_dir),
            std::move(s.endpoint), std::move(s.ns)));
    }
    return std::shared_ptr<ServiceStore>(std::make_shared<RemoteStore>(
        std::move(s.uri), std::move(s.id), std::move(s.credentials), std::move(s.rejoin)));
}

}  // namespace dyad::kvs
