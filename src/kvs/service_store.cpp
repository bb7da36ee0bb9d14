// SPDX-License-Identifier: Apache-2.0
#include "service_store.hpp"

#include "embedded_store.hpp"
#include "epoch.hpp"
#include "remote_store.hpp"

namespace dyad::kvs {

Result<Changes> ServiceStore::changes(const std::string&, uint64_t, double, Deadline) {
    return Status(DYAD_RC_BADRPC,
                  describe() + " keeps no revisions to ask changes from (kvs.changes): list it",
                  ENOSYS);
}

Result<std::vector<Lookup>> ServiceStore::get_many(const std::string& ns,
                                                   const std::vector<std::string>& keys,
                                                   size_t budget, Deadline d) {
    std::vector<Lookup> out(keys.size());
    bool first = true;
    for (size_t i = 0; i < keys.size(); ++i) {
        auto e = get(ns, keys[i], d);
        if (!e && e.status().rc() != DYAD_RC_NOTFOUND) return e.status();
        if (!e) {
            out[i].state = Lookup::State::missing;
            continue;
        }
        const size_t cost = e->value.size() + 32;
        if (!first && cost > budget) break;  // this one and the rest: later
        budget = cost > budget ? 0 : budget - cost;
        first = false;
        out[i].state = Lookup::State::found;
        out[i].entry = std::move(e.value());
    }
    return out;
}

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
