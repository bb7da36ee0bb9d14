// SPDX-License-Identifier: Apache-2.0
// The hello and the dyad.status answer as types: a service's document
// parses and builds again unchanged (old tools read the same JSON), what a
// peer sends of the wrong type is refused naming the field, and an older
// service's missing fields read as defaults.
#include <gtest/gtest.h>

#include "proto/hello.hpp"
#include "proto/service_status.hpp"

using namespace dyad::proto;
using nlohmann::json;

namespace {

json identity_doc() {
    return {{"service_id", "n1"},
            {"node", "n1"},
            {"host_id", "h"},
            {"namespace", "dyad"},
            {"producer_dir", "/p"},
            {"kvs", "local"},
            {"endpoints", {"tcp://127.0.0.1:1"}},
            {"transports", json::array({{{"name", "STREAM"}}, {{"name", "LOCAL"}}})},
            {"default_mode", "AUTO"},
            {"pid", 42},
            {"auth", "none"},
            {"wire_version", 3},
            {"rank", 2},
            {"rank_source", "store"}};
}

json status_doc() {
    json j = identity_doc();
    j["counters"] = {{"requests", 5},
                     {"fetch_many_requests", 1},
                     {"files_requested", 9},
                     {"served", 4},
                     {"errors", 1},
                     {"bytes_sent", 1000},
                     {"bytes_received", 0},
                     {"rejected", 0},
                     {"published", 3},
                     {"refused_unproduced", 0},
                     {"refused_unreadable", 0},
                     {"refused_not_producer", 0},
                     {"refused_stale", 1},
                     {"auth_refused", 0},
                     {"idle_closed", 0},
                     {"refused_peer_connections", 0},
                     {"refused_connections_table_full", 0},
                     {"reserved_connections_admitted", 0},
                     {"refused_peer_request_bytes", 0},
                     {"refused_request_bytes", 0},
                     {"refused_peer_fetches", 0},
                     {"refused_peer_local", 0},
                     {"in_flight", 0},
                     {"per_transport",
                      {{"STREAM",
                        {{"requests", 9},
                         {"served", 4},
                         {"errors", 1},
                         {"bytes_sent", 1000},
                         {"bytes_received", 0},
                         {"in_flight", 0},
                         {"transport", {{"chunks", 7}}}}}}},
                     {"per_kind", {{"fetch", {{"requests", 5}}}}}};
    j["peers"] = {{"peers_fetching", 0},
                  {"busiest_peer_fetches", 0},
                  {"busiest_peer_local", 0},
                  {"with_connections", 1},
                  {"busiest_peer_connections", 1},
                  {"max_connections_per_peer", 512},
                  {"max_fetches_per_peer", 1024},
                  {"max_local_per_peer", 256},
                  {"memory_per_peer", 1 << 20},
                  {"max_request_bytes_per_peer", 100},
                  {"max_request_bytes", 200},
                  {"max_wait_s", 60.0},
                  {"max_connections", 4096},
                  {"request_bytes_held", 0},
                  {"busiest_peer_request_bytes", 0}};
    j["connections"] = 1;
    j["uptime_s"] = 1.5;
    j["metrics"] = "http://127.0.0.1:9/metrics";
    j["memory"] = {{"limit", 1}};
    j["store"] = {{"keys", 3}, {"waiters", 1}, {"epoch", 2}, {"state_dir", "/s"}};
    j["metadata_store"] = {{"backend", "embedded"}, {"endpoint", "embedded"}, {"reachable", true}};
    j["replicas"] = {
        {"default_copies", 1}, {"held", 2}, {"bytes", 3}, {"space", 4}, {"pushed", 5u}};
    j["settings"] = json::array();
    return j;
}

}  // namespace

TEST(ProtoServiceStatus, ParsesAndBuildsTheSameDocument) {
    const json doc = status_doc();
    auto st = ServiceStatus::parse(doc);
    ASSERT_TRUE(st.is_ok()) << st.status().message();
    EXPECT_EQ(st->identity.service_id, "n1");
    EXPECT_EQ(st->identity.pid, 42);
    EXPECT_EQ(st->counters.files_requested, 9u);
    EXPECT_EQ(st->counters.per_transport.at("STREAM").bytes_sent, 1000u);
    EXPECT_EQ(st->peers.max_connections_per_peer, 512u);
    EXPECT_EQ(st->connections, 1u);
    EXPECT_EQ(st->metrics.value_or(""), "http://127.0.0.1:9/metrics");
    EXPECT_EQ(st->transport_names(), (std::vector<std::string>{"STREAM", "LOCAL"}));
    EXPECT_EQ(st->build(), doc);
}

TEST(ProtoServiceStatus, SectionsReadThroughTheirTypes) {
    const json doc = status_doc();
    auto h = HostedStore::parse(doc["store"]);
    ASSERT_TRUE(h.is_ok());
    EXPECT_EQ(h->keys, 3u);
    EXPECT_EQ(h->epoch, 2u);
    auto m = StoreHealth::parse(doc["metadata_store"]);
    ASSERT_TRUE(m.is_ok());
    EXPECT_TRUE(m->reachable);
    EXPECT_EQ(m->backend, "embedded");
    auto r = ReplicaFigures::parse(doc["replicas"]);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->space, 4u);
    EXPECT_EQ(r->counters, (std::map<std::string, uint64_t>{{"pushed", 5}}));
}

TEST(ProtoServiceStatus, RefusesWrongTypesAndReadsOldDocuments) {
    json bad = status_doc();
    bad["counters"]["served"] = "many";
    auto st = ServiceStatus::parse(bad);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.status().message().find("'served'"), std::string::npos);
    bad = status_doc();
    bad["counters"]["per_transport"]["STREAM"]["bytes_sent"] = -1;
    EXPECT_FALSE(ServiceStatus::parse(bad).is_ok());
    EXPECT_FALSE(ServiceStatus::parse(json::array()).is_ok());
    EXPECT_FALSE(StoreHealth::parse(json{{"reachable", "yes"}}).is_ok());
    // An older service: no peers, no per_kind: zeros, and the rest as it came.
    json old = identity_doc();
    old["counters"] = {{"served", 2}};
    old["uptime_s"] = 3;
    auto o = ServiceStatus::parse(old);
    ASSERT_TRUE(o.is_ok()) << o.status().message();
    EXPECT_EQ(o->counters.served, 2u);
    EXPECT_EQ(o->peers.max_fetches_per_peer, 0u);
    EXPECT_DOUBLE_EQ(o->uptime_s, 3.0);
}

TEST(ProtoHello, ReadsTheServiceWithDefaultsAndRefusesWrongTypes) {
    json doc = identity_doc();
    doc.erase("namespace");
    doc.erase("kvs");
    auto h = Hello::parse(doc);
    ASSERT_TRUE(h.is_ok()) << h.status().message();
    EXPECT_EQ(h->service.ns, "dyad");
    EXPECT_TRUE(h->store_here());
    ASSERT_TRUE(h->service.rank.has_value());
    EXPECT_EQ(*h->service.rank, 2u);
    doc["kvs"] = "etcd://10.0.0.1:2379";
    h = Hello::parse(doc);
    ASSERT_TRUE(h.is_ok());
    EXPECT_FALSE(h->store_here());
    // The old client read these with json::value, which throws on a wrong type.
    doc["node"] = 7;
    h = Hello::parse(doc);
    ASSERT_FALSE(h.is_ok());
    EXPECT_NE(h.status().message().find("'node'"), std::string::npos);
    EXPECT_FALSE(Hello::parse(json{{"endpoints", json::array()}}).is_ok());  // no service_id
}

TEST(ProtoHello, DirHolderRoundTripsAndRefusesATornFile) {
    DirHolder d{"n1", 99};
    auto back = DirHolder::parse(d.build());
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back->service_id, "n1");
    EXPECT_EQ(back->pid, 99);
    EXPECT_FALSE(DirHolder::parse(json::parse("{\"service_id\":\"n1\"}")).is_ok());
    EXPECT_FALSE(DirHolder::parse(json::parse("[1]")).is_ok());
}
