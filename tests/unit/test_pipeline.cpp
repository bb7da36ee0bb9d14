// SPDX-License-Identifier: Apache-2.0
// The pieces of the consumer's pipeline that stand alone: kvs.get_many on a
// real server, and the path prefixes of dyad sync.
#include <gtest/gtest.h>

#include "client/client.hpp"
#include "kvs/get_many.hpp"
#include "rpc/server.hpp"
#include "server_loop.hpp"

using namespace dyad;

namespace {
struct StoreHolder {
    std::unique_ptr<kvs::MemoryStore> store_ = std::make_unique<kvs::MemoryStore>();
};
class Loop : public StoreHolder, public test_support::ServerLoop {
  public:
    Loop() : test_support::ServerLoop([this](rpc::Server& s) { kvs::serve(s, *store_); }) {}
    void put(const std::string& key, const std::string& value) {
        on_loop([&] { return store_->put("ns", key, value, "svc").is_ok(); });
    }
};
}  // namespace

TEST(GetMany, FoundMissingInOrder) {
    Loop l;
    l.put("a", "A");
    l.put("c", "C1");
    l.put("c", "C2");
    rpc::ConnectionPool pool;
    auto r = kvs::get_many(pool, l.uri, "ns", {"c", "b", "a", "c"}, Deadline::after(5));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_EQ(r->size(), 4u);
    using S = kvs::Lookup::State;
    EXPECT_EQ((*r)[0].state, S::found);
    EXPECT_EQ((*r)[0].entry.value, "C2");
    EXPECT_EQ((*r)[0].entry.version, 2u);
    EXPECT_EQ((*r)[1].state, S::missing);
    EXPECT_EQ((*r)[2].state, S::found);
    EXPECT_EQ((*r)[2].entry.value, "A");
    EXPECT_EQ((*r)[3].entry.value, "C2");
    // Another namespace holds none of them.
    auto o = kvs::get_many(pool, l.uri, "other", {"a"}, Deadline::after(5));
    ASSERT_TRUE(o.is_ok());
    EXPECT_EQ((*o)[0].state, S::missing);
}

TEST(GetMany, AnswerBudgetLeavesTheRestForLater) {
    Loop l;
    std::string big(60 << 10, 'x');
    std::vector<std::string> keys;
    for (int i = 0; i < 20; ++i) {
        keys.push_back("k" + std::to_string(i));
        l.put(keys.back(), big);
    }
    rpc::ConnectionPool pool;
    auto r = kvs::get_many(pool, l.uri, "ns", keys, Deadline::after(5));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    size_t found = 0, later = 0;
    for (const auto& e : r.value()) {
        if (e.state == kvs::Lookup::State::found) {
            ++found;
            EXPECT_EQ(e.entry.value.size(), big.size());
        }
        if (e.state == kvs::Lookup::State::later) ++later;
    }
    // 512 KiB hold 8 values of 60 KiB; the other 12 are to be asked again.
    EXPECT_EQ(found, 8u);
    EXPECT_EQ(later, 12u);
    EXPECT_EQ(r.value()[0].state, kvs::Lookup::State::found);
    EXPECT_EQ(r.value()[19].state, kvs::Lookup::State::later);
}

TEST(GetMany, TooManyKeysAndBadArgumentsAreRefused) {
    Loop l;
    rpc::ConnectionPool pool;
    std::vector<std::string> keys(kvs::kGetManyMaxKeys + 1, "k");
    auto r = kvs::get_many(pool, l.uri, "ns", keys, Deadline::after(5));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().rc(), DYAD_RC_BADUNPACK);
    EXPECT_NE(r.status().message().find("at most 1024 keys"), std::string::npos)
        << r.status().message();
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5));
    ASSERT_TRUE(c.is_ok());
    auto bad =
        c.value()->call("kvs.get_many", {{"ns", "ns"}, {"keys", nlohmann::json::array({"a", 3})}},
                        Deadline::after(5));
    EXPECT_EQ(bad.status().rc(), DYAD_RC_BADUNPACK);
    auto none = c.value()->call("kvs.get_many", {{"ns", "ns"}}, Deadline::after(5));
    EXPECT_EQ(none.status().rc(), DYAD_RC_BADUNPACK);
}

TEST(Sync, PrefixMatchesWholeComponents) {
    using client::under_prefix;
    EXPECT_TRUE(under_prefix("a/b", ""));
    EXPECT_TRUE(under_prefix("a/b", "."));
    EXPECT_TRUE(under_prefix("data", "data"));
    EXPECT_TRUE(under_prefix("data/x/y", "data"));
    EXPECT_TRUE(under_prefix("data/x/y", "data/"));
    EXPECT_TRUE(under_prefix("data/x/y", "./data/x"));
    EXPECT_FALSE(under_prefix("data2/x", "data"));
    EXPECT_FALSE(under_prefix("datafile", "data"));
    EXPECT_FALSE(under_prefix("dat", "data"));
    EXPECT_TRUE(under_prefix("img/a1", "img/a*"));
    EXPECT_TRUE(under_prefix("img/a", "img/a*"));
    EXPECT_FALSE(under_prefix("img/b1", "img/a*"));
}
