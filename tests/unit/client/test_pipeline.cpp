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

TEST(GetMany, OlderClientsGetTheJsonAnswer) {
    // A client of the earlier release does not ask for "answer": "raw".
    Loop l;
    l.put("a", "A");
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5));
    ASSERT_TRUE(c.is_ok());
    auto r =
        c.value()->call("kvs.get_many", {{"ns", "ns"}, {"keys", {"a", "b"}}}, Deadline::after(5));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r.value(), nlohmann::json::parse(R"({"entries": [["A", 1], 0]})"));
}

TEST(GetMany, ReadsTheJsonAnswerOfAnOlderService) {
    // A service of the earlier release ignores "answer" and says it in JSON.
    test_support::ServerLoop old([](rpc::Server& s) {
        s.handle("kvs.get_many", [](std::shared_ptr<rpc::Request> r) {
            r->end(nlohmann::json::parse(R"({"entries": [["V", 7], 0, null]})"));
        });
    });
    rpc::ConnectionPool pool;
    auto r = kvs::get_many(pool, old.uri, "ns", {"a", "b", "c"}, Deadline::after(5));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    using S = kvs::Lookup::State;
    EXPECT_EQ((*r)[0].state, S::found);
    EXPECT_EQ((*r)[0].entry.value, "V");
    EXPECT_EQ((*r)[0].entry.version, 7u);
    EXPECT_EQ((*r)[1].state, S::missing);
    EXPECT_EQ((*r)[2].state, S::later);
}

TEST(GetMany, RawEntriesRoundTripAndMalformedOnesAreRefused) {
    using S = kvs::Lookup::State;
    std::vector<kvs::Lookup> in(4);
    in[0].state = S::found;
    in[0].entry = {std::string("v\0\xff", 3), 0x0102030405060708ull};
    in[1].state = S::missing;
    in[2].state = S::later;
    in[3].state = S::found;
    in[3].entry = {"", 1};
    std::string data;
    for (const auto& l : in) kvs::append_raw_entry(&data, l);
    auto back = kvs::parse_raw_entries(data, in.size());
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    for (size_t i = 0; i < in.size(); ++i) {
        EXPECT_EQ((*back)[i].state, in[i].state);
        EXPECT_EQ((*back)[i].entry.value, in[i].entry.value);
        EXPECT_EQ((*back)[i].entry.version, in[i].entry.version);
    }
    auto refused = [](const std::string& d, size_t n) {
        auto r = kvs::parse_raw_entries(d, n);
        return !r.is_ok() && r.status().rc() == DYAD_RC_BADRPC && r.status().err() == EPROTO;
    };
    EXPECT_TRUE(refused(data, in.size() + 1));      // fewer entries than keys
    EXPECT_TRUE(refused(data, in.size() - 1));      // bytes left over
    for (size_t cut = 0; cut < data.size(); ++cut)  // every prefix is short of an entry
        EXPECT_TRUE(refused(data.substr(0, cut), in.size())) << cut;
    EXPECT_TRUE(refused(std::string(1, '\x03'), 1));  // unknown entry type
    // A length past the end, even the largest.
    std::string huge = std::string(1, '\x01') + std::string(8, '\0') + std::string(4, '\xff');
    EXPECT_TRUE(refused(huge, 1));
    EXPECT_TRUE(kvs::parse_raw_entries("", 0).is_ok());
}

TEST(GetMany, ARawAnswerThatDoesNotMatchTheKeysIsRefused) {
    test_support::ServerLoop liar([](rpc::Server& s) {
        s.handle("kvs.get_many", [](std::shared_ptr<rpc::Request> r) {
            r->end({{"format", "raw"}, {"count", 1}}, std::string(1, '\0'));
        });
    });
    rpc::ConnectionPool pool;
    auto r = kvs::get_many(pool, liar.uri, "ns", {"a", "b"}, Deadline::after(5));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().err(), EPROTO);
}

TEST(GetMany, AnOversizedRawAnswerIsRefusedUnread) {
    // The answer of 1,024 keys holds at most 512 KiB of values: 2 MiB is a
    // store that lies, refused before anything is allocated for it.
    test_support::ServerLoop liar([](rpc::Server& s) {
        s.handle("kvs.get_many", [](std::shared_ptr<rpc::Request> r) {
            r->end({{"format", "raw"}, {"count", 1}}, std::string(2u << 20, '\0'));
        });
    });
    rpc::ConnectionPool pool;
    auto r = kvs::get_many(pool, liar.uri, "ns", {"a"}, Deadline::after(5));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().err(), EPROTO);
    EXPECT_NE(r.status().message().find("more than the"), std::string::npos)
        << r.status().message();
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
