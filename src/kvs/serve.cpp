// SPDX-License-Identifier: Apache-2.0
#include "serve.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <string>
#include <unordered_map>

#include <asio/post.hpp>

#include "common/timeouts.hpp"
#include "embedded_store.hpp"
#include "get_many.hpp"
#include "proto/kvs.hpp"
#include "rpc/handler.hpp"
#include "rpc/server.hpp"
#include "wait_log.hpp"

namespace dyad::kvs {
namespace wire = proto::kvs;
namespace {
// kvs.changes requests served at once (each holds a thread of their own
// pool and an etcd watch for up to its wait, kChangesMaxWait), and at once
// for one principal (a local uid, a remote host: rpc::Principal), so that
// one peer cannot take them all; more are refused (EBUSY: the client lists
// instead).
constexpr int kMaxChanges = 8;
constexpr int kMaxChangesPerPrincipal = 2;

// The answer to a lookup of a key the store does not have.
void not_found(const std::shared_ptr<rpc::Request>& r, const std::string& ns,
               const std::string& key) {
    r->error(ENOENT, "key '" + key + "' not found in namespace '" + ns + "'", DYAD_RC_NOTFOUND);
}

// Without a key a service is what the kernel says, not what the hello
// claims: on this host only dyadd's own uid and root write the store (the
// hello admits no other as a service either: session_hello.cpp).
bool refused_keyless_writer(const rpc::Server& server, const std::shared_ptr<rpc::Request>& r) {
    const rpc::Peer& p = r->peer();
    if (server.auth().key || p.trusted || !p.local) return false;
    r->error(EPERM,
             "only services write the metadata store, and without a key only dyadd's own user "
             "and root are services of this node (" +
                 (p.uid >= 0 ? "uid " + std::to_string(p.uid) : std::string("this peer")) +
                 " is not): publish through this node's dyadd (dyad produce, dyad_produce)",
             DYAD_RC_NOAUTH);
    return true;
}

// Called on the thread the store answered on (a pool's, the etcd watch's):
// the entry goes to the client from there when its connection is free,
// without a hand-off to the loop first (docs/design.md, "Wake at the
// store's speed").
void answer_entry(const std::shared_ptr<rpc::Request>& r, const std::string& ns,
                  const std::string& key, Result<Entry> e) {
    if (e) return r->end_now(wire::EntryAnswer{std::move(e->value), e->version}.build());
    if (e.status().rc() == DYAD_RC_NOTFOUND) return not_found(r, ns, key);
    r->fail(e.status());
}
}  // namespace

struct StoreServer::Topics {
    Topics(rpc::Server& s, std::shared_ptr<ServiceStore> st) : server(s), store(std::move(st)) {}
    rpc::Server& server;
    std::shared_ptr<ServiceStore> store;
    std::unique_ptr<asio::thread_pool> pool;  // for a store whose calls block
    // Waits that last, logged (wait_log.hpp).
    std::shared_ptr<WaitLog> waits = std::make_shared<WaitLog>();
    // kvs.changes: their own pool (made at the first), so that their waits
    // never hold the threads of lookups and puts; requests in it.
    std::once_flag changes_once;
    std::unique_ptr<asio::thread_pool> changes_pool;
    std::mutex changes_mu;  // the counts below (taken on the loop, given back on the pool)
    int changes_in_flight = 0;
    std::unordered_map<std::string, int> changes_by_principal;
    // A slot for a kvs.changes of `who`, or why there is none.
    Status take_changes_slot(const std::string& who);
    void give_changes_slot(const std::string& who);

    // Runs fn where the store may be called: on the loop for a store that
    // never blocks, on the pool otherwise.
    void run(std::function<void()> fn) {
        if (pool)
            asio::post(*pool, std::move(fn));
        else
            fn();
    }
    // While the store is known to be down, a client's lookup or listing is
    // told so at once (naming the store; the client asks again until its
    // deadline) instead of holding a thread of the pool until then.
    bool refused_down(const std::shared_ptr<rpc::Request>& r) const {
        auto down = store->down();
        if (!down) return false;
        r->fail(*down);
        return true;
    }
    void on_put(const std::shared_ptr<rpc::Request>& r);
    void on_get(const std::shared_ptr<rpc::Request>& r);
    void on_remove(const std::shared_ptr<rpc::Request>& r);
    void on_list(const std::shared_ptr<rpc::Request>& r);
    void on_get_many(const std::shared_ptr<rpc::Request>& r);
    void on_changes(const std::shared_ptr<rpc::Request>& r);
};

namespace {
std::shared_ptr<StoreServer::Topics> attach(rpc::Server& server,
                                            std::shared_ptr<ServiceStore> store) {
    auto t = std::make_shared<StoreServer::Topics>(server, std::move(store));
    if (t->store->blocks()) t->pool = std::make_unique<asio::thread_pool>(4);
    using Req = std::shared_ptr<rpc::Request>;
    server.reads_args(wire::kPut, wire::PutArgs::names());
    server.handle(wire::kPut, [t](Req r) { t->on_put(r); });
    server.reads_args(wire::kRemove, wire::RemoveArgs::names());
    server.handle(wire::kRemove, [t](Req r) { t->on_remove(r); });
    server.reads_args(wire::kGet, wire::GetArgs::names());
    server.handle(wire::kGet, [t](Req r) { t->on_get(r); });
    // One page (docs/wire-protocol.md, "Listing in pages").
    server.reads_args(wire::kList, wire::ListArgs::names());
    server.handle(wire::kList, [t](Req r) { t->on_list(r); });
    server.reads_args(wire::kGetMany, wire::GetManyArgs::names());
    server.handle(wire::kGetMany, [t](Req r) { t->on_get_many(r); });
    server.reads_args(wire::kChanges, wire::ChangesArgs::names());
    server.handle(wire::kChanges, [t](Req r) { t->on_changes(r); });
    return t;
}
}  // namespace

StoreServer::StoreServer(rpc::Server& server, std::shared_ptr<ServiceStore> store)
    : topics_(attach(server, std::move(store))) {}

StoreServer::~StoreServer() {
    if (topics_->changes_pool) {
        topics_->changes_pool->stop();
        topics_->changes_pool->join();
    }
    if (topics_->pool) {
        topics_->pool->stop();
        topics_->pool->join();
    }
}

void StoreServer::Topics::on_put(const std::shared_ptr<rpc::Request>& r) {
    if (!store->takes_peer_puts())
        return r->error(EPERM,
                        "this service keeps its metadata in an external store: publish through it "
                        "(dyad produce, dyad_produce)",
                        DYAD_RC_NOAUTH);
    if (refused_keyless_writer(server, r)) return;
    auto a = rpc::args_as<wire::PutArgs>(*r);
    if (!a) return;
    std::string writer = r->peer_service();
    Status ok = check_put(writer, a->ns, a->key, a->value);
    if (!ok) return r->fail(ok);
    run([store = store, r, a = std::move(a.value()), writer = std::move(writer)] {
        auto v = store->put(a.ns, a.key, a.value, writer, a.replaces,
                            Deadline::after(timeouts::kServeCall));
        if (!v) return r->fail(v.status());
        r->end(wire::PutAnswer{v.value()}.build());
    });
}

void StoreServer::Topics::on_remove(const std::shared_ptr<rpc::Request>& r) {
    if (!store->takes_peer_puts())
        return r->error(EPERM,
                        "this service keeps its metadata in an external store: unpublish through "
                        "it (dyad rm)",
                        DYAD_RC_NOAUTH);
    if (refused_keyless_writer(server, r)) return;
    auto a = rpc::args_as<wire::RemoveArgs>(*r);
    if (!a) return;
    std::string writer = r->peer_service();
    Status ok = check_remove(writer, a->ns);
    if (!ok) return r->fail(ok);
    run([store = store, r, a = std::move(a.value()), writer = std::move(writer)] {
        Status s = store->remove(a.ns, a.key, writer, Deadline::after(timeouts::kServeCall));
        if (!s) return r->fail(s);
        r->end(nlohmann::json::object());
    });
}

void StoreServer::Topics::on_get(const std::shared_ptr<rpc::Request>& r) {
    auto a = rpc::args_as<wire::GetArgs>(*r);
    if (!a) return;
    // A record that can never be put is never waited for (nor held).
    const size_t most = store->max_key();
    if (a->ns.size() > most || a->key.size() > most)
        return r->error(EMSGSIZE,
                        "metadata key too large (namespace " + std::to_string(a->ns.size()) +
                            " bytes, key " + std::to_string(a->key.size()) + " bytes; at most " +
                            std::to_string(most) + ")",
                        DYAD_RC_BADUNPACK);
    // Every wait ends: at its client's deadline, at most --max-wait
    // (ETIMEDOUT; the client asks again).
    if (a->wait) r->cap_deadline(server.max_wait());
    if (refused_down(r)) return;
    if (a->wait) waits->watch(r, a->ns, a->key);
    run([store = store, r, a = std::move(a.value())] {
        if (!a.wait)
            return answer_entry(r, a.ns, a.key,
                                store->get(a.ns, a.key, Deadline::after(timeouts::kServeCall)));
        uint64_t id = store->wait(a.ns, a.key, Deadline::after(timeouts::kWaitAnswer),
                                  [r, ns = a.ns, key = a.key](Result<Entry> e) {
                                      answer_entry(r, ns, key, std::move(e));
                                  });
        if (id) r->on_cancel([store, id] { store->cancel(id); });
    });
}

void StoreServer::Topics::on_list(const std::shared_ptr<rpc::Request>& r) {
    auto a = rpc::args_as<wire::ListArgs>(*r);
    if (!a) return;
    if (refused_down(r)) return;
    run([store = store, r, a = std::move(a.value())] {
        PageBuilder built(a.limit);
        auto page = store->list(a.ns, a.prefix, a.after, built.limit(),
                                Deadline::after(timeouts::kServeCall));
        if (!page) return r->fail(page.status());
        // The one paging rule, whatever the store's own.
        for (auto& [k, e] : page->entries)
            if (!built.add(std::move(k), std::move(e))) break;
        Page p = built.take();
        const bool more = p.more || page->more;
        if (a.raw) {  // the compact answer: the entries in the data
            std::string data;
            for (auto& [k, e] : p.entries)
                wire::ListAnswer::append_raw(&data, {std::move(k), std::move(e.value), e.version});
            return r->end(wire::ListAnswer::build_raw(p.entries.size(), more), std::move(data));
        }
        wire::ListAnswer out;
        out.more = more;
        out.entries.reserve(p.entries.size());
        for (auto& [k, e] : p.entries)
            out.entries.push_back({std::move(k), std::move(e.value), e.version});
        r->end(out.build());
    });
}

void StoreServer::Topics::on_get_many(const std::shared_ptr<rpc::Request>& r) {
    auto a = rpc::args_as<wire::GetManyArgs>(*r);
    if (!a) return;
    if (refused_down(r)) return;
    run([store = store, r, a = std::move(a.value())] {
        // Within kGetManyAnswerBudget bytes of values: the keys past it are
        // "later" (asked for again).
        auto got = store->get_many(a.ns, a.keys, kGetManyAnswerBudget,
                                   Deadline::after(timeouts::kServeCall));
        if (!got) return r->fail(got.status());
        std::vector<Lookup>& found = got.value();
        if (found.size() != a.keys.size())
            return r->fail(Status(DYAD_RC_BADRPC,
                                  "the metadata store answered a lookup of " +
                                      std::to_string(a.keys.size()) + " keys with " +
                                      std::to_string(found.size()) + " entries",
                                  EPROTO));
        // The compact answer: the entries in the end frame's data.
        if (a.raw) {
            std::string data;
            for (const auto& l : found) append_raw_entry(&data, l);
            return r->end(wire::GetManyAnswer::build_raw(found.size()), std::move(data));
        }
        // Per key: [value, version] when found, 0 when absent, null later.
        nlohmann::json out = nlohmann::json::array();
        for (auto& l : found) {
            if (l.state == Lookup::State::found)
                out.push_back(nlohmann::json::array({std::move(l.entry.value), l.entry.version}));
            else if (l.state == Lookup::State::missing)
                out.push_back(0);
            else
                out.push_back(nullptr);
        }
        r->end(wire::GetManyAnswer::build_entries(std::move(out)));
    });
}

void StoreServer::Topics::on_changes(const std::shared_ptr<rpc::Request>& r) {
    auto a = rpc::args_as<wire::ChangesArgs>(*r);
    if (!a) return;
    // A store without revisions says so at once (its clients list).
    if (!store->blocks()) {
        auto c = store->changes(a->ns, a->after, 0, Deadline::after(timeouts::kServeCall));
        return r->fail(c ? Status(DYAD_RC_BADRPC, "kvs.changes not served", ENOSYS) : c.status());
    }
    const std::string who = r->peer().key;
    Status slot = take_changes_slot(who);
    if (!slot) {
        store->changes_refused();
        return r->fail(slot);
    }
    r->cap_deadline(server.max_wait());
    std::call_once(changes_once,
                   [this] { changes_pool = std::make_unique<asio::thread_pool>(kMaxChanges); });
    const double wait = std::min(a->wait, kChangesMaxWait);
    asio::post(*changes_pool, [this, r, a = std::move(a.value()), wait, who] {
        auto c = store->changes(a.ns, a.after, wait, Deadline::after(timeouts::kServeCall));
        give_changes_slot(who);
        if (!c) return r->fail(c.status());
        wire::ChangesAnswer out;
        out.next = c->next;
        out.compacted = c->compacted;
        out.entries.reserve(c->entries.size());
        for (auto& [k, e] : c->entries)
            out.entries.push_back({std::move(k), std::move(e.value), e.version});
        r->end(out.build());
    });
}

Status StoreServer::Topics::take_changes_slot(const std::string& who) {
    std::lock_guard<std::mutex> lk(changes_mu);
    int& mine = changes_by_principal[who];
    if (mine >= kMaxChangesPerPrincipal) {
        return Status(DYAD_RC_BADRPC,
                      who + " already has " + std::to_string(kMaxChangesPerPrincipal) +
                          " kvs.changes requests in flight, the most one peer may (list the "
                          "namespace instead, or ask again when one is answered)",
                      EBUSY);
    }
    if (changes_in_flight >= kMaxChanges) {
        if (mine == 0) changes_by_principal.erase(who);
        return Status(DYAD_RC_BADRPC,
                      "this service already answers " + std::to_string(kMaxChanges) +
                          " kvs.changes requests at once (list the namespace instead)",
                      EBUSY);
    }
    ++mine;
    ++changes_in_flight;
    return Status::ok();
}

void StoreServer::Topics::give_changes_slot(const std::string& who) {
    std::lock_guard<std::mutex> lk(changes_mu);
    --changes_in_flight;
    auto it = changes_by_principal.find(who);
    if (it != changes_by_principal.end() && --it->second <= 0) changes_by_principal.erase(it);
}

void serve(rpc::Server& server, MemoryStore& store) {
    // The handlers hold what they need for as long as the server lives.
    (void)attach(server, std::make_shared<EmbeddedStore>(store));
}

}  // namespace dyad::kvs
