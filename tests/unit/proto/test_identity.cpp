// SPDX-License-Identifier: Apache-2.0
// The identity a service registers, built in one place and read back.
#include <gtest/gtest.h>

#include "proto/identity.hpp"

using dyad::proto::Identity;
using nlohmann::json;

TEST(Identity, RoundTrip) {
    Identity me;
    me.service_id = "node0";
    me.node = "node0";
    me.host_id = "h";
    me.ns = "dyad";
    me.producer_dir = "/p";
    me.kvs = "local";
    me.endpoints = {"tcp://10.0.0.1:7627", "unix:/tmp/s"};
    me.transports = json::array({json{{"name", "STREAM"}}});
    me.default_mode = "AUTO";
    me.pid = 42;
    me.auth = "none";
    me.wire_version = 3;
    json j = me.build();
    EXPECT_FALSE(j.contains("rank"));
    EXPECT_EQ(j["namespace"], "dyad");
    auto back = Identity::parse(j);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->endpoints, me.endpoints);
    EXPECT_EQ(back->pid, 42);
    EXPECT_FALSE(back->rank.has_value());
    me.rank = 5;
    me.rank_source = "cli";
    back = Identity::parse(me.build());
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back->rank, 5u);
    EXPECT_EQ(back->rank_source, "cli");
}

TEST(Identity, RanksAndWhatIsRefused) {
    EXPECT_FALSE(Identity::parse(json{{"endpoints", json::array()}}).is_ok());
    EXPECT_FALSE(Identity::parse(json{{"service_id", "a"}}).is_ok());
    EXPECT_FALSE(
        Identity::parse(json{{"service_id", "a"}, {"endpoints", json::array({1})}}).is_ok());
    EXPECT_FALSE(Identity::parse(
                     json{{"service_id", "a"}, {"endpoints", json::array()}, {"rank", 4294967295u}})
                     .is_ok());
    EXPECT_TRUE(Identity::parse(json{{"service_id", "a"}, {"endpoints", json::array()}}).is_ok());
    json e = json::object();
    EXPECT_FALSE(dyad::proto::rank_of(e).has_value());
    dyad::proto::give_rank(&e, 3);
    EXPECT_EQ(dyad::proto::rank_of(e), 3u);
    EXPECT_EQ(e["rank_source"], "store");
    EXPECT_FALSE(dyad::proto::rank_of(json{{"rank", -1}}).has_value());
}
