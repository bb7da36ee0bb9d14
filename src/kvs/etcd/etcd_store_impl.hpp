// SPDX-License-Identifier: Apache-2.0
// The etcd store's class (etcd_store.hpp says what it keeps where), private
// to src/kvs/etcd/. Its parts:
//   etcd_store.cpp           life cycle, reads (get, get_many, wait), status
//   etcd_store_register.cpp  the service's registration: rank, lease, keep-alive
//   etcd_store_put.cpp       put and remove: quota, group commit of creates
//   etcd_store_list.cpp      kvs.list's bounded ranges and kvs.changes' watch
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include "etcd_client.hpp"
#include "etcd_store.hpp"
#include "etcd_watch.hpp"
#include "proto/record.hpp"

namespace dyad::kvs::etcd {

inline constexpr const char* kSub = "etcd";
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

// The inverse of escape().
inline std::string unescape(const std::string& s) {
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

inline std::string owner_of(const std::string& value) {
    return proto::record_owner(value).value_or(std::string());
}

// "key's create (CREATE) or mod (MOD) revision equals rev".
inline pb::Compare compare_rev(const std::string& key, pb::Compare::CompareTarget target,
                               int64_t rev) {
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

inline void add_put(google::protobuf::RepeatedPtrField<pb::RequestOp>* ops, const std::string& key,
                    const std::string& value, int64_t lease = 0) {
    auto* p = ops->Add()->mutable_request_put();
    p->set_key(key);
    p->set_value(value);
    if (lease) p->set_lease(lease);
}

inline void add_range(google::protobuf::RepeatedPtrField<pb::RequestOp>* ops,
                      const std::string& key) {
    ops->Add()->mutable_request_range()->set_key(key);
}

class EtcdStore final : public ServiceStore {
  public:
    EtcdStore(Options o, std::unique_ptr<Client> c);
    ~EtcdStore() override;
    Status probe(double seconds);
    std::string key_of(const std::string& ns, const std::string& key) const {
        if (ns == kServicesNamespace) return o_.root + "/services/" + escape(key);
        return ns_base(ns) + key;
    }
    std::string ns_base(const std::string& ns) const {
        if (ns == kServicesNamespace) return o_.root + "/services/";
        return o_.root + "/ns/" + escape(ns) + "/files/";
    }

    Result<std::pair<std::optional<Entry>, int64_t>> lookup(const std::string& k, Deadline d,
                                                            bool serializable = false);
    Result<Entry> register_service(const std::string& id, const std::string& value,
                                   Deadline d) override;
    Result<Entry> registered(const std::string& id, const std::string& value, Deadline d);
    Result<uint64_t> put(const std::string& ns, const std::string& key, const std::string& value,
                         const std::string& writer, uint64_t replaces, Deadline d) override;
    Status remove(const std::string& ns, const std::string& key, const std::string& writer,
                  Deadline d) override;
    Result<Entry> get(const std::string& ns, const std::string& key, Deadline d) override;
    Result<std::vector<Lookup>> get_many(const std::string& ns,
                                         const std::vector<std::string>& keys, size_t budget,
                                         Deadline d) override;
    uint64_t wait(const std::string& ns, const std::string& key, Deadline d, Done done) override;
    void cancel(uint64_t id) override {
        if (id) watcher_.cancel(id);
    }

    Result<Page> list(const std::string& ns, const std::string& prefix, const std::string& after,
                      uint64_t limit, Deadline d) override;
    std::optional<Status> down() const override {
        if (c_->outage().up()) return std::nullopt;
        return c_->outage().unreachable_status();
    }
    std::optional<OutageView> outage() const override { return c_->outage().view(); }
    void check(std::function<void(bool, std::string)> done) override {
        if (c_->outage().up()) return done(true, "");
        done(false, c_->outage().health_text());
    }

    Result<Changes> changes(const std::string& ns, uint64_t after, double wait,
                            Deadline d) override;
    void changes_refused() override { ++changes_refused_; }

    nlohmann::json status() const override;
    std::string describe() const override { return "etcd at " + c_->where(); }
    size_t max_key() const override { return o_.limits.max_key; }

  private:
    Result<uint64_t> assign_rank(const std::string& id, Deadline d);
    Status grant_and_put(Deadline d);
    void keepalive();
    Status check_quota(const std::string& ns, const std::string& k, Deadline d);
    void counted(const std::string& ns, uint64_t n);

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
    Status create(Create& c);
    void commit(const std::vector<Create*>& batch);
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
    void expire_cursors();
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

}  // namespace dyad::kvs::etcd
