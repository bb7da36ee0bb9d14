// SPDX-License-Identifier: Apache-2.0
// The etcd store (etcd_store_impl.hpp): the service's registration: its dense rank, the lease, the
// keep-alive.
#include "etcd_store_impl.hpp"

#include "common/log.hpp"
#include "kvs/registry.hpp"

namespace dyad::kvs::etcd {

Result<Entry> EtcdStore::register_service(const std::string& id, const std::string& value,
                                          Deadline d) {
    auto e = registered(id, value, d);
    if (!e)
        return Status(e.status())
            .wrap("cannot register in the metadata store (" + describe() + ")");
    return e;
}

Result<Entry> EtcdStore::registered(const std::string& id, const std::string& value, Deadline d) {
    auto ranked = registry::with_rank(id, value, [&]() -> Result<std::optional<uint64_t>> {
        auto rank = assign_rank(id, d);
        if (!rank) return rank.status();
        return std::optional<uint64_t>(rank.value());
    });
    if (!ranked) return ranked.status();
    {
        std::lock_guard<std::mutex> lk(lease_mu_);
        reg_id_ = id;
        reg_value_ = std::move(ranked.value());
    }
    Status s = grant_and_put(d);
    if (!s) return s;
    if (!keepalive_.joinable()) keepalive_ = std::thread([this] { keepalive(); });
    auto e = lookup(key_of(kServicesNamespace, id), d);
    if (!e) return e.status();
    if (!e->first)
        return Status(DYAD_RC_BADCOMMIT,
                      "the registration of '" + id + "' vanished from etcd at " + c_->where(), EIO);
    return *e->first;
}

// Dense ranks in registration order; a service keeps its rank for the
// life of the etcd data (ranks are not bound to the lease).
Result<uint64_t> EtcdStore::assign_rank(const std::string& id, Deadline d) {
    const std::string mine = o_.root + "/ranks/by-id/" + escape(id);
    const std::string claims = o_.root + "/ranks/claim/";
    auto have = lookup(mine, d);
    if (!have) return have.status();
    if (have->first) return std::strtoull(have->first->value.c_str(), nullptr, 10);
    auto n = c_->range(claims, prefix_end(claims), 0, true, d);
    if (!n) return n.status();
    for (uint64_t next = static_cast<uint64_t>(n->count()); next < UINT32_MAX; ++next) {
        const std::string claim = claims + std::to_string(next);
        pb::TxnRequest t;
        *t.add_compare() = compare_rev(claim, pb::Compare::CREATE, 0);
        *t.add_compare() = compare_rev(mine, pb::Compare::CREATE, 0);
        add_put(t.mutable_success(), claim, id);
        add_put(t.mutable_success(), mine, std::to_string(next));
        add_range(t.mutable_failure(), mine);
        auto r = c_->txn(t, d);
        if (!r) return r.status();
        if (r->succeeded()) return next;
        const auto& got = r->responses(0).response_range();
        if (got.kvs_size() > 0) return std::strtoull(got.kvs(0).value().c_str(), nullptr, 10);
    }
    return Status(DYAD_RC_BADCOMMIT, "no rank left in etcd at " + c_->where(), ENOSPC);
}

Status EtcdStore::grant_and_put(Deadline d) {
    pb::LeaseGrantRequest q;
    q.set_ttl(static_cast<int64_t>(std::max(1.0, o_.lease_ttl + 0.5)));
    pb::LeaseGrantResponse a;
    Status s = c_->call(
        "etcd lease grant",
        [this](grpc::ClientContext* c, const pb::LeaseGrantRequest& r, pb::LeaseGrantResponse* o) {
            return c_->lease().LeaseGrant(c, r, o);
        },
        q, &a, d, true);
    if (!s) return s;
    if (!a.error().empty())
        return Status(DYAD_RC_BADCOMMIT, "etcd refused a lease: " + a.error(), EIO);
    std::string key, value;
    {
        std::lock_guard<std::mutex> lk(lease_mu_);
        lease_id_ = a.id();
        key = key_of(kServicesNamespace, reg_id_);
        value = reg_value_;
        ++registrations_;
    }
    pb::PutRequest p;
    p.set_key(key);
    p.set_value(value);
    p.set_lease(a.id());
    pb::PutResponse pa;
    return c_->call(
        "etcd put of the service registration",
        [this](grpc::ClientContext* c, const pb::PutRequest& r, pb::PutResponse* o) {
            return c_->kv().Put(c, r, o);
        },
        p, &pa, d, true);
}

// Keeps the lease alive (every third of its TTL); registers again when
// it ended (etcd was away longer than the TTL).
void EtcdStore::keepalive() {
    const auto period = std::chrono::duration<double>(std::max(0.2, o_.lease_ttl / 3.0));
    double backoff = 0.1;
    for (;;) {
        grpc::ClientContext ctx;
        ctx.set_wait_for_ready(true);
        {
            std::lock_guard<std::mutex> lk(lease_mu_);
            if (stop_) return;
            ka_ctx_ = &ctx;
        }
        auto stream = c_->lease().LeaseKeepAlive(&ctx);
        for (;;) {
            pb::LeaseKeepAliveRequest q;
            {
                std::lock_guard<std::mutex> lk(lease_mu_);
                q.set_id(lease_id_);
            }
            pb::LeaseKeepAliveResponse a;
            if (!stream->Write(q) || !stream->Read(&a)) break;
            c_->answered();
            backoff = 0.1;
            if (a.ttl() <= 0) {
                DYAD_WARN(kSub,
                          "the lease of this service's registration in etcd at %s ended "
                          "(etcd was away longer than %.0f s): registering again",
                          c_->where().c_str(), o_.lease_ttl);
                Status s = grant_and_put(Deadline::after(o_.lease_ttl));
                if (!s) DYAD_WARN(kSub, "registering again failed: %s", s.to_string().c_str());
            }
            std::unique_lock<std::mutex> lk(lease_mu_);
            if (lease_cv_.wait_for(lk, period, [this] { return stop_; })) break;
        }
        ctx.TryCancel();
        grpc::Status st = stream->Finish();
        std::unique_lock<std::mutex> lk(lease_mu_);
        ka_ctx_ = nullptr;
        if (stop_) return;
        c_->failed("lease keep-alive stream to etcd at " + c_->where() +
                   " broke: " + st.error_message());
        lease_cv_.wait_for(lk, std::chrono::duration<double>(backoff), [this] { return stop_; });
        backoff = std::min(backoff * 2, 1.0);
    }
}

}  // namespace dyad::kvs::etcd
