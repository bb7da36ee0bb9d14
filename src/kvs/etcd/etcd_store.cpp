// SPDX-License-Identifier: Apache-2.0
#include "etcd_store.hpp"

#include <condition_variable>
#include <deque>
#include <set>
#include <thread>

#include "common/log.hpp"
#include "etcd_client.hpp"
#include "etcd_watch.hpp"
#include "kvs/registry.hpp"
#include "proto/record.hpp"
#include "common/json_text.hpp"

namespace dyad::kvs::etcd {
namespace {
const char* kSub = "etcd";
// How long a namespace's record count (for its quota) is trusted before it
// is counted again, when a put would reach the quota.
constexpr double kCountFresh = 2.0;
constexpr int kPutAttempts = 16;  // compare-and-put rounds lost to other writers
// The lookup of a wait: an etcd that does not answer within this is down
// for the waiter (it asks again), not a pool thread held for 30 s.
constexpr double kWaitLookup = 3.0;
// Operations of one transaction (etcd's --max-txn-ops, 128 by default) and
// bytes of keys and values of the puts batched into one (its
// --max-request-bytes is 1.5 MiB by default).
constexpr size_t kTxnOps = 128;
constexpr size_t kBatchBytes = 1u << 20;

std::string unescape(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '%' && i + 2 < s.size()) {
            std::string hex = s.substr(i + 1, 2);
            if (hex == "25" || hex == "2F") {
                out += hex == "25" ? '%' : '/';
                i += 2;
                continue;
            }
        }
        out += s[i];
    }
    return out;
}

std::string owner_of(const std::string& value) {
    return proto::record_owner(value).value_or(std::string());
}

// "key's create (CREATE) or mod (MOD) revision equals rev".
pb::Compare compare_rev(const std::string& key, pb::Compare::CompareTarget target, int64_t rev) {
    pb::Compare c;
    c.set_key(key);
    c.set_target(target);
    c.set_result(pb::Compare::EQUAL);
    if (target == pb::Compare::CREATE)
        c.set_create_revision(rev);
    else
        c.set_mod_revision(rev);
    return c;
}

void add_put(google::protobuf::RepeatedPtrField<pb::RequestOp>* ops, const std::string& key,
             const std::string& value, int64_t lease = 0) {
    auto* p = ops->Add()->mutable_request_put();
    p->set_key(key);
    p->set_value(value);
    if (lease) p->set_lease(lease);
}

void add_range(google::protobuf::RepeatedPtrField<pb::RequestOp>* ops, const std::string& key) {
    ops->Add()->mutable_request_range()->set_key(key);
}
}  // namespace

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

class EtcdStore final : public ServiceStore {
  public:
    EtcdStore(Options o, std::unique_ptr<Client> c)
        : o_(std::move(o)),
          c_(std::move(c)),
          watcher_(*c_, [this](const std::string& k) { return lookup(k, Deadline::after(30)); }) {
        c_->on_recovery([this] { return watcher_.waiters(); });
    }

    ~EtcdStore() override {
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
            ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
            (void)c_->lease().LeaseRevoke(&ctx, q, &a);
        }
    }

    Status probe(double seconds) {
        auto r =
            c_->range(o_.root + "/", prefix_end(o_.root + "/"), 1, true, Deadline::after(seconds));
        if (!r) return r.status();
        watcher_.start();
        return Status::ok();
    }

    std::string key_of(const std::string& ns, const std::string& key) const {
        if (ns == kServicesNamespace) return o_.root + "/services/" + escape(key);
        return ns_base(ns) + key;
    }
    std::string ns_base(const std::string& ns) const {
        if (ns == kServicesNamespace) return o_.root + "/services/";
        return o_.root + "/ns/" + escape(ns) + "/files/";
    }

    // The entry of an etcd key now, and the revision it was read at
    // (serializable: as the member the channel talks to has it).
    Result<std::pair<std::optional<Entry>, int64_t>> lookup(const std::string& k, Deadline d,
                                                            bool serializable = false) {
        auto r = c_->range(k, "", 1, false, d, serializable);
        if (!r) return r.status();
        std::optional<Entry> e;
        if (r->kvs_size() > 0)
            e = Entry{r->kvs(0).value(), static_cast<uint64_t>(r->kvs(0).mod_revision()), ""};
        return std::make_pair(std::move(e), r->header().revision());
    }

    Result<Entry> register_service(const std::string& id, const std::string& value,
                                   Deadline d) override {
        auto e = registered(id, value, d);
        if (!e)
            return Status(e.status())
                .wrap("cannot register in the metadata store (" + describe() + ")");
        return e;
    }

    Result<Entry> registered(const std::string& id, const std::string& value, Deadline d) {
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
                          "the registration of '" + id + "' vanished from etcd at " + c_->where(),
                          EIO);
        return *e->first;
    }

    Result<uint64_t> put(const std::string& ns, const std::string& key, const std::string& value,
                         const std::string& writer, uint64_t replaces, Deadline d) override {
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
    Status remove(const std::string& ns, const std::string& key, const std::string& writer,
                  Deadline d) override {
        if (ns == kServicesNamespace)
            return Status(DYAD_RC_NOAUTH, "the registry's entries are not removed by request",
                          EPERM);
        const std::string k = key_of(ns, key);
        for (int attempt = 0; attempt < kPutAttempts; ++attempt) {
            auto r = c_->range(k, "", 1, false, d);
            if (!r) return r.status();
            if (r->kvs_size() == 0)
                return Status(DYAD_RC_NOTFOUND,
                              "key '" + key + "' not found in namespace '" + ns + "'", ENOENT);
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

    // Records are read serializably (no consensus round per lookup); the
    // registry linearizably (whether an owner is still registered).
    Result<Entry> get(const std::string& ns, const std::string& key, Deadline d) override {
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
    Result<std::vector<Lookup>> get_many(const std::string& ns,
                                         const std::vector<std::string>& keys, size_t budget,
                                         Deadline d) override {
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

    uint64_t wait(const std::string& ns, const std::string& key, Deadline d, Done done) override {
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

    void cancel(uint64_t id) override {
        if (id) watcher_.cancel(id);
    }

    // etcd 3.4 walks every key of a range's index to answer it, whatever
    // its limit: a listing in pages of 1000 would cost a walk of the whole
    // remaining range per page (quadratic: 100 s for 1,000,000 records),
    // and so would chunks of 10,000 to the end of the namespace (13.8 s of
    // etcd's CPU for 1,000,000). So the service reads kListChunk entries at
    // most per range, each range bounded by a prefix of its first key (the
    // walk: about a chunk), and keeps what it has not sent yet, keyed by the
    // page's last key, for the listing's next page (at most kListCursors
    // listings, each for kListCursorSeconds).
    Result<Page> list(const std::string& ns, const std::string& prefix, const std::string& after,
                      uint64_t limit, Deadline d) override {
        const std::string base = ns_base(ns);
        const bool registry = ns == kServicesNamespace;
        const std::string cursor_key = base + '\0' + prefix + '\0' + after;
        Cursor cur;
        bool cached = false;
        {
            std::lock_guard<std::mutex> lk(cursor_mu_);
            expire_cursors();
            auto it = cursors_.find(cursor_key);
            if (it != cursors_.end()) {
                cur = std::move(it->second);
                cursors_.erase(it);
                cached = true;
            }
        }
        const std::string lo = base + (registry ? escape(prefix) : prefix);
        const std::string end = prefix_end(lo);
        if (!cached) {
            std::string from = lo;
            if (!after.empty()) {
                std::string a = base + (registry ? escape(after) : after) + std::string(1, '\0');
                if (a > from) from = a;
            }
            cur.next = from;
            cur.more = true;
            cur.depth = lo.size() + 1;
        }
        // Bounded ranges (see kListChunk): [next, the end of the keys that
        // share next's first `depth` bytes), narrower (depth + 1) after one
        // that held more than a chunk, wider after one that held few. They
        // follow each other without a gap, so every key is read once.
        while (cur.more && cur.rest.size() < std::max<uint64_t>(limit, kListChunk / 2)) {
            std::string bound = end;
            if (cur.depth > lo.size()) {
                std::string b = prefix_end(cur.next.substr(0, cur.depth));
                if (b.size() > 1 || b[0] != '\0') bound = std::min(b, end);
            }
            auto r = c_->range(cur.next, bound,
                               static_cast<int64_t>(std::max<uint64_t>(limit, kListChunk)), false,
                               d, !registry);
            if (!r) return r.status();
            ++list_ranges_;
            for (const auto& kv : r->kvs()) {
                std::string k = kv.key().substr(base.size());
                if (registry) k = unescape(k);
                cur.rest.emplace_back(
                    std::move(k), Entry{kv.value(), static_cast<uint64_t>(kv.mod_revision()), ""});
            }
            if (r->more() && r->kvs_size() > 0) {
                cur.next = r->kvs(r->kvs_size() - 1).key() + std::string(1, '\0');
                cur.depth = std::min(cur.depth + 1, cur.next.size());
            } else {
                cur.next = bound;
                cur.more = bound != end;
                if (static_cast<size_t>(r->kvs_size()) < kListChunk / 8 &&
                    cur.depth > lo.size() + 1)
                    --cur.depth;
            }
        }
        Page p;
        while (!cur.rest.empty() && p.entries.size() < limit) {
            p.entries.push_back(std::move(cur.rest.front()));
            cur.rest.pop_front();
        }
        p.more = !cur.rest.empty() || cur.more;
        if (p.more && !p.entries.empty()) {
            cur.at = std::chrono::steady_clock::now();
            std::lock_guard<std::mutex> lk(cursor_mu_);
            if (cursors_.size() >= kListCursors) cursors_.erase(cursors_.begin());
            cursors_[base + '\0' + prefix + '\0' + p.entries.back().first] = std::move(cur);
        }
        return p;
    }

    std::optional<Status> down() const override {
        if (c_->outage().up()) return std::nullopt;
        return c_->outage().unreachable_status();
    }
    std::optional<OutageView> outage() const override { return c_->outage().view(); }
    void check(std::function<void(bool, std::string)> done) override {
        if (c_->outage().up()) return done(true, "");
        done(false, c_->outage().health_text());
    }

    // The records put in a namespace after revision `after` (kvs.changes;
    // `dyad sync --follow`): a watch of the namespace's prefix from after + 1,
    // on a stream of its own that lives for this request only (at most
    // `wait` seconds). etcd answers a watch that starts in the past from its
    // revision-ordered history (it syncs such watches every 100 ms), so the
    // cost is that of the changes since `after`, not of the namespace. The
    // answer ends at a whole revision: the first answer etcd sends (all it
    // had), cut before the revision that would pass about a page
    // (kPageLimit entries, kPageBytes).
    Result<Changes> changes(const std::string& ns, uint64_t after, double wait,
                            Deadline d) override {
        ++changes_requests_;
        if (ns == kServicesNamespace)
            return Status(DYAD_RC_BADRPC, "kvs.changes does not serve the registry", ENOSYS);
        const std::string base = ns_base(ns);
        Changes out;
        if (after == 0) {
            // The revision now: a listing started after this holds every
            // record put up to it.
            auto r = c_->range(base, "", 1, true, d, true);
            if (!r) return r.status();
            out.next = static_cast<uint64_t>(r->header().revision());
            return out;
        }
        if (after >= static_cast<uint64_t>(INT64_MAX))
            return Status(DYAD_RC_BADUNPACK,
                          "kvs.changes: after " + std::to_string(after) + " is no etcd revision",
                          EINVAL);
        const double most = std::max(0.2, std::min(wait, d.remaining()));
        grpc::ClientContext ctx;
        ctx.set_wait_for_ready(true);
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::microseconds(static_cast<int64_t>(most * 1e6)));
        auto stream = c_->watch().Watch(&ctx);
        pb::WatchRequest q;
        auto* cr = q.mutable_create_request();
        cr->set_key(base);
        cr->set_range_end(prefix_end(base));
        cr->set_start_revision(static_cast<int64_t>(after) + 1);
        cr->add_filters(pb::WatchCreateRequest::NODELETE);
        cr->set_fragment(true);
        bool created = false, whole = true;
        std::string refused;  // etcd cancelled the watch (why)
        size_t bytes = 0;
        const size_t hard = 3 * kPageBytes;  // one revision larger: list again
        int64_t last = 0;
        auto trim_last = [&] {  // drops the events of the last revision
            while (!out.entries.empty() &&
                   out.entries.back().second.version == static_cast<uint64_t>(last))
                out.entries.pop_back();
            last =
                out.entries.empty() ? 0 : static_cast<int64_t>(out.entries.back().second.version);
        };
        if (stream->Write(q)) {
            pb::WatchResponse a;
            bool done = false;
            while (!done && stream->Read(&a)) {
                c_->answered();
                if (a.compact_revision() > 0) {
                    out.compacted = true;
                    break;
                }
                if (a.canceled()) {
                    refused = a.cancel_reason();
                    break;
                }
                if (a.created()) {
                    created = true;
                    // etcd's history restarted below the cursor (its data
                    // replaced): the cursor means nothing there.
                    if (a.header().revision() < static_cast<int64_t>(after)) {
                        out.compacted = true;
                        break;
                    }
                    continue;
                }
                whole = !a.fragment();
                for (const auto& ev : a.events()) {
                    const auto& kv = ev.kv();
                    const int64_t rev = kv.mod_revision();
                    if (rev != last && (out.entries.size() >= kPageLimit || bytes >= kPageBytes)) {
                        done = true;  // about a page, at a whole revision
                        whole = true;
                        break;
                    }
                    if (kv.key().size() < base.size() || rev <= static_cast<int64_t>(after))
                        continue;
                    bytes += kv.key().size() + kv.value().size();
                    if (bytes > hard) {
                        if (out.entries.empty() ||
                            out.entries.front().second.version == static_cast<uint64_t>(rev)) {
                            out.entries.clear();
                            out.compacted = true;  // one revision past an answer: list
                        } else {
                            last = rev;
                            trim_last();
                            whole = true;
                        }
                        done = true;
                        break;
                    }
                    out.entries.emplace_back(kv.key().substr(base.size()),
                                             Entry{kv.value(), static_cast<uint64_t>(rev), ""});
                    last = rev;
                }
                // etcd's whole answer (all it had from after + 1): enough.
                if (!out.entries.empty() && whole) done = true;
            }
        }
        ctx.TryCancel();
        grpc::Status fin = stream->Finish();
        if (!whole && !out.compacted) trim_last();  // a revision cut short
        if (!refused.empty())
            return Status(DYAD_RC_BADRPC,
                          "etcd at " + c_->where() + " refused a watch of '" + ns +
                              "' from revision " + std::to_string(after + 1) + ": " + refused,
                          EIO);
        if (!created && !out.compacted) {
            if (fin.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
                return Status(DYAD_RC_BADRPC,
                              "etcd at " + c_->where() + " did not start a watch within " +
                                  std::to_string(most) + " s",
                              ETIMEDOUT);
            return c_->failed(fin, "watch");
        }
        if (out.compacted) {
            ++changes_compacted_;
            out.entries.clear();
            out.next = after;
            return out;
        }
        out.next = out.entries.empty() ? after : static_cast<uint64_t>(last);
        changes_records_ += out.entries.size();
        return out;
    }
    void changes_refused() override { ++changes_refused_; }

    nlohmann::json status() const override {
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

    std::string describe() const override { return "etcd at " + c_->where(); }
    size_t max_key() const override { return o_.limits.max_key; }

  private:
    // Dense ranks in registration order; a service keeps its rank for the
    // life of the etcd data (ranks are not bound to the lease).
    Result<uint64_t> assign_rank(const std::string& id, Deadline d) {
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

    Status grant_and_put(Deadline d) {
        pb::LeaseGrantRequest q;
        q.set_ttl(static_cast<int64_t>(std::max(1.0, o_.lease_ttl + 0.5)));
        pb::LeaseGrantResponse a;
        Status s = c_->call(
            "etcd lease grant",
            [this](grpc::ClientContext* c, const pb::LeaseGrantRequest& r,
                   pb::LeaseGrantResponse* o) { return c_->lease().LeaseGrant(c, r, o); },
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
    void keepalive() {
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
            lease_cv_.wait_for(lk, std::chrono::duration<double>(backoff),
                               [this] { return stop_; });
            backoff = std::min(backoff * 2, 1.0);
        }
    }

    // Records per namespace: a count kept from etcd's (counted again when a
    // put would reach the quota and the count is older than kCountFresh), so
    // the common put costs no extra request. Several services may overshoot
    // the quota together by what they add within kCountFresh.
    Status check_quota(const std::string& ns, const std::string& k, Deadline d) {
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
    void counted(const std::string& ns, uint64_t n) {
        std::lock_guard<std::mutex> lk(count_mu_);
        auto it = counts_.find(ns);
        if (it != counts_.end() && it->second.known) it->second.count += n;
    }

    // Group commit of creates: a put's create-if-absent waits in queue_
    // while a transaction is in flight; the thread whose create is first
    // then sends the waiting ones (distinct keys, at most kTxnOps and
    // kBatchBytes) as one transaction: created all, if none of the keys
    // exists; else none, each told what its key holds (from the failure's
    // reads), and those whose key is free try again. One service's puts
    // thus cost one etcd round trip per batch, not per record.
    struct Create {
        const std::string& key;
        const std::string& value;
        Deadline deadline;
        bool done = false;
        Status status;
        bool created = false;
        int64_t revision = 0;
        std::optional<pb::KeyValue> had;  // not created: what the key holds (none: free)
    };
    Status create(Create& c) {
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
    void commit(const std::vector<Create*>& batch) {
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

    struct Cursor {
        std::deque<std::pair<std::string, Entry>> rest;  // read, not yet sent
        bool more = false;                               // etcd has more after rest
        std::string next;                                // from which etcd key
        size_t depth = 0;                                // bytes of next bounding a range
        std::chrono::steady_clock::time_point at;
    };
    static constexpr size_t kListChunk = 10000;
    static constexpr size_t kListCursors = 8;
    static constexpr double kListCursorSeconds = 60;
    void expire_cursors() {
        auto now = std::chrono::steady_clock::now();
        for (auto it = cursors_.begin(); it != cursors_.end();) {
            if (now - it->second.at > std::chrono::duration<double>(kListCursorSeconds))
                it = cursors_.erase(it);
            else
                ++it;
        }
    }

    Options o_;
    std::unique_ptr<Client> c_;
    std::mutex cursor_mu_;
    std::map<std::string, Cursor> cursors_;
    Watcher watcher_;
    mutable std::mutex lease_mu_;
    std::condition_variable lease_cv_;
    bool stop_ = false;
    int64_t lease_id_ = 0;
    uint64_t registrations_ = 0;
    std::string reg_id_, reg_value_;
    grpc::ClientContext* ka_ctx_ = nullptr;
    std::thread keepalive_;
    struct Count {
        bool known = false;
        uint64_t count = 0;
        std::chrono::steady_clock::time_point at;
    };
    std::mutex count_mu_;
    std::map<std::string, Count> counts_;
    std::mutex batch_mu_;  // queue_, committing_
    std::condition_variable batch_cv_;
    std::deque<Create*> queue_;
    bool committing_ = false;
    std::atomic<uint64_t> put_txns_{0}, batched_puts_{0}, largest_batch_{0}, get_many_txns_{0},
        list_ranges_{0};
    // kvs.changes: requests, records answered, "list again" answers (etcd
    // compacted past the cursor, or a revision too large for one answer),
    // requests refused (too many at once).
    std::atomic<uint64_t> changes_requests_{0}, changes_records_{0}, changes_compacted_{0},
        changes_refused_{0};
    std::atomic<uint64_t> refused_too_large_{0}, refused_records_{0};
};

Result<std::shared_ptr<ServiceStore>> connect(const Options& o, double connect_seconds) {
    auto c = Client::open(o.endpoints);
    if (!c) return c.status();
    auto s = std::make_shared<EtcdStore>(o, std::move(c.value()));
    Status ok = s->probe(connect_seconds);
    if (!ok) return Status(ok).wrap("cannot use etcd as the metadata store");
    DYAD_INFO(kSub, "metadata store: %s (lease TTL %.0f s)", s->describe().c_str(), o.lease_ttl);
    return std::shared_ptr<ServiceStore>(std::move(s));
}

}  // namespace dyad::kvs::etcd
