// SPDX-License-Identifier: Apache-2.0
// Metadata store interface (client side, blocking with deadlines), the
// embedded in-memory store a dyadd hosts, and the write rules every store
// keeps. Keys live in namespaces; each put
// bumps the key's version, which DYAD uses as the generation: the embedded
// store's is (epoch << 32) | count, the epoch growing at every start of its
// dyadd (kvs/epoch.hpp), so versions never repeat across restarts.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/deadline.hpp"
#include "common/status.hpp"
#include "rpc/client.hpp"

namespace dyad::kvs {

// Where services register themselves ({id, node, host, endpoints, transports}).
constexpr const char* kServicesNamespace = "dyad.services";

struct Entry {
    std::string value;
    uint64_t version = 0;
    std::string writer;  // the service that wrote it ("" for the hosting service itself)
};

// One page of a listing (kvs.list, docs/wire-protocol.md): entries in key
// order; more: there may be entries after the last one (ask again with
// after = its key).
struct Page {
    std::vector<std::pair<std::string, Entry>> entries;
    bool more = false;
};

// Entries of one kvs.list page: at most this many, and no more than
// kPageBytes of keys and values (at least one entry), so that one reply
// stays far below the frame limit.
constexpr uint64_t kPageLimit = 1000;
constexpr uint64_t kPageBytes = 256u << 10;

// The one paging rule: at most `limit` entries (clamped to 1..kPageLimit,
// 0: kPageLimit) and, past the first, no more than kPageBytes of keys and
// values.
class PageBuilder {
  public:
    explicit PageBuilder(uint64_t limit)
        : limit_(limit == 0 || limit > kPageLimit ? kPageLimit : limit) {}
    uint64_t limit() const { return limit_; }
    // False when the entry does not fit: the page is full (and says more).
    bool add(std::string key, Entry e) {
        const uint64_t n = key.size() + e.value.size();
        if (page_.entries.size() >= limit_ || (!page_.entries.empty() && bytes_ + n > kPageBytes)) {
            page_.more = true;
            return false;
        }
        bytes_ += n;
        page_.entries.emplace_back(std::move(key), std::move(e));
        return true;
    }
    Page take() { return std::move(page_); }

  private:
    uint64_t limit_;
    uint64_t bytes_ = 0;
    Page page_;
};

// The records put in a namespace after a revision (kvs.changes): entries in
// the order they were put; next: the revision to ask from next; compacted:
// the store no longer holds the changes asked for (list again).
struct Changes {
    std::vector<std::pair<std::string, Entry>> entries;
    uint64_t next = 0;
    bool compacted = false;
};

// What one kvs.changes answer holds at most: about a page (kPageLimit
// entries, kPageBytes), past which it ends at a whole revision.
// A wait longer than this is cut to it.
constexpr double kChangesMaxWait = 5.0;

// What one key of a lookup of many turned out to be (Store::get_many).
struct Lookup {
    enum class State { found, missing, later } state = State::later;
    Entry entry;  // when found
};

// What a client uses. Implementation: RpcStore (the store of a dyadd,
// reached over RPC). A service's own store is a ServiceStore
// (service_store.hpp).
class Store {
  public:
    virtual ~Store() = default;
    // replaces: the version of another writer's entry this put knowingly
    // takes over (0: none; a key of another writer is then refused).
    virtual Result<uint64_t> put(const std::string& ns, const std::string& key,
                                 const std::string& value, Deadline deadline,
                                 uint64_t replaces = 0) = 0;
    // Without waiting: NOTFOUND if absent.
    virtual Result<Entry> get(const std::string& ns, const std::string& key, Deadline deadline) = 0;
    // Waits until the key exists (wait-for-create); TIMEOUT at the deadline.
    virtual Result<Entry> wait(const std::string& ns, const std::string& key,
                               Deadline deadline) = 0;
    virtual Result<std::vector<std::pair<std::string, Entry>>> list(const std::string& ns,
                                                                    const std::string& prefix,
                                                                    Deadline deadline) = 0;
    // The keys starting with prefix that sort after `after` ("" : from the
    // first), at most `limit` (0: the store's default; it may give fewer).
    virtual Result<Page> list_page(const std::string& ns, const std::string& prefix,
                                   const std::string& after, uint64_t limit, Deadline deadline) = 0;
    // Many keys of one namespace without waiting: one Lookup per key, in
    // order ("later": not answered this time, ask again). By default one
    // get() per key.
    virtual Result<std::vector<Lookup>> get_many(const std::string& ns,
                                                 const std::vector<std::string>& keys,
                                                 Deadline deadline);
    // The records put in `ns` after revision `after`, waiting up to `wait`
    // seconds for the first; after 0: none, only the revision to list from.
    // A store that has no revisions: DYAD_RC_BADRPC with errno ENOSYS (list).
    virtual Result<Changes> changes(const std::string& ns, uint64_t after, double wait,
                                    Deadline deadline);
    virtual std::string describe() const = 0;
};

class RpcStore : public Store {
  public:
    RpcStore(std::string uri, std::shared_ptr<rpc::ConnectionPool> pool)
        : uri_(std::move(uri)), pool_(std::move(pool)) {}
    Result<uint64_t> put(const std::string& ns, const std::string& key, const std::string& value,
                         Deadline d, uint64_t replaces = 0) override;
    Result<Entry> get(const std::string& ns, const std::string& key, Deadline d) override;
    // kvs.remove of a key this service wrote.
    Status remove(const std::string& ns, const std::string& key, Deadline d);
    Result<Entry> wait(const std::string& ns, const std::string& key, Deadline d) override;
    Result<std::vector<std::pair<std::string, Entry>>> list(const std::string& ns,
                                                            const std::string& prefix,
                                                            Deadline d) override;
    Result<Page> list_page(const std::string& ns, const std::string& prefix,
                           const std::string& after, uint64_t limit, Deadline d) override;
    // One kvs.get_many request (at most kGetManyMaxKeys keys); a service that
    // does not know it: DYAD_RC_BADRPC with errno ENOSYS.
    Result<std::vector<Lookup>> get_many(const std::string& ns,
                                         const std::vector<std::string>& keys, Deadline d) override;
    // One kvs.changes request; a service that does not know it, or whose
    // store has no revisions: DYAD_RC_BADRPC with errno ENOSYS.
    Result<Changes> changes(const std::string& ns, uint64_t after, double wait,
                            Deadline d) override;
    std::string describe() const override { return "embedded store at " + uri_; }

  private:
    // connect_failed: set when no connection could be had (then the call
    // is never sent again on a fresh connection: the caller does).
    Result<nlohmann::json> call(const std::string& topic, nlohmann::json args, Deadline d,
                                double grace, bool* connect_failed = nullptr);
    std::string uri_;
    std::shared_ptr<rpc::ConnectionPool> pool_;
};

// The embedded store. Single-threaded: used only on the service's loop.
// A key belongs to the service that first wrote it: another writer's put is
// refused (EEXIST), so two producers of one path cannot silently replace
// each other's record, unless it names the version it replaces (a file
// consumed, changed and published again by another node).
// What one peer can make the embedded store hold (every put is a service's,
// but a buggy or hostile one must not be able to exhaust the host's memory).
struct StoreLimits {
    size_t max_key = 4096;         // bytes of a key (namespace alike)
    size_t max_value = 64u << 10;  // bytes of a value (a record is ~300)
    // Bytes of memory the records hold (dyadd --store-max): each record's
    // key, value and writer, and kRecordOverhead; each namespace's name and
    // kNamespaceOverhead.
    uint64_t max_bytes = 1ull << 30;
    // Namespaces besides the registry (dyadd --store-max-namespaces).
    uint64_t max_namespaces = 4096;
    // Quotas of one namespace (the registry has its own, below): records
    // (dyadd --store-max-records-per-namespace) and bytes of keys and values
    // (dyadd --store-max-bytes-per-namespace; 0: max_bytes).
    uint64_t max_records_per_ns = 1000000;
    uint64_t max_bytes_per_ns = 0;
    // The registry of services (kServicesNamespace) is not charged to
    // max_bytes, so a full data namespace cannot keep services from
    // registering; it has these quotas of its own instead.
    uint64_t registry_max_records = 65536;
    uint64_t registry_max_bytes = 64ull << 20;
};

// Puts refused, by reason.
struct StoreRefusals {
    uint64_t too_large = 0;   // a key or value over max_key / max_value
    uint64_t store_full = 0;  // over max_bytes (--store-max)
    uint64_t ns_records = 0;  // over a namespace's record quota
    uint64_t ns_bytes = 0;    // over a namespace's byte quota
    uint64_t namespaces = 0;  // a new namespace over max_namespaces
    uint64_t total() const { return too_large + store_full + ns_records + ns_bytes + namespaces; }
};

// What one namespace holds.
struct NamespaceUse {
    uint64_t records = 0;
    uint64_t bytes = 0;  // as charged to StoreLimits::max_bytes
};

// What the store charges for one record besides its key, value and writer
// (its tree node, the strings' headers, the allocator's share), and for
// one namespace besides its name: measured, a tiny record costs ~140 bytes.
inline constexpr uint64_t kRecordOverhead = 192;
inline constexpr uint64_t kNamespaceOverhead = 512;

class MemoryStore {
  public:
    using Watcher = std::function<void(const Entry&)>;
    // epoch: this run's (kvs/epoch.hpp); versions are (epoch << 32) | count.
    explicit MemoryStore(StoreLimits limits = StoreLimits(), uint32_t epoch = 0)
        : limits_(limits), epoch_(epoch) {}
    uint32_t epoch() const { return epoch_; }
    Result<uint64_t> put(const std::string& ns, const std::string& key, std::string value,
                         const std::string& writer = "", uint64_t replaces = 0);
    std::optional<Entry> get(const std::string& ns, const std::string& key) const;
    // Removes a key `writer` wrote (NOAUTH/EPERM naming the writer of
    // another's; NOTFOUND/ENOENT when absent). Waiters are unaffected.
    Status remove(const std::string& ns, const std::string& key, const std::string& writer);
    // Calls fn once, when the key is next put. Returns an id for unwatch.
    uint64_t watch_create(const std::string& ns, const std::string& key, Watcher fn);
    void unwatch(uint64_t id);
    std::vector<std::pair<std::string, Entry>> list(const std::string& ns,
                                                    const std::string& prefix) const;
    // A page of list(): keys after `after`, at most `limit` (clamped to
    // 1..kPageLimit, 0: kPageLimit) and about kPageBytes.
    Page list_page(const std::string& ns, const std::string& prefix, const std::string& after,
                   uint64_t limit) const;
    size_t key_count() const;
    // Namespaces besides the registry.
    size_t namespace_count() const;
    size_t watcher_count() const { return watch_index_.size(); }
    uint64_t bytes() const { return bytes_; }
    // Of bytes(), those of the registry (not charged to max_bytes).
    uint64_t registry_bytes() const { return registry_bytes_; }
    uint64_t refused() const { return refused_.total(); }
    const StoreRefusals& refusals() const { return refused_; }
    const StoreLimits& limits() const { return limits_; }
    NamespaceUse usage(const std::string& ns) const;
    // The byte quota of a namespace (max_bytes_per_ns, or max_bytes when 0).
    uint64_t ns_byte_quota(const std::string& ns) const;
    uint64_t ns_record_quota(const std::string& ns) const;

  private:
    void assign_rank(const std::string& key, std::string& value) const;
    // put()'s parts: the limits, the key's next version, its watchers.
    Status check_room(const std::string& ns, const std::string& key, bool new_ns, bool new_key,
                      uint64_t before, uint64_t after);
    Result<uint64_t> next_version(const std::string& ns, const std::string& key,
                                  const Entry* had) const;
    void notify(const std::string& ns, const std::string& key, const Entry& e);
    StoreLimits limits_;
    uint32_t epoch_ = 0;
    uint64_t removed_high_ = 0;    // the highest version of a removed key (put())
    uint64_t bytes_ = 0;           // memory held, as charged (StoreLimits::max_bytes)
    uint64_t registry_bytes_ = 0;  // of which in the registry (not charged to max_bytes)
    StoreRefusals refused_;        // puts over a limit
    std::map<std::string, NamespaceUse> use_;
    using NsKey = std::pair<std::string, std::string>;
    std::map<std::string, std::map<std::string, Entry>> data_;
    std::map<NsKey, std::map<uint64_t, Watcher>> watchers_;
    std::unordered_map<uint64_t, NsKey> watch_index_;
    uint64_t next_watch_ = 1;
};

}  // namespace dyad::kvs

namespace dyad::kvs {
// The write rules of a put by `writer` (a service id), the same in every
// store (docs/security.md).
// Keys of different DYAD_KEY_DEPTH can be equal for two paths: a file
// literally named "17f.204.15b.data0.txt" (depth 0) has the key of
// "data0.txt" at depth 3. Records name their paths, so a store sees such a
// collision when a put of one path's record finds another path's under the
// key: the record of the deeper key (the shorter path) holds it, so a name
// spelling another path's key cannot lock that path's producer out. For a
// put of `value` where `had` is stored: false when the two are not records
// of two paths; true when the new one takes the key from the other; EEXIST
// when the one stored keeps it.
Result<bool> key_collision(const std::string& ns, const std::string& key, const std::string& had,
                           const std::string& value);
// Only services write (docs/security.md): a put must come from a peer that
// said it is a service (and proved the job's key where there is one), it
// may register only its own id in the registry and only records that name
// it as their owner.
Status check_put(const std::string& writer, const std::string& ns, const std::string& key,
                 const std::string& value);
// A remove by `writer`: a service, never in the registry (the store checks
// that the key is its own).
Status check_remove(const std::string& writer, const std::string& ns);
}  // namespace dyad::kvs

namespace dyad::rpc {
class Server;
}

namespace dyad::kvs {
// Serves the store's topics (serve.hpp) from `store`, a MemoryStore the
// caller owns and keeps for as long as the server lives (tests; dyadd
// serves its ServiceStore through a kvs::StoreServer).
void serve(rpc::Server& server, MemoryStore& store);
}  // namespace dyad::kvs
