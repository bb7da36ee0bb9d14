// SPDX-License-Identifier: Apache-2.0
// The metadata store a dyadd talks to itself, behind one interface: the
// embedded store it hosts (embedded_store.hpp), another dyadd's embedded
// store reached over RPC (remote_store.hpp), or etcd (etcd/etcd_store.hpp,
// linked into dyadd only). The service holds one, made by make_service_store()
// from its options; serve.hpp serves the store's topics to the service's
// clients from any of them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/deadline.hpp"
#include "common/status.hpp"
#include "outage.hpp"
#include "rpc/client.hpp"
#include "store.hpp"

namespace dyad::kvs {

// What the embedded store a service hosts holds, for its status and metrics.
struct HostedFigures {
    uint64_t records = 0;         // keys, the registry's included
    uint64_t waiters = 0;         // wait-for-create requests held
    uint64_t bytes = 0;           // as charged, the registry's included
    uint64_t registry_bytes = 0;  // of bytes, those of the registry
    uint64_t namespaces = 0;      // besides the registry
    uint64_t ns_byte_quota = 0;   // of the service's default namespace
    StoreLimits limits;
    StoreRefusals refusals;
    uint32_t epoch = 0;
    std::string state_dir;  // where the epoch is kept
};

// Thread-safe: every call may come from any thread.
class ServiceStore {
  public:
    using Done = std::function<void(Result<Entry>)>;
    virtual ~ServiceStore() = default;
    // Registers the service `id` (value: its identity, proto/identity.hpp)
    // and keeps the registration alive until destroyed. Returns the entry as
    // registered (with the rank the store gave). Errors say which store.
    virtual Result<Entry> register_service(const std::string& id, const std::string& value,
                                           Deadline d) = 0;
    // The write rules of MemoryStore::put: `writer` owns what it created
    // first; another writer's key only as a change of version `replaces`.
    virtual Result<uint64_t> put(const std::string& ns, const std::string& key,
                                 const std::string& value, const std::string& writer,
                                 uint64_t replaces, Deadline d) = 0;
    // Unpublish: removes a key `writer` wrote (NOAUTH/EPERM naming the
    // writer of another's key; NOTFOUND/ENOENT when absent). Waiters are
    // unaffected.
    virtual Status remove(const std::string& ns, const std::string& key, const std::string& writer,
                          Deadline d) = 0;
    // NOTFOUND when absent.
    virtual Result<Entry> get(const std::string& ns, const std::string& key, Deadline d) = 0;
    // Many keys of one namespace without waiting (kvs.get_many): one Lookup
    // per key, in order, each found or missing as get() would say, or
    // "later" once the values found reach `budget` bytes (each counted with
    // 32 bytes more; the first one found is always answered). By default
    // one get() per key; etcd reads them in a few transactions.
    virtual Result<std::vector<Lookup>> get_many(const std::string& ns,
                                                 const std::vector<std::string>& keys,
                                                 size_t budget, Deadline d);
    // Wait-for-create: calls `done` once, with the entry as soon as the key
    // exists (at once if it does), or TIMEOUT at `d` (the embedded store
    // leaves that to its caller's cancel: its requests carry their own
    // deadline). Returns an id for cancel(); after cancel() `done` is not
    // called.
    virtual uint64_t wait(const std::string& ns, const std::string& key, Deadline d, Done done) = 0;
    virtual void cancel(uint64_t id) = 0;
    // Keys of `ns` starting with `prefix`, after `after` (exclusive), at most
    // `limit` of them (1..kPageLimit).
    virtual Result<Page> list(const std::string& ns, const std::string& prefix,
                              const std::string& after, uint64_t limit, Deadline d) = 0;

    // The records put in `ns` after revision `after` (kvs.changes), waiting
    // up to `wait` seconds for the first; after 0: none, the revision now.
    // By default ENOSYS (DYAD_RC_BADRPC): the store has no revisions to ask
    // from (the embedded store), its clients list.
    virtual Result<Changes> changes(const std::string& ns, uint64_t after, double wait, Deadline d);
    // A kvs.changes request refused: the service already served its most
    // at once (counted for status).
    virtual void changes_refused() {}

    // Whether this service answers its clients' kvs.* itself ("kvs": "local"
    // in its hello): the embedded and the etcd stores; a remote store's
    // clients ask its host.
    virtual bool serves_clients() const { return true; }
    // Whether peers may put through this service (only into the store it
    // hosts; with an external store they publish through their own service).
    virtual bool takes_peer_puts() const { return false; }
    // Whether calls may block (served from a thread pool then, never from
    // the service's loop).
    virtual bool blocks() const { return true; }
    // The longest key or namespace a put may have: a longer one is never
    // waited for.
    virtual size_t max_key() const { return StoreLimits().max_key; }

    // Starts what keeps the registration (after register_service).
    virtual void start() {}
    // Ends the store's own threads that call back into the service (before
    // the service's members go).
    virtual void close() {}
    // Whether the store answers: done(ok, why), at once or from a probe's
    // thread.
    virtual void check(std::function<void(bool, std::string)> done) { done(true, ""); }
    // While the store is known not to answer: the error clients' requests
    // get at once (Outage::unreachable_status), rather than a wait for it on
    // a thread of the pool until their deadlines.
    virtual std::optional<Status> down() const { return std::nullopt; }
    // Whether it answers, its errors and outages (kvs/outage.hpp), for
    // status and metrics; none for the embedded store (it is the service).
    virtual std::optional<OutageView> outage() const { return std::nullopt; }
    // {backend, endpoint, reachable?, error?, ...} for dyad service status;
    // without "reachable", check() says it.
    virtual nlohmann::json status() const = 0;
    // The figures of the store this service hosts (none for another's).
    virtual std::optional<HostedFigures> hosted() const { return std::nullopt; }
    virtual std::string describe() const = 0;
};

// The re-join of a service after its remote store lost it (its host
// restarted): registers again and publishes again; `stopping` says when to
// give up; adds to `republished` the files put again. False: not all of it
// (tried again later).
using Rejoin = std::function<bool(const std::function<bool()>& stopping, uint64_t& republished)>;

// What make_service_store() needs of the service.
struct StoreSetup {
    std::string uri;                         // --kvs: "" hosts the embedded store
    std::shared_ptr<ServiceStore> external;  // made by dyadd's main (etcd://): used as is
    // The embedded store.
    StoreLimits limits;
    std::string state_dir;  // where its epoch is kept
    std::string endpoint;   // the service's first endpoint, for status
    std::string ns;         // the service's default namespace, for status
    // The remote store.
    std::string id;  // this service
    rpc::Credentials credentials;
    Rejoin rejoin;
};

// The one store of a service: `external` if given, else the embedded store
// (uri ""), else the remote store at uri.
Result<std::shared_ptr<ServiceStore>> make_service_store(StoreSetup setup);

}  // namespace dyad::kvs
