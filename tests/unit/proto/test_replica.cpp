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

TEST(ReplicateBatch, RoundTripAndRefusals) {
    ReplicateBatch b;
    b.ns = "dyad";
    b.files.push_back({"dyad", "k1", "a/f1", 3, 10});
    b.files.push_back({"dyad", "k2", "a/f2", 4, 0});
    auto back = ReplicateBatch::parse(b.build());
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    ASSERT_EQ(back->files.size(), 2u);
    EXPECT_EQ(back->files[1].ns, "dyad");
    EXPECT_EQ(back->files[1].upath, "a/f2");
    EXPECT_EQ(back->files[0].generation, 3u);
    // Empty, too long, a file without its generation, not an object.
    auto j = b.build();
    j["files"] = nlohmann::json::array();
    EXPECT_EQ(ReplicateBatch::parse(j).status().rc(), DYAD_RC_BADRPC);
    j = b.build();
    for (size_t i = 0; i < ReplicateBatch::kMaxFiles; ++i) j["files"].push_back(j["files"][0]);
    EXPECT_FALSE(ReplicateBatch::parse(j).is_ok());
    j = b.build();
    j["files"][1].erase("generation");
    auto bad = ReplicateBatch::parse(j);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find("file 1"), std::string::npos) << bad.status().message();
    j = b.build();
    j["files"][0] = "x";
    EXPECT_FALSE(ReplicateBatch::parse(j).is_ok());
    EXPECT_FALSE(ReplicateBatch::parse(nlohmann::json::array()).is_ok());
}

TEST(ReplicateBatchAnswer, RoundTripAndRefusals) {
    ReplicateBatchAnswer a;
    a.holder = "n2";
    a.files.push_back({true, 10, 0, ""});
    a.files.push_back({false, 0, ENOSPC, "out of replica space"});
    auto back = ReplicateBatchAnswer::parse(a.build(), 2);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->holder, "n2");
    EXPECT_TRUE(back->files[0].held);
    EXPECT_EQ(back->files[0].bytes, 10u);
    EXPECT_FALSE(back->files[1].held);
    EXPECT_EQ(back->files[1].err, ENOSPC);
    // One item short of the files asked for; an item without its bytes.
    EXPECT_FALSE(ReplicateBatchAnswer::parse(a.build(), 3).is_ok());
    auto j = a.build();
    j["files"][0].erase("bytes");
    EXPECT_FALSE(ReplicateBatchAnswer::parse(j, 2).is_ok());
}

}  // namespace
