// SPDX-License-Identifier: Apache-2.0
// The RPC layer and the embedded store over real sockets, in one process:
// the server loop runs on a thread, the blocking client on the test thread.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

#include "kvs/epoch.hpp"
#include "kvs/store.hpp"
#include "rpc/client.hpp"
#include "rpc/server.hpp"
#include "server_loop.hpp"

using namespace dyad;

namespace {
// The embedded store (a base, so it exists before the server's handlers
// are registered) and two test topics on a real server.
struct StoreHolder {
    std::unique_ptr<kvs::MemoryStore> store_ = std::make_unique<kvs::MemoryStore>();
};
class Loop : public StoreHolder, public test_support::ServerLoop {
  public:
    Loop()
        : test_support::ServerLoop([this](rpc::Server& server) {
              kvs::serve(server, *store_);
              server.handle("test.stream", [](std::shared_ptr<rpc::Request> r) {
                  int n = r->args().value("n", 0);
                  auto data = std::make_shared<std::string>("chunk");
                  for (int i = 0; i < n; ++i)
                      r->respond({{"i", i}}, asio::buffer(*data), [data](bool) {});
                  r->end({{"count", n}});
              });
              server.handle("test.hang", [](std::shared_ptr<rpc::Request>) {});
          }) {}
};
}  // namespace

TEST(Rpc, HelloCarriesServerInfo) {
    Loop l;
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5));
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c.value()->peer_info()["service_id"], "test");
}

TEST(Rpc, StreamingResponsesEndInOrder) {
    Loop l;
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5)).value();
    auto tag = c->send_request("test.stream", {{"n", 5}}, Deadline::after(5));
    ASSERT_TRUE(tag.is_ok());
    int seen = 0;
    for (;;) {
        auto f = c->read_frame(Deadline::after(5));
        ASSERT_TRUE(f.is_ok());
        std::string d(f->header.data_len, '\0');
        ASSERT_TRUE(c->read_data(d.data(), d.size(), Deadline::after(5)).is_ok());
        if (f->header.type == rpc::Type::end) {
            EXPECT_EQ(f->meta["count"], 5);
            break;
        }
        ASSERT_EQ(f->header.type, rpc::Type::response);
        EXPECT_EQ(f->meta["i"], seen++);
        EXPECT_EQ(d, "chunk");
    }
    EXPECT_EQ(seen, 5);
}

TEST(Rpc, UnknownTopicIsAnError) {
    Loop l;
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5)).value();
    auto r = c->call("no.such.topic", {}, Deadline::after(5));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().err(), ENOSYS);
}

TEST(Rpc, ServiceEnforcesTheRequestDeadline) {
    Loop l;
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5)).value();
    auto t0 = std::chrono::steady_clock::now();
    auto r = c->call("test.hang", {}, Deadline::after(0.3), 5.0);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().rc(), DYAD_RC_TIMEOUT);
    EXPECT_LT(dt, 3.0);
}

namespace {
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

TEST(Kvs, VersionsCarryTheEpoch) {
    kvs::MemoryStore s(kvs::StoreLimits(), 7);
    const uint64_t base = uint64_t{7} << 32;
    EXPECT_EQ(s.put("ns", "k", owned("svc", 1), "svc").value(), base | 1);
    EXPECT_EQ(s.put("ns", "k", owned("svc", 2), "svc").value(), base | 2);
    EXPECT_EQ(s.put("ns", "j", owned("svc", 1), "svc").value(), base | 1);
    // A later run (a larger epoch) never gives a version of an earlier one.
    kvs::MemoryStore later(kvs::StoreLimits(), 8);
    EXPECT_GT(later.put("ns", "k", owned("svc", 1), "svc").value(), base | 2);
    // replaces names the version taken over, whole.
    EXPECT_FALSE(s.put("ns", "k", owned("other", 3), "other", 2).is_ok());
    EXPECT_EQ(s.put("ns", "k", owned("other", 3), "other", base | 2).value(), base | 3);
}

// DYAD's key of "data0.txt" at depth 3 is that of a file named
// "17f.204.15b.data0.txt" at depth 0: the deeper key's record holds it.
TEST(Kvs, KeyDepthCollisionsGoToTheDeeperKey) {
    auto rec = [](const std::string& path, const std::string& owner) {
        return nlohmann::json{{"path", path}, {"owner", owner}}.dump();
    };
    const std::string key = "17f.204.15b.data0.txt";
    kvs::MemoryStore s;
    ASSERT_TRUE(s.put("ns", key, rec(key, "attacker"), "attacker").is_ok());
    // The genuine producer takes it, although another service wrote it.
    ASSERT_TRUE(s.put("ns", key, rec("data0.txt", "genuine"), "genuine").is_ok());
    auto r = s.put("ns", key, rec(key, "attacker"), "attacker");
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().err(), EEXIST);
    EXPECT_NE(r.status().message().find("deeper DYAD_KEY_DEPTH"), std::string::npos);
    EXPECT_NE(s.get("ns", key)->value.find("genuine"), std::string::npos);
    // A record whose path is not the key's tail takes nothing.
    EXPECT_FALSE(s.put("ns", key, rec("x", "attacker"), "attacker").is_ok());
    // The same path again is the usual rule (another writer: EEXIST).
    EXPECT_FALSE(s.put("ns", key, rec("data0.txt", "attacker"), "attacker").is_ok());
}

TEST(Kvs, EpochFileGrowsAtEveryStart) {
    char tmpl[] = "/tmp/dyad-epoch-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    std::string dir = std::string(tmpl) + "/state";
    EXPECT_EQ(kvs::next_epoch(dir).value(), 0u);
    EXPECT_EQ(kvs::next_epoch(dir).value(), 1u);
    EXPECT_EQ(kvs::next_epoch(dir).value(), 2u);
    std::string file = dir + "/" + kvs::kEpochFile;
    {
        std::FILE* f = std::fopen(file.c_str(), "w");
        ASSERT_NE(f, nullptr);
        std::fputs("garbage\n", f);
        std::fclose(f);
    }
    auto bad = kvs::next_epoch(dir);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find(file), std::string::npos) << bad.status().message();
    std::remove(file.c_str());
    ::rmdir(dir.c_str());
    ::rmdir(tmpl);
}

TEST(Kvs, ListPagesInKeyOrder) {
    kvs::MemoryStore s;
    for (int i = 0; i < 25; ++i) {
        char k[16];
        std::snprintf(k, sizeof k, "a/%02d", i);
        ASSERT_TRUE(s.put("ns", k, owned("svc", i), "svc").is_ok());
    }
    ASSERT_TRUE(s.put("ns", "b/0", owned("svc", 0), "svc").is_ok());
    std::vector<std::string> seen;
    std::string after;
    int pages = 0;
    for (;;) {
        auto p = s.list_page("ns", "a/", after, 10);
        ++pages;
        for (auto& [k, e] : p.entries) seen.push_back(k);
        if (!p.more) break;
        ASSERT_FALSE(p.entries.empty());
        after = p.entries.back().first;
    }
    EXPECT_EQ(pages, 3);
    ASSERT_EQ(seen.size(), 25u);
    EXPECT_EQ(seen.front(), "a/00");
    EXPECT_EQ(seen.back(), "a/24");
    // The limit is clamped; the byte budget ends a page early.
    EXPECT_EQ(s.list_page("ns", "", "", 1000000).entries.size(), 26u);
    kvs::MemoryStore big;
    std::string blob(60000, 'x');
    for (int i = 0; i < 10; ++i)
        ASSERT_TRUE(big.put("ns", "k" + std::to_string(i),
                            nlohmann::json{{"owner", "svc"}, {"blob", blob}}.dump(), "svc")
                        .is_ok());
    auto p = big.list_page("ns", "", "", 0);
    EXPECT_TRUE(p.more);
    EXPECT_LT(p.entries.size(), 10u);
    EXPECT_GE(p.entries.size(), 1u);
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
