// SPDX-License-Identifier: Apache-2.0
#include "embedded_store.hpp"

#include <cerrno>

namespace dyad::kvs {

EmbeddedStore::EmbeddedStore(std::unique_ptr<MemoryStore> store, std::string state_dir,
                             std::string endpoint, std::string ns)
    : owned_(std::move(store)),
      store_(owned_.get()),
      state_dir_(std::move(state_dir)),
      endpoint_(std::move(endpoint)),
      ns_(std::move(ns)) {}

EmbeddedStore::EmbeddedStore(MemoryStore& store) : store_(&store) {}

Result<Entry> EmbeddedStore::register_service(const std::string& id, const std::string& value,
                                              Deadline) {
    std::lock_guard<std::mutex> lk(mu_);
    auto v = store_->put(kServicesNamespace, id, value, id);
    if (!v) return v.status();
    return *store_->get(kServicesNamespace, id);
}

Result<uint64_t> EmbeddedStore::put(const std::string& ns, const std::string& key,
                                    const std::string& value, const std::string& writer,
                                    uint64_t replaces, Deadline) {
    // (A waiter put() wakes is answered under the lock: its answer only
    // queues a frame.)
    std::lock_guard<std::mutex> lk(mu_);
    return store_->put(ns, key, value, writer, replaces);
}

Status EmbeddedStore::remove(const std::string& ns, const std::string& key,
                             const std::string& writer, Deadline) {
    std::lock_guard<std::mutex> lk(mu_);
    return store_->remove(ns, key, writer);
}

Result<Entry> EmbeddedStore::get(const std::string& ns, const std::string& key, Deadline) {
    std::lock_guard<std::mutex> lk(mu_);
    auto e = store_->get(ns, key);
    if (!e) return Status(DYAD_RC_NOTFOUND, "no record", ENOENT);
    return std::move(*e);
}

uint64_t EmbeddedStore::wait(const std::string& ns, const std::string& key, Deadline, Done done) {
    std::unique_lock<std::mutex> lk(mu_);
    if (auto e = store_->get(ns, key)) {
        lk.unlock();
        done(std::move(*e));
        return 0;
    }
    return store_->watch_create(ns, key, [done = std::move(done)](const Entry& e) { done(e); });
}

void EmbeddedStore::cancel(uint64_t id) {
    if (!id) return;
    std::lock_guard<std::mutex> lk(mu_);
    store_->unwatch(id);
}

Result<Page> EmbeddedStore::list(const std::string& ns, const std::string& prefix,
                                 const std::string& after, uint64_t limit, Deadline) {
    std::lock_guard<std::mutex> lk(mu_);
    return store_->list_page(ns, prefix, after, limit);
}

nlohmann::json EmbeddedStore::status() const {
    std::lock_guard<std::mutex> lk(mu_);
    return {{"backend", "embedded"}, {"endpoint", endpoint_}, {"epoch", store_->epoch()}};
}

std::optional<HostedFigures> EmbeddedStore::hosted() const {
    std::lock_guard<std::mutex> lk(mu_);
    HostedFigures f;
    f.records = store_->key_count();
    f.waiters = store_->watcher_count();
    f.bytes = store_->bytes();
    f.registry_bytes = store_->registry_bytes();
    f.namespaces = store_->namespace_count();
    f.ns_byte_quota = store_->ns_byte_quota(ns_);
    f.limits = store_->limits();
    f.refusals = store_->refusals();
    f.epoch = store_->epoch();
    f.state_dir = state_dir_;
    return f;
}

}  // namespace dyad::kvs
