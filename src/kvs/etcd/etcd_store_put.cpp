// SPDX-License-Identifier: Apache-2.0
// The etcd store (etcd_store_impl.hpp): put and remove: the quota per namespace and the group
// commit of creates.
#include "etcd_store_impl.hpp"

namespace dyad::kvs::etcd {

Result<uint64_t> EtcdStore::put(const std::string& ns, const std::string& key,
                                const std::string& value, const std::string& writer,
                                uint64_t replaces, Deadline d) {
    if (ns.size() > o_.limits.max_key || key.size() > o_.limits.max_key ||
        value.size() > o_.limits.max_value) {
        ++refused_too_large_;
        return Status(DYAD_RC_BADCOMMIT,
                      "metadata entry too large (key " + std::to_string(key.size()) +
                          " bytes, value " + std::to_string(value.size()) + " bytes; at most " +
                          std::to_string(o_.limits.max_key) + " and " +
                          std::to_string(o_.limits.max_value) + ")",
                      EMSGSIZE);
    }
    const std::string k = key_of(ns, key);
    for (int attempt = 0; attempt < kPutAttempts; ++attempt) {
        Status q = check_quota(ns, k, d);
        if (!q) return q;
        // Create it if nobody has (in one transaction with the creates
        // of other threads meanwhile); else read who has.
        Create c{k, value, d};
        Status cs = create(c);
        if (!cs) return cs;
        if (c.created) {
            counted(ns, 1);
            return static_cast<uint64_t>(c.revision);
        }
        if (!c.had) continue;  // deleted meanwhile: create it again
        const pb::KeyValue& kv = *c.had;
        const std::string owner = owner_of(kv.value());
        const auto gen = static_cast<uint64_t>(kv.mod_revision());
        auto won = ns == kServicesNamespace ? Result<bool>(false)
                                            : key_collision(ns, key, kv.value(), value);
        if (!won) return won.status();
        if (!won.value() && !owner.empty() && owner != writer && replaces != gen)
            return Status(
                DYAD_RC_BADCOMMIT,
                "'" + key + "' in namespace '" + ns + "' is produced by service '" + owner +
                    "' (generation " + std::to_string(gen) +
                    "): another service may publish it only as a change of the "
                    "version it consumed" +
                    (replaces ? " (it consumed generation " + std::to_string(replaces) + ")"
                              : std::string()),
                EEXIST);
        pb::TxnRequest u;
        *u.add_compare() = compare_rev(k, pb::Compare::MOD, kv.mod_revision());
        add_put(u.mutable_success(), k, value);
        auto w = c_->txn(u, d);
        if (!w) return w.status();
        if (w->succeeded()) return static_cast<uint64_t>(w->header().revision());
    }
    return Status(DYAD_RC_BADCOMMIT,
                  "'" + key + "' changed " + std::to_string(kPutAttempts) +
                      " times while this service published it: another producer writes it "
                      "at the same time",
                  EBUSY);
}

// The owner's rule of put: only the service a record names removes it;
// the delete compares the revision read, so a record published again
// meanwhile (by another) is not removed.
Status EtcdStore::remove(const std::string& ns, const std::string& key, const std::string& writer,
                         Deadline d) {
    if (ns == kServicesNamespace)
        return Status(DYAD_RC_NOAUTH, "the registry's entries are not removed by request", EPERM);
    const std::string k = key_of(ns, key);
    for (int attempt = 0; attempt < kPutAttempts; ++attempt) {
        auto r = c_->range(k, "", 1, false, d);
        if (!r) return r.status();
        if (r->kvs_size() == 0)
            return Status(DYAD_RC_NOTFOUND, "key '" + key + "' not found in namespace '" + ns + "'",
                          ENOENT);
        const auto& kv = r->kvs(0);
        const std::string owner = owner_of(kv.value());
        if (!owner.empty() && owner != writer)
            return Status(DYAD_RC_NOAUTH,
                          "'" + key + "' in namespace '" + ns + "' is produced by service '" +
                              owner + "': only that service may unpublish it",
                          EPERM);
        pb::TxnRequest t;
        *t.add_compare() = compare_rev(k, pb::Compare::MOD, kv.mod_revision());
        t.mutable_success()->Add()->mutable_request_delete_range()->set_key(k);
        auto w = c_->txn(t, d);
        if (!w) return w.status();
        if (w->succeeded()) {
            counted(ns, static_cast<uint64_t>(-1));
            return Status::ok();
        }
    }
    return Status(DYAD_RC_BADCOMMIT,
                  "'" + key + "' changed " + std::to_string(kPutAttempts) +
                      " times while this service unpublished it: another producer writes it "
                      "at the same time",
                  EBUSY);
}

// Records per namespace: a count kept from etcd's (counted again when a
// put would reach the quota and the count is older than kCountFresh), so
// the common put costs no extra request. Several services may overshoot
// the quota together by what they add within kCountFresh.
Status EtcdStore::check_quota(const std::string& ns, const std::string& k, Deadline d) {
    if (ns == kServicesNamespace) return Status::ok();
    const uint64_t quota = o_.limits.max_records_per_ns;
    std::unique_lock<std::mutex> lk(count_mu_);
    auto& c = counts_[ns];
    auto now = std::chrono::steady_clock::now();
    bool fresh = c.known && now - c.at < std::chrono::duration<double>(kCountFresh);
    if (c.known && c.count + 1 <= quota) return Status::ok();
    if (!fresh) {
        lk.unlock();
        const std::string base = ns_base(ns);
        auto n = c_->range(base, prefix_end(base), 0, true, d);
        if (!n) return n.status();
        lk.lock();
        auto& c2 = counts_[ns];
        c2.known = true;
        c2.count = static_cast<uint64_t>(n->count());
        c2.at = std::chrono::steady_clock::now();
        if (c2.count + 1 <= quota) return Status::ok();
    }
    lk.unlock();
    // At the quota: replacing a record adds none.
    auto e = lookup(k, d);
    if (!e) return e.status();
    if (e->first) return Status::ok();
    ++refused_records_;
    return Status(DYAD_RC_BADCOMMIT,
                  "namespace '" + ns + "' is at its quota of " + std::to_string(quota) +
                      " records: start the dyadd services with a larger "
                      "--store-max-records-per-namespace, or use another namespace",
                  EDQUOT);
}

void EtcdStore::counted(const std::string& ns, uint64_t n) {
    std::lock_guard<std::mutex> lk(count_mu_);
    auto it = counts_.find(ns);
    if (it != counts_.end() && it->second.known) it->second.count += n;
}

Status EtcdStore::create(Create& c) {
    std::unique_lock<std::mutex> lk(batch_mu_);
    queue_.push_back(&c);
    while (!c.done) {
        if (committing_) {
            batch_cv_.wait(lk);
            continue;
        }
        committing_ = true;
        std::vector<Create*> batch;
        std::set<std::string> keys;
        size_t bytes = 0;
        for (auto it = queue_.begin(); it != queue_.end() && batch.size() < kTxnOps;) {
            const size_t n = (*it)->key.size() + (*it)->value.size();
            if (!batch.empty() && bytes + n > kBatchBytes) break;
            if (!keys.insert((*it)->key).second) {  // the same key: in a later batch
                ++it;
                continue;
            }
            bytes += n;
            batch.push_back(*it);
            it = queue_.erase(it);
        }
        lk.unlock();
        commit(batch);
        lk.lock();
        committing_ = false;
        batch_cv_.notify_all();
    }
    return c.status;
}

void EtcdStore::commit(const std::vector<Create*>& batch) {
    Deadline d = batch.front()->deadline;
    pb::TxnRequest t;
    for (Create* c : batch) {
        if (c->deadline.remaining() < d.remaining()) d = c->deadline;
        *t.add_compare() = compare_rev(c->key, pb::Compare::CREATE, 0);
        add_put(t.mutable_success(), c->key, c->value);
        add_range(t.mutable_failure(), c->key);
    }
    auto r = c_->txn(t, d);
    ++put_txns_;
    if (batch.size() > 1) batched_puts_ += batch.size();
    if (batch.size() > largest_batch_) largest_batch_ = batch.size();
    if (r && !r->succeeded() && static_cast<size_t>(r->responses_size()) != batch.size())
        r = Status(DYAD_RC_BADRPC,
                   "etcd at " + c_->where() + " answered a transaction of " +
                       std::to_string(batch.size()) + " reads with " +
                       std::to_string(r->responses_size()) + " answers",
                   EPROTO);
    std::lock_guard<std::mutex> lk(batch_mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
        Create* c = batch[i];
        c->done = true;
        if (!r) {
            c->status = r.status();
        } else if (r->succeeded()) {
            c->created = true;
            c->revision = r->header().revision();
        } else {
            const auto& got = r->responses(static_cast<int>(i)).response_range();
            if (got.kvs_size() > 0) c->had = got.kvs(0);
        }
    }
}

}  // namespace dyad::kvs::etcd
