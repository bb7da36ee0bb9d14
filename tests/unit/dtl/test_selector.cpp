// SPDX-License-Identifier: Apache-2.0
// The AUTO selector on synthetic records, and the service's memory budget.
#include <gtest/gtest.h>

#include "common/config.hpp"
#include "dtl/budget.hpp"
#include "dtl/selector.hpp"

using namespace dyad;
using namespace dyad::dtl;

namespace {

TransportRecord rec(const std::string& name, const std::string& reach, double lat, double bw,
                    bool native = false) {
    TransportRecord r;
    r.name = name;
    r.reach = reach;
    r.latency_us = lat;
    r.bandwidth_gbps = bw;
    r.rma_native = native;
    return r;
}

// A service on a cluster node: stream, LOCAL, UCX over shared memory and
// over the network (emulated RMA), libfabric.
std::vector<TransportRecord> full_service() {
    return {rec("FLUX_RPC", "network", 100, 1.2), rec("LOCAL", "node", 80, 3.0),
            rec("UCX", "host", 160, 0.9, true), rec("UCX", "network", 160, 1.0),
            rec("MARGO", "network", 400, 0.43)};
}

const std::vector<std::string> kAll = {"FLUX_RPC", "LOCAL", "UCX", "MARGO"};

}  // namespace

TEST(Selector, SameNodeTakesLocalForEverySize) {
    Placement here{true, true};
    for (uint64_t size : {0ull, 4096ull, 1ull << 30}) {
        auto s = select_transport(size, here, full_service(), kAll);
        EXPECT_EQ(s.chosen, "LOCAL") << size;
    }
}

TEST(Selector, RemoteNodeNeverTakesLocalOrSharedMemory) {
    Placement remote{false, false};
    auto s = select_transport(256u << 20, remote, full_service(), kAll);
    EXPECT_EQ(s.chosen, "FLUX_RPC");
    for (const auto& c : s.scored) {
        if (c.name == "LOCAL" || (c.name == "UCX" && c.reach == "host")) {
            EXPECT_FALSE(c.eligible);
            EXPECT_NE(c.why.find("needs the consumer"), std::string::npos) << c.why;
        }
    }
    EXPECT_NE(s.explain().find("LOCAL@node: left out"), std::string::npos) << s.explain();
}

TEST(Selector, RemoteWithAndWithoutUcx) {
    // An RDMA-capable UCX (native RMA, 10 GB/s) wins large files remotely,
    // not small ones, where the per-file cost dominates.
    auto svc = full_service();
    svc.push_back(rec("UCX", "network", 200, 10.0, true));
    Placement remote{false, false};
    EXPECT_EQ(select_transport(1ull << 30, remote, svc, kAll).chosen, "UCX");
    EXPECT_EQ(select_transport(64u << 10, remote, svc, kAll).chosen, "FLUX_RPC");
    EXPECT_EQ(select_transport(64u << 10, remote, svc, kAll).size_class, "small");
    EXPECT_EQ(select_transport(1ull << 30, remote, svc, kAll).size_class, "large");
    // A consumer built without UCX never chooses it.
    auto s = select_transport(1ull << 30, remote, svc, {"FLUX_RPC", "LOCAL", "MARGO"});
    EXPECT_EQ(s.chosen, "FLUX_RPC");
    bool seen = false;
    for (const auto& c : s.scored)
        if (c.name == "UCX") {
            seen = true;
            EXPECT_EQ(c.why, "not available to this consumer");
        }
    EXPECT_TRUE(seen);
    // A service without UCX: it is listed as not offered.
    s = select_transport(1ull << 30, remote, {rec("FLUX_RPC", "network", 100, 1.2)}, kAll);
    EXPECT_EQ(s.chosen, "FLUX_RPC");
    EXPECT_NE(s.explain().find("UCX: left out, not offered"), std::string::npos) << s.explain();
}

TEST(Selector, NativeSharedMemoryBeatsEmulatedNetworkOnTheSameHost) {
    std::vector<TransportRecord> svc = {rec("FLUX_RPC", "network", 100, 1.0),
                                        rec("UCX", "host", 20, 8.0, true),
                                        rec("UCX", "network", 160, 0.9, false)};
    auto s = select_transport(512u << 20, Placement{false, true}, svc, kAll);
    EXPECT_EQ(s.chosen, "UCX");
    EXPECT_EQ(s.scored.front().reach, "host");
    // Off the host only the emulated network lane remains, and loses.
    EXPECT_EQ(select_transport(512u << 20, Placement{false, false}, svc, kAll).chosen, "FLUX_RPC");
}

TEST(Selector, TiesGoByPreferenceWhateverTheRecordOrder) {
    std::vector<TransportRecord> a = {rec("MARGO", "network", 100, 1.0),
                                      rec("FLUX_RPC", "network", 100, 1.0),
                                      rec("UCX", "network", 100.5, 1.0)};
    std::vector<TransportRecord> b(a.rbegin(), a.rend());
    auto sa = select_transport(1u << 20, Placement{}, a, kAll);
    auto sb = select_transport(1u << 20, Placement{}, b, kAll);
    EXPECT_EQ(sa.chosen, "UCX");  // within 1%: UCX is preferred to the stream
    EXPECT_EQ(sa.order, sb.order);
    EXPECT_EQ(sa.explain(), sb.explain());
    EXPECT_EQ((std::vector<std::string>{"UCX", "FLUX_RPC", "MARGO"}), sa.order);
}

TEST(Selector, NothingUsableIsSaid) {
    auto s = select_transport(10, Placement{}, {rec("LOCAL", "node", 1, 1)}, kAll);
    EXPECT_TRUE(s.chosen.empty());
    EXPECT_TRUE(s.order.empty());
    EXPECT_NE(s.explain().find("none usable"), std::string::npos);
    // Records with nonsense figures or reach are left out, not trusted.
    s = select_transport(10, Placement{true, true},
                         {rec("UCX", "galaxy", 1, 1), rec("FLUX_RPC", "network", 1, 0)}, kAll);
    EXPECT_TRUE(s.chosen.empty()) << s.explain();
}

TEST(Selector, FiguresCanBeConfigured) {
    auto svc = full_service();
    ASSERT_TRUE(apply_figures("UCX@network=10/20,MARGO=5/50", &svc).is_ok());
    for (const auto& r : svc) {
        if (r.name == "UCX" && r.reach == "network") {
            EXPECT_EQ(r.bandwidth_gbps, 20);
        }
        if (r.name == "UCX" && r.reach == "host") {
            EXPECT_EQ(r.bandwidth_gbps, 0.9);
        }
        if (r.name == "MARGO") {
            EXPECT_EQ(r.latency_us, 5);
        }
    }
    EXPECT_EQ(select_transport(1ull << 30, Placement{}, svc, kAll).chosen, "MARGO");
    for (const char* bad : {"UCX", "UCX=1", "UCX=a/2", "UCX=1/0", "NOPE=1/1", "UCX=-1/2"}) {
        auto v = full_service();
        Status s = apply_figures(bad, &v);
        EXPECT_FALSE(s.is_ok()) << bad;
    }
}

TEST(Selector, RecordsRoundTrip) {
    auto r = rec("UCX", "host", 12.5, 3.25, true);
    r.address = "abc";
    auto back = TransportRecord::from_json(r.to_json());
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back->to_json(), r.to_json());
    EXPECT_FALSE(TransportRecord::from_json(nlohmann::json::array()).is_ok());
    EXPECT_FALSE(TransportRecord::from_json({{"name", "UCX"}, {"latency_us", "fast"}}).is_ok());
}

TEST(Budget, ParksWhenSpentAndServesEndpointsInTurn) {
    MemoryBudget b(64u << 20);  // per endpoint: 8 MiB
    const size_t mb4 = 4u << 20;
    std::vector<Buffer> held;
    // Endpoint 1 takes its share (two 4 MiB buffers), then is refused.
    held.push_back(b.try_get(1, mb4));
    held.push_back(b.try_get(1, mb4));
    EXPECT_TRUE(held[0] && held[1]);
    EXPECT_FALSE(b.try_get(1, mb4));
    // Others fill the rest.
    for (uint64_t ep = 2; ep <= 15; ++ep) {
        Buffer x = b.try_get(ep, mb4);
        ASSERT_TRUE(x) << ep;
        held.push_back(std::move(x));
    }
    EXPECT_EQ(b.in_use(), 64u << 20);
    EXPECT_FALSE(b.try_get(16, mb4));
    // Three endpoints wait; 20 waits twice. Grants go round-robin.
    std::vector<uint64_t> granted;
    std::vector<Buffer> got;
    for (uint64_t ep : {20, 20, 21, 22})
        b.wait(ep, mb4, [&, ep](Buffer x) {
            granted.push_back(ep);
            got.push_back(std::move(x));
        });
    EXPECT_TRUE(granted.empty());
    EXPECT_EQ(b.stats()["waiting"], 4);
    // A newcomer does not jump the queue.
    EXPECT_FALSE(b.try_get(23, mb4));
    for (int i = 0; i < 4; ++i) held.pop_back();
    EXPECT_EQ((std::vector<uint64_t>{20, 21, 22, 20}), granted);
    EXPECT_LE(b.peak(), 64u << 20);
    // A cancelled wait is never granted.
    uint64_t t = b.wait(30, mb4, [&](Buffer) { ADD_FAILURE() << "cancelled waiter granted"; });
    b.cancel(30, t);
    held.pop_back();
    EXPECT_EQ(b.stats()["waiting"], 0);
}

TEST(Budget, ReservationsCountAndAnEndpointAlwaysGetsOne) {
    MemoryBudget b(16u << 20);
    EXPECT_TRUE(b.try_reserve(12u << 20));
    EXPECT_FALSE(b.try_reserve(8u << 20));
    Buffer x = b.try_get(1, 4u << 20);
    EXPECT_TRUE(x);
    EXPECT_FALSE(b.try_get(2, 1));
    b.unreserve(12u << 20);
    // Over the 8 MiB share per endpoint, but it holds nothing: granted
    // (within the limit).
    Buffer y = b.try_get(2, 12u << 20);
    EXPECT_TRUE(y);
    EXPECT_EQ(b.in_use(), 16u << 20);
    EXPECT_FALSE(b.try_get(3, 1));
}

TEST(Budget, APeerHoldsAtMostItsShareWhateverItsConnections) {
    MemoryBudget b(64u << 20);  // per endpoint: 8 MiB
    b.set_per_peer(16u << 20);
    const size_t mb4 = 4u << 20;
    const uint64_t greedy = 7, other = 9;
    std::vector<Buffer> held;
    // Peer 7 reads ahead within its share: endpoints 1 and 2 take two
    // buffers each (their 8 MiB), 16 MiB in all; then no more.
    for (uint64_t ep : {1, 1, 2, 2}) {
        Buffer x = b.try_get(ep, mb4, greedy);
        ASSERT_TRUE(x) << ep;
        held.push_back(std::move(x));
    }
    EXPECT_FALSE(b.try_get(1, mb4, greedy));
    // Its other endpoints, holding nothing, still get their first buffer
    // (1 and 2 may be consumers that read slowly and hold the share for
    // long), up to twice the share whatever its connections.
    for (uint64_t ep = 3; ep <= 6; ++ep) {
        Buffer x = b.try_get(ep, mb4, greedy);
        ASSERT_TRUE(x) << ep;
        held.push_back(std::move(x));
    }
    EXPECT_FALSE(b.try_get(3, mb4, greedy));  // no read-ahead over the share
    EXPECT_FALSE(b.try_get(7, mb4, greedy));  // nor a first buffer over twice the share
    EXPECT_EQ(b.stats()["peer_limited_total"], 3);
    // Its waiter does not block the others' grants.
    std::vector<uint64_t> granted;
    std::vector<Buffer> got;
    b.wait(
        8, mb4,
        [&](Buffer x) {
            granted.push_back(8);
            got.push_back(std::move(x));
        },
        greedy);
    b.wait(
        10, mb4,
        [&](Buffer x) {
            granted.push_back(10);
            got.push_back(std::move(x));
        },
        other);
    EXPECT_EQ((std::vector<uint64_t>{10}), granted);
    // One of its own comes back: its waiter gets it.
    held.pop_back();
    EXPECT_EQ((std::vector<uint64_t>{10, 8}), granted);
    // Another peer holding nothing may always have one buffer (here 12 MiB).
    Buffer big = b.try_get(11, 12u << 20, 13);
    EXPECT_TRUE(big);
}

TEST(Config, SizesParse) {
    EXPECT_EQ(parse_size("X", "256M").value(), 256ull << 20);
    EXPECT_EQ(parse_size("X", "1g").value(), 1ull << 30);
    EXPECT_EQ(parse_size("X", "64KiB").value(), 64ull << 10);
    EXPECT_EQ(parse_size("X", "4096").value(), 4096ull);
    for (const char* bad : {"", "-1", "M", "12Q", "1e3", "99999999999999999999G"})
        EXPECT_FALSE(parse_size("DYAD_SERVICE_MEMORY", bad).is_ok()) << bad;
    EXPECT_NE(parse_size("DYAD_SERVICE_MEMORY", "lots")
                  .status()
                  .message()
                  .find("DYAD_SERVICE_MEMORY='lots'"),
              std::string::npos);
}
