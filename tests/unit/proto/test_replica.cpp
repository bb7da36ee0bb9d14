// SPDX-License-Identifier: Apache-2.0
// Replicas' messages and placement (proto/replica.hpp): the rendezvous rule
// is the same for everyone, skips the owner, and moves only what a departed
// service held; entries and requests refuse what is missing.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "proto/replica.hpp"

using namespace dyad::proto;

namespace {

TEST(ReplicaHolders, SameForEveryOrderWithoutTheOwner) {
    std::vector<std::string> ids = {"n0", "n1", "n2", "n3", "n4"};
    auto a = replica_holders("k.f", ids, "n1", 2);
    std::vector<std::string> rev(ids.rbegin(), ids.rend());
    EXPECT_EQ(a, replica_holders("k.f", rev, "n1", 2));
    ASSERT_EQ(a.size(), 2u);
    EXPECT_EQ(std::count(a.begin(), a.end(), "n1"), 0);
    EXPECT_NE(a[0], a[1]);
}

TEST(ReplicaHolders, AsManyAsThereAre) {
    EXPECT_EQ(replica_holders("k", {"a", "b", "a"}, "a", 5), std::vector<std::string>{"b"});
    EXPECT_TRUE(replica_holders("k", {"a"}, "a", 1).empty());
}

TEST(ReplicaHolders, RemovingOneMovesOnlyItsFiles) {
    std::vector<std::string> ids = {"n0", "n1", "n2", "n3", "n4", "n5"};
    std::vector<std::string> fewer = {"n0", "n1", "n2", "n4", "n5"};  // n3 gone
    std::map<std::string, int> load;
    for (int i = 0; i < 600; ++i) {
        const std::string key = "f" + std::to_string(i);
        auto before = replica_holders(key, ids, "n0", 1);
        auto after = replica_holders(key, fewer, "n0", 1);
        ++load[before[0]];
        if (before[0] != "n3") {
            EXPECT_EQ(before, after) << key;
        }
    }
    // Spread: each of the five others holds some of 600 files.
    for (const char* id : {"n1", "n2", "n3", "n4", "n5"}) EXPECT_GT(load[id], 60) << id;
}

TEST(ReplicaEntry, RoundTripAndRefusals) {
    ReplicaEntry e{"d/f", "n2", "node2", {"tcp://10.0.0.3:7"}, "n1", 7, 42, -5};
    auto back = ReplicaEntry::parse(e.to_json().dump());
    ASSERT_TRUE(back.is_ok()) << back.status().message();
    EXPECT_EQ(back->holder, "n2");
    EXPECT_EQ(back->of, "n1");
    EXPECT_EQ(back->generation, 7u);
    EXPECT_EQ(back->mtime_ns, -5);
    EXPECT_FALSE(ReplicaEntry::parse("[1]").is_ok());
    auto j = e.to_json();
    j.erase("generation");
    EXPECT_FALSE(ReplicaEntry::parse(j.dump()).is_ok());
    j = e.to_json();
    j["generation"] = "7";
    EXPECT_FALSE(ReplicaEntry::parse(j.dump()).is_ok());
}

TEST(ReplicateRequest, RefusesEmptyOrMissing) {
    ReplicateRequest r{"dyad", "k", "f", 3, 10};
    auto back = ReplicateRequest::parse(r.build());
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back->generation, 3u);
    auto j = r.build();
    j["generation"] = 0;
    EXPECT_EQ(ReplicateRequest::parse(j).status().rc(), DYAD_RC_BADRPC);
    j = r.build();
    j.erase("upath");
    EXPECT_FALSE(ReplicateRequest::parse(j).is_ok());
    EXPECT_EQ(replica_key("k", "n2"), replica_prefix("k") + "n2");
    EXPECT_EQ(replica_namespace("dyad"), "dyad.replicas");
}

TEST(UnreplicateRequest, RoundTripAndRefusals) {
    UnreplicateRequest r{"dyad", "k", "f", 7};
    auto back = UnreplicateRequest::parse(r.build());
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back->generation, 7u);
    EXPECT_EQ(back->upath, "f");
    auto j = r.build();
    j["generation"] = 0;
    EXPECT_EQ(UnreplicateRequest::parse(j).status().rc(), DYAD_RC_BADRPC);
    j = r.build();
    j["key"] = 5;
    EXPECT_FALSE(UnreplicateRequest::parse(j).is_ok());
    j = r.build();
    j.erase("ns");
    EXPECT_FALSE(UnreplicateRequest::parse(j).is_ok());
    EXPECT_FALSE(UnreplicateRequest::parse(nlohmann::json::array()).is_ok());
}

}  // namespace
