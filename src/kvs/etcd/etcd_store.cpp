// SPDX-License-Identifier: Apache-2.0
// The etcd store (etcd_store.hpp): life cycle, reads, status. The class and
// its other parts: etcd_store_impl.hpp.
#include "etcd_store_impl.hpp"

#include "common/log.hpp"

namespace dyad::kvs::etcd {

std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '%')
            out += "%25";
        else if (c == '/')
            out += "%2F";
        else
            out += c;
    }
    return out;
}

Result<std::vector<std::string>> parse_uri(const std::string& uri) {
    const std::string scheme = "etcd://";
    if (uri.compare(0, scheme.size(), scheme) != 0)
        return Status(DYAD_RC_BAD_CLI_PARSE, "'" + uri + "' is not etcd://HOST:PORT[,HOST:PORT...]",
                      EINVAL);
    std::vector<std::string> out;
    std::string rest = uri.substr(scheme.size());
    rest = rest.substr(0, rest.find('?'));
    while (!rest.empty() && rest.back() == '/') rest.pop_back();
    size_t pos = 0;
    while (pos <= rest.size()) {
        size_t comma = rest.find(',', pos);
        std::string ep =
            rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        if (ep.empty() || ep.find(':') == std::string::npos)
            return Status(DYAD_RC_BAD_CLI_PARSE,
                          "'" + uri + "': endpoint '" + ep +
                              "' is not HOST:PORT (e.g. etcd://10.0.0.1:2379,10.0.0.2:2379)",
                          EINVAL);
        out.push_back(ep);
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    return out;
}

Status parse_uri_security(const std::string& uri, Security* s) {
    size_t q = uri.find('?');
    return q == std::string::npos ? Status::ok() : parse_security(uri.substr(q + 1), s);
}

EtcdStore::EtcdStore(Options o, std::unique_ptr<Client> c)
    : o_(std::move(o)),
      c_(std::move(c)),
      // The watcher's lookups (a key written to while its watch was made,
      // a compacted start) are bounded as a wait's own: an etcd that does
      // not answer holds neither the watcher's threads nor its stop.
      watcher_(*c_,
               [this](const std::string& k) { return lookup(k, Deadline::after(kWaitLookup)); }) {
    c_->on_recovery([this] { return watcher_.waiters(); });
}

EtcdStore::~EtcdStore() {
    {
        std::lock_guard<std::mutex> lk(lease_mu_);
        stop_ = true;
        if (ka_ctx_) ka_ctx_->TryCancel();
    }
    lease_cv_.notify_all();
    if (keepalive_.joinable()) keepalive_.join();
    watcher_.stop();
    // A clean stop takes the registration away at once (its consumers
    // learn the service is gone without waiting for the lease to end).
    if (lease_id_) {
        pb::LeaseRevokeRequest q;
        q.set_id(lease_id_);
        pb::LeaseRevokeResponse a;
        grpc::ClientContext ctx;
        // Best effort: the lease ends by itself; at a job's end its etcd may be
        // stopping already.
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
        (void)c_->lease().LeaseRevoke(&ctx, q, &a);
    }
}

Status EtcdStore::probe(double seconds) {
    auto r = c_->range(o_.root + "/", prefix_end(o_.root + "/"), 1, true, Deadline::after(seconds));
    if (!r) return r.status();
    watcher_.start();
    return Status::ok();
}

// The entry of an etcd key now, and the revision it was read at
// (serializable: as the member the channel talks to has it).
Result<std::pair<std::optional<Entry>, int64_t>> EtcdStore::lookup(const std::string& k, Deadline d,
                                                                   bool serializable) {
    auto r = c_->range(k, "", 1, false, d, serializable);
    if (!r) return r.status();
    std::optional<Entry> e;
    if (r->kvs_size() > 0)
        e = Entry{r->kvs(0).value(), static_cast<uint64_t>(r->kvs(0).mod_revision()), ""};
    return std::make_pair(std::move(e), r->header().revision());
}

// Records are read serializably (no consensus round per lookup); the
// registry linearizably (whether an owner is still registered).
Result<Entry> EtcdStore::get(const std::string& ns, const std::string& key, Deadline d) {
    auto r = lookup(key_of(ns, key), d, ns != kServicesNamespace);
    if (!r) return r.status();
    if (!r->first)
        return Status(DYAD_RC_NOTFOUND, "key '" + key + "' not found in namespace '" + ns + "'",
                      ENOENT);
    return *r->first;
}

// One transaction of serializable reads per kTxnOps keys (a read-only
// transaction whose reads are all serializable is answered by the
// member itself, as a serializable range).
Result<std::vector<Lookup>> EtcdStore::get_many(const std::string& ns,
                                                const std::vector<std::string>& keys, size_t budget,
                                                Deadline d) {
    const bool serializable = ns != kServicesNamespace;
    std::vector<Lookup> out(keys.size());
    bool first = true;
    for (size_t at = 0; at < keys.size(); at += kTxnOps) {
        const size_t end = std::min(keys.size(), at + kTxnOps);
        pb::TxnRequest t;
        std::vector<size_t> asked;  // a key longer than a put allows is never there
        for (size_t i = at; i < end; ++i) {
            if (keys[i].size() > o_.limits.max_key || ns.size() > o_.limits.max_key) {
                out[i].state = Lookup::State::missing;
                continue;
            }
            asked.push_back(i);
            auto* q = t.add_success()->mutable_request_range();
            q->set_key(key_of(ns, keys[i]));
            q->set_limit(1);
            q->set_serializable(serializable);
        }
        if (asked.empty()) continue;
        auto r = c_->txn(t, d);
        if (!r) return r.status();
        ++get_many_txns_;
        if (static_cast<size_t>(r->responses_size()) != asked.size())
            return Status(DYAD_RC_BADRPC,
                          "etcd at " + c_->where() + " answered a transaction of " +
                              std::to_string(asked.size()) + " reads with " +
                              std::to_string(r->responses_size()) + " answers",
                          EPROTO);
        for (size_t j = 0; j < asked.size(); ++j) {
            const size_t i = asked[j];
            const auto& got = r->responses(static_cast<int>(j)).response_range();
            if (got.kvs_size() == 0) {
                out[i].state = Lookup::State::missing;
                continue;
            }
            const auto& kv = got.kvs(0);
            const size_t cost = kv.value().size() + 32;
            if (!first && cost > budget) return out;  // this one and the rest: later
            budget = cost > budget ? 0 : budget - cost;
            first = false;
            out[i].state = Lookup::State::found;
            out[i].entry = Entry{kv.value(), static_cast<uint64_t>(kv.mod_revision()), ""};
        }
    }
    return out;
}

uint64_t EtcdStore::wait(const std::string& ns, const std::string& key, Deadline d, Done done) {
    const std::string k = key_of(ns, key);
    // Serializable is safe here: the watch starts after the revision
    // read, whichever member answered, so no later put is missed. Not a
    // pool thread held until the deadline by an etcd that does not
    // answer: the client hears that the store is down and asks again
    // (until its own deadline).
    auto r = lookup(k, d.min(Deadline::after(kWaitLookup)), ns != kServicesNamespace);
    if (!r) {
        done(c_->reachable() ? r.status() : c_->outage().unreachable_status());
        return 0;
    }
    if (r->first) {
        done(*r->first);
        return 0;
    }
    return watcher_.add(k, r->second, d, std::move(done));
}

nlohmann::json EtcdStore::status() const {
    nlohmann::json j = watcher_.status();
    j["backend"] = "etcd";
    j["endpoint"] = c_->where();
    j["uri"] = "etcd://" + c_->where();
    c_->outage().describe(j);
    j["reachable"] = c_->reachable();
    double since = c_->seconds_since_answer();
    if (since >= 0) j["seconds_since_answer"] = since;
    std::lock_guard<std::mutex> lk(lease_mu_);
    j["lease_id"] = lease_id_;
    j["lease_ttl"] = o_.lease_ttl;
    j["registrations"] = registrations_;
    j["refused_too_large"] = refused_too_large_.load();
    // Creates: transactions sent, records created in a transaction
    // with others, the most in one; kvs.get_many's transactions.
    j["put_transactions"] = put_txns_.load();
    j["puts_batched"] = batched_puts_.load();
    j["largest_put_batch"] = largest_batch_.load();
    j["get_many_transactions"] = get_many_txns_.load();
    j["list_ranges"] = list_ranges_.load();
    j["changes_requests"] = changes_requests_.load();
    j["changes_records"] = changes_records_.load();
    j["changes_compacted"] = changes_compacted_.load();
    j["changes_refused"] = changes_refused_.load();
    j["refused_namespace_records"] = refused_records_.load();
    j["max_records_per_namespace"] = o_.limits.max_records_per_ns;
    return j;
}

Result<std::shared_ptr<ServiceStore>> connect(const Options& o, double connect_seconds) {
    auto c = Client::open(o.endpoints, o.security);
    if (!c) return c.status();
    if (Status a = c.value()->authenticate(Deadline::after(connect_seconds)); !a)
        return Status(a).wrap("cannot use etcd as the metadata store");
    auto s = std::make_shared<EtcdStore>(o, std::move(c.value()));
    Status ok = s->probe(connect_seconds);
    if (!ok) return Status(ok).wrap("cannot use etcd as the metadata store");
    DYAD_INFO(kSub, "metadata store: %s (lease TTL %.0f s)", s->describe().c_str(), o.lease_ttl);
    return std::shared_ptr<ServiceStore>(std::move(s));
}

}  // namespace dyad::kvs::etcd
