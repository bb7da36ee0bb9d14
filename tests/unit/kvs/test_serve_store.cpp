// SPDX-License-Identifier: Apache-2.0
// The store's topics served (kvs::serve, kvs::StoreServer) and asked for
// (kvs::RpcStore) over real sockets: the server loop on a thread, the
// blocking client on the test thread.
#include <gtest/gtest.h>

#include <thread>

#include "kvs/embedded_store.hpp"
#include "kvs/registry.hpp"
#include "kvs/serve.hpp"
#include "kvs/store.hpp"
#include "rpc/client.hpp"
#include "rpc/server.hpp"
#include "server_loop.hpp"

using namespace dyad;

namespace {
// The embedded store (a base, so it exists before the server's handlers
// are registered) on a real server.
struct StoreHolder {
    std::unique_ptr<kvs::MemoryStore> store_ = std::make_unique<kvs::MemoryStore>();
};
class Loop : public StoreHolder, public test_support::ServerLoop {
  public:
    Loop()
        : test_support::ServerLoop([this](rpc::Server& server) { kvs::serve(server, *store_); }) {}
};

// Only services write the store, and only records they own.
rpc::Credentials as_service(const std::string& id) {
    rpc::Credentials c;
    c.role = "service";
    c.service_id = id;
    return c;
}
std::string owned(const std::string& owner, int v) {
    return nlohmann::json{{"owner", owner}, {"v", v}}.dump();
}
}  // namespace

TEST(Kvs, PutGetVersionsAndWaitForCreate) {
    Loop l;
    auto pool = std::make_shared<rpc::ConnectionPool>(as_service("svc"));
    kvs::RpcStore s(l.uri, pool);
    EXPECT_EQ(s.get("ns", "k", Deadline::after(5)).status().rc(), DYAD_RC_NOTFOUND);
    EXPECT_EQ(s.put("ns", "k", owned("svc", 1), Deadline::after(5)).value(), 1u);
    EXPECT_EQ(s.put("ns", "k", owned("svc", 2), Deadline::after(5)).value(), 2u);
    auto e = s.get("ns", "k", Deadline::after(5));
    ASSERT_TRUE(e.is_ok());
    EXPECT_EQ(e->value, owned("svc", 2));
    EXPECT_EQ(e->version, 2u);
    EXPECT_EQ(s.get("other", "k", Deadline::after(5)).status().rc(), DYAD_RC_NOTFOUND);

    std::thread producer([&] {
        // Publish once the consumer below is waiting (the store counts it).
        for (Deadline d = Deadline::after(10); !d.expired();) {
            if (l.on_loop([&] { return l.store_->watcher_count(); }) > 0) break;
            std::this_thread::yield();
        }
        kvs::RpcStore p(l.uri, std::make_shared<rpc::ConnectionPool>(as_service("svc")));
        EXPECT_TRUE(p.put("ns", "later", owned("svc", 3), Deadline::after(5)).is_ok());
    });
    auto w = s.wait("ns", "later", Deadline::after(10));
    producer.join();
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    EXPECT_EQ(w->value, owned("svc", 3));

    auto t = s.wait("ns", "never", Deadline::after(0.5));
    EXPECT_EQ(t.status().rc(), DYAD_RC_TIMEOUT);
    auto list = s.list("ns", "", Deadline::after(5));
    ASSERT_TRUE(list.is_ok());
    EXPECT_EQ(list->size(), 2u);
}

TEST(Kvs, DisconnectedWaiterIsRemoved) {
    Loop l;
    {
        auto c = rpc::Connection::connect(l.uri, Deadline::after(5)).value();
        ASSERT_TRUE(c->send_request("kvs.get", {{"ns", "n"}, {"key", "k"}, {"wait", true}},
                                    Deadline::never())
                        .is_ok());
        auto c2 = rpc::Connection::connect(l.uri, Deadline::after(5)).value();
        ASSERT_TRUE(c2->call("kvs.list", {{"ns", "n"}}, Deadline::after(5))
                        .is_ok());  // the wait is registered
    }
    // After both disconnect, the store must hold no waiter.
    auto c3 = rpc::Connection::connect(l.uri, Deadline::after(5)).value();
    EXPECT_TRUE(c3->call("kvs.list", {{"ns", "n"}}, Deadline::after(5)).is_ok());
    EXPECT_EQ(l.on_loop([&] { return l.store_->watcher_count(); }), 0u);
}

TEST(Kvs, ListOverRpcGoesThroughEveryPage) {
    Loop l;
    kvs::RpcStore s(l.uri, std::make_shared<rpc::ConnectionPool>(as_service("svc")));
    // More than fits one reply frame at once (about 3,500 records did).
    const int n = 5000;
    int stored = l.on_loop([&] {
        int ok = 0;
        for (int i = 0; i < n; ++i)
            ok += l.store_
                      ->put("ns", "key/" + std::to_string(i),
                            nlohmann::json{{"owner", "svc"}, {"pad", std::string(300, 'p')}}.dump(),
                            "svc")
                      .is_ok();
        return ok;
    });
    ASSERT_EQ(stored, n);
    auto all = s.list("ns", "key/", Deadline::after(30));
    ASSERT_TRUE(all.is_ok()) << all.status().to_string();
    EXPECT_EQ(all->size(), static_cast<size_t>(n));
    auto first = s.list_page("ns", "", "", 7, Deadline::after(5));
    ASSERT_TRUE(first.is_ok());
    EXPECT_EQ(first->entries.size(), 7u);
    EXPECT_TRUE(first->more);
}

namespace {
// A store whose calls block (as etcd's do) and that takes no peer puts:
// the StoreServer calls it from its pool, and its pages may be longer than
// the one paging rule allows.
class SlowStore final : public kvs::ServiceStore {
  public:
    explicit SlowStore(kvs::MemoryStore& m) : m_(m) {}
    Result<kvs::Entry> register_service(const std::string&, const std::string&, Deadline) override {
        return Status(DYAD_RC_NOAUTH, "not here", EPERM);
    }
    Result<uint64_t> put(const std::string&, const std::string&, const std::string&,
                         const std::string&, uint64_t, Deadline) override {
        return Status(DYAD_RC_NOAUTH, "not here", EPERM);
    }
    Status remove(const std::string&, const std::string&, const std::string&, Deadline) override {
        return Status(DYAD_RC_NOAUTH, "not here", EPERM);
    }
    Result<kvs::Entry> get(const std::string& ns, const std::string& key, Deadline) override {
        std::lock_guard<std::mutex> lk(mu_);
        ++gets_;
        auto e = m_.get(ns, key);
        if (!e) return Status(DYAD_RC_NOTFOUND, "absent", ENOENT);
        return *e;
    }
    uint64_t wait(const std::string& ns, const std::string& key, Deadline d, Done done) override {
        done(get(ns, key, d));
        return 0;
    }
    void cancel(uint64_t) override {}
    Result<kvs::Page> list(const std::string& ns, const std::string& prefix, const std::string&,
                           uint64_t, Deadline) override {
        std::lock_guard<std::mutex> lk(mu_);
        kvs::Page p;
        for (auto& e : m_.list(ns, prefix))
            p.entries.push_back(e);  // all of them, whatever the limit
        return p;
    }
    nlohmann::json status() const override { return {{"backend", "slow"}}; }
    std::string describe() const override { return "slow store"; }
    int gets() {
        std::lock_guard<std::mutex> lk(mu_);
        return gets_;
    }

  private:
    kvs::MemoryStore& m_;
    std::mutex mu_;
    int gets_ = 0;
};

kvs::StoreLimits large_values() {
    kvs::StoreLimits l;
    l.max_value = 1u << 20;
    return l;
}
struct SlowHolder {
    kvs::MemoryStore mem{large_values()};
    std::shared_ptr<SlowStore> slow = std::make_shared<SlowStore>(mem);
    std::unique_ptr<kvs::StoreServer> served;
};
class SlowLoop : public SlowHolder, public test_support::ServerLoop {
  public:
    SlowLoop()
        : test_support::ServerLoop([this](rpc::Server& server) {
              served = std::make_unique<kvs::StoreServer>(server, slow);
          }) {}
};
}  // namespace

TEST(StoreServer, ServesAnyStoreWithOneCheckAndOnePagingRule) {
    SlowLoop l;
    for (int i = 0; i < 30; ++i)
        ASSERT_TRUE(l.mem.put("ns", "k" + std::to_string(100 + i),
                              nlohmann::json{{"owner", "svc"}, {"i", i}}.dump(), "svc"));
    kvs::RpcStore s(l.uri, std::make_shared<rpc::ConnectionPool>(as_service("svc")));
    // The store gives all 30; a page holds what was asked for.
    auto page = s.list_page("ns", "", "", 7, Deadline::after(5));
    ASSERT_TRUE(page.is_ok()) << page.status().to_string();
    EXPECT_EQ(page->entries.size(), 7u);
    EXPECT_TRUE(page->more);
    auto all = s.list("ns", "k", Deadline::after(5));
    ASSERT_TRUE(all.is_ok());
    EXPECT_EQ(all->size(), 30u);
    // A lookup through the pool, found and not.
    EXPECT_TRUE(s.get("ns", "k100", Deadline::after(5)).is_ok());
    auto none = s.get("ns", "nope", Deadline::after(5));
    EXPECT_EQ(none.status().rc(), DYAD_RC_NOTFOUND);
    EXPECT_NE(none.status().message().find("key 'nope' not found in namespace 'ns'"),
              std::string::npos)
        << none.status().message();
    // Peers put only into a store the service hosts.
    auto put = s.put("ns", "k", nlohmann::json{{"owner", "svc"}}.dump(), Deadline::after(5));
    EXPECT_EQ(put.status().err(), EPERM);
    EXPECT_NE(put.status().message().find("external store"), std::string::npos);
    // get_many, served from any store.
    auto many = s.get_many("ns", {"k101", "absent", "k102"}, Deadline::after(5));
    ASSERT_TRUE(many.is_ok()) << many.status().to_string();
    EXPECT_EQ((*many)[0].state, kvs::Lookup::State::found);
    EXPECT_EQ((*many)[1].state, kvs::Lookup::State::missing);
    EXPECT_EQ((*many)[2].state, kvs::Lookup::State::found);
    // The argument check is the same for every store.
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5)).value();
    auto bad = c->call("kvs.get", {{"ns", "ns"}}, Deadline::after(5));
    EXPECT_EQ(bad.status().rc(), DYAD_RC_BADUNPACK);
    EXPECT_NE(bad.status().message().find("kvs.get: field 'key' is missing"), std::string::npos)
        << bad.status().message();
    auto huge = c->call("kvs.get", {{"ns", "ns"}, {"key", std::string(5000, 'k')}, {"wait", true}},
                        Deadline::after(5));
    EXPECT_EQ(huge.status().err(), EMSGSIZE);
}

// kvs.changes: a store without revisions (the embedded one, served on the
// loop, and any other by default, served from the pool) answers ENOSYS, so
// that its clients list; bad arguments are refused as every topic's.
TEST(StoreServer, ChangesOfAStoreWithoutRevisionsAreENOSYS) {
    SlowLoop l;
    kvs::RpcStore s(l.uri, std::make_shared<rpc::ConnectionPool>(as_service("svc")));
    auto c = s.changes("ns", 5, 0.2, Deadline::after(5));
    EXPECT_EQ(c.status().err(), ENOSYS) << c.status().to_string();
    Loop e;
    kvs::RpcStore es(e.uri, std::make_shared<rpc::ConnectionPool>(as_service("svc")));
    auto ec = es.changes("ns", 0, 0, Deadline::after(5));
    EXPECT_EQ(ec.status().err(), ENOSYS) << ec.status().to_string();
    auto conn = rpc::Connection::connect(l.uri, Deadline::after(5)).value();
    auto bad = conn->call("kvs.changes", {{"ns", "ns"}, {"wait", "soon"}}, Deadline::after(5));
    EXPECT_EQ(bad.status().rc(), DYAD_RC_BADUNPACK) << bad.status().to_string();
}

TEST(StoreServer, PagesStopAtTheirBytes) {
    SlowLoop l;
    const std::string blob(100000, 'x');
    for (int i = 0; i < 5; ++i)
        ASSERT_TRUE(l.mem.put("ns", "k" + std::to_string(i),
                              nlohmann::json{{"owner", "svc"}, {"b", blob}}.dump(), "svc"));
    kvs::RpcStore s(l.uri, std::make_shared<rpc::ConnectionPool>(as_service("svc")));
    auto page = s.list_page("ns", "", "", 0, Deadline::after(5));
    ASSERT_TRUE(page.is_ok()) << page.status().to_string();
    EXPECT_EQ(page->entries.size(), 2u);  // a third would pass kPageBytes
    EXPECT_TRUE(page->more);
}

TEST(Store, GetManyByDefaultAsksEachKey) {
    // A client store without kvs.get_many of its own.
    class OneByOne final : public kvs::Store {
      public:
        Result<uint64_t> put(const std::string&, const std::string&, const std::string&, Deadline,
                             uint64_t) override {
            return uint64_t{0};
        }
        Result<kvs::Entry> get(const std::string&, const std::string& key, Deadline) override {
            ++asked;
            if (key == "broken") return Status(DYAD_RC_CONNFAIL, "gone", ECONNREFUSED);
            if (key == "a") return kvs::Entry{"A", 3, ""};
            return Status(DYAD_RC_NOTFOUND, "absent", ENOENT);
        }
        Result<kvs::Entry> wait(const std::string& ns, const std::string& key,
                                Deadline d) override {
            return get(ns, key, d);
        }
        Result<std::vector<std::pair<std::string, kvs::Entry>>> list(const std::string&,
                                                                     const std::string&,
                                                                     Deadline) override {
            return std::vector<std::pair<std::string, kvs::Entry>>();
        }
        Result<kvs::Page> list_page(const std::string&, const std::string&, const std::string&,
                                    uint64_t, Deadline) override {
            return kvs::Page();
        }
        std::string describe() const override { return "one by one"; }
        int asked = 0;
    } s;
    auto got = s.get_many("ns", {"a", "b"}, Deadline::after(1));
    ASSERT_TRUE(got.is_ok());
    EXPECT_EQ(s.asked, 2);
    EXPECT_EQ((*got)[0].state, kvs::Lookup::State::found);
    EXPECT_EQ((*got)[0].entry.value, "A");
    EXPECT_EQ((*got)[1].state, kvs::Lookup::State::missing);
    EXPECT_EQ(s.get_many("ns", {"broken"}, Deadline::after(1)).status().rc(), DYAD_RC_CONNFAIL);
}

TEST(EmbeddedStore, WaitsAndTheirCancel) {
    kvs::EmbeddedStore s(std::make_unique<kvs::MemoryStore>());
    std::optional<Result<kvs::Entry>> got;
    uint64_t id = s.wait("ns", "k", Deadline::after(5), [&](Result<kvs::Entry> e) { got = e; });
    EXPECT_NE(id, 0u);
    EXPECT_FALSE(got.has_value());
    ASSERT_TRUE(
        s.put("ns", "k", nlohmann::json{{"owner", "svc"}}.dump(), "svc", 0, Deadline::after(5)));
    ASSERT_TRUE(got.has_value());
    EXPECT_TRUE(got->is_ok());
    // Present: answered at once.
    got.reset();
    EXPECT_EQ(s.wait("ns", "k", Deadline::after(5), [&](Result<kvs::Entry> e) { got = e; }), 0u);
    EXPECT_TRUE(got.has_value());
    // Cancelled: never answered.
    got.reset();
    id = s.wait("ns", "j", Deadline::after(5), [&](Result<kvs::Entry> e) { got = e; });
    s.cancel(id);
    ASSERT_TRUE(
        s.put("ns", "j", nlohmann::json{{"owner", "svc"}}.dump(), "svc", 0, Deadline::after(5)));
    EXPECT_FALSE(got.has_value());
    EXPECT_EQ(s.hosted()->waiters, 0u);
    EXPECT_EQ(s.get("ns", "x", Deadline::after(1)).status().rc(), DYAD_RC_NOTFOUND);
    // Registration gives a rank in registration order.
    auto a = s.register_service("a", R"({"service_id":"a","endpoints":[]})", Deadline::after(1));
    auto b = s.register_service("b", R"({"service_id":"b","endpoints":[]})", Deadline::after(1));
    ASSERT_TRUE(a && b);
    EXPECT_EQ(kvs::registry::rank_of(a->value), 0u);
    EXPECT_EQ(kvs::registry::rank_of(b->value), 1u);
}
