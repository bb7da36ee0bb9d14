// SPDX-License-Identifier: Apache-2.0
// The UCX_TLS that dyadd's own worker uses toward consumers: the user's
// choice without shared-memory transports (src/dtl/peer_address.hpp).
#include <gtest/gtest.h>

#include "dtl/peer_address.hpp"

using dyad::dtl::add_ucx_tcp_layouts;
using dyad::dtl::kUcxTcpNameCsum;
using dyad::dtl::ucx_address_fits;
using dyad::dtl::ucx_service_tls;
using dyad::dtl::ucx_tls_may_use_tcp;
using dyad::dtl::UcxAddressInfo;

TEST(UcxServiceTls, UnsetOrAllExcludesSharedMemory) {
    EXPECT_EQ(ucx_service_tls(nullptr).value(), "^sm");
    EXPECT_EQ(ucx_service_tls("").value(), "^sm");
    EXPECT_EQ(ucx_service_tls("all").value(), "^sm");
}

TEST(UcxServiceTls, ListsLoseTheirSharedMemoryNames) {
    EXPECT_EQ(ucx_service_tls("tcp").value(), "tcp");
    EXPECT_EQ(ucx_service_tls("sm,tcp,self").value(), "tcp,self");
    EXPECT_EQ(ucx_service_tls("posix,sysv,cma,rc,knem,xpmem,shm").value(), "rc");
    EXPECT_EQ(ucx_service_tls("cma:aux,tcp:aux").value(), "tcp:aux");
}

TEST(UcxServiceTls, ExclusionsGainSharedMemory) {
    EXPECT_EQ(ucx_service_tls("^ud").value(), "^ud,sm");
    EXPECT_EQ(ucx_service_tls("^").value(), "^sm");
}

TEST(UcxServiceTls, OnlySharedMemoryIsAClearError) {
    EXPECT_FALSE(ucx_service_tls("sm,self"));  // self reaches no other process
    auto e = ucx_service_tls("posix,cma");
    ASSERT_FALSE(e);
    EXPECT_NE(e.status().message().find("only shared-memory transports"), std::string::npos);
}

namespace {

// A packed key as UCX 1.13 lays it out: MD map, memory type, then a size
// byte and that many bytes per bit of the map.
std::string packed_key(uint64_t md_map, uint8_t mem_type, const std::vector<size_t>& sizes) {
    std::string k(reinterpret_cast<const char*>(&md_map), 8);
    k += static_cast<char>(mem_type);
    for (size_t n : sizes) {
        k += static_cast<char>(n);
        k += std::string(n, '\x5a');
    }
    return k;
}

}  // namespace

TEST(UcxRkey, KeysAsUcxPacksThemPass) {
    auto k = dyad::dtl::parse_ucx_rkey(packed_key(0x5, 0, {0, 16}));
    ASSERT_TRUE(k) << k.status().message();
    EXPECT_EQ(k->keys, 2u);
    EXPECT_EQ(k->key_bytes, 8u + 1 + 1 + 1 + 16);
    // A system device and two distances after the keys.
    EXPECT_TRUE(dyad::dtl::parse_ucx_rkey(packed_key(0x1, 0, {0}) + "\x03" + std::string(6, '\1')));
}

TEST(UcxRkey, MalformedKeysAreRefusedWithWhereAndWhat) {
    auto refused = [](const std::string& blob, const std::string& what) {
        auto k = dyad::dtl::parse_ucx_rkey(blob);
        ASSERT_FALSE(k) << what;
        EXPECT_EQ(k.status().rc(), DYAD_RC_UCXRKEY_UNPACK_FAILED);
        EXPECT_NE(k.status().message().find(what), std::string::npos) << k.status().message();
    };
    refused("", "shorter than its MD map");
    refused(std::string(7, '\1'), "shorter than its MD map");
    refused(std::string(8, '\1'), "no memory type");
    refused(packed_key(0, 0, {}), "no memory domain");
    refused(packed_key(0x1, 1, {0}), "memory type 1 is not host memory");
    std::string cut = packed_key(0x3, 0, {0, 40});
    refused(cut.substr(0, cut.size() - 1), "the key of MD 1 ends past the blob");
    refused(packed_key(0x3, 0, {0}), "the key of MD 1 ends past the blob");
    // Every bit of the map set, none of the keys there.
    refused(packed_key(~0ull, 0, {}), "the key of MD 0 ends past the blob");
    refused(packed_key(0x1, 0, {0}) + "\x03" + std::string(4, '\1'), "not a multiple of 3");
    refused(packed_key(0x1, 0, {0}) + std::string(20000, '\0'), "longer than any packed key");
}

// DYAD tunes UCX's TCP transport only where UCX_TLS leaves it in (UCX warns,
// on the consumer's stdout, of settings no transport took).
TEST(UcxTlsMayUseTcp, FollowsListsAndExclusions) {
    EXPECT_TRUE(ucx_tls_may_use_tcp(""));
    EXPECT_TRUE(ucx_tls_may_use_tcp("all"));
    EXPECT_TRUE(ucx_tls_may_use_tcp("tcp"));
    EXPECT_TRUE(ucx_tls_may_use_tcp("self,tcp:aux"));
    EXPECT_TRUE(ucx_tls_may_use_tcp("^sm"));
    EXPECT_FALSE(ucx_tls_may_use_tcp("^tcp,ud"));
    EXPECT_FALSE(ucx_tls_may_use_tcp("posix,self"));
    EXPECT_FALSE(ucx_tls_may_use_tcp("tcpx"));
}

// A service whose UCX worker has TCP on loopback only accepts a consumer's
// TCP entries of its other interfaces (UCX 1.13's lengths), nothing else.
TEST(UcxTcpLayouts, AddedOnlyForTcpAndOnlyUcxLengths) {
    UcxAddressInfo own;
    own.entries.push_back({kUcxTcpNameCsum, 0, 0, 14, 2});  // tcp on lo
    own.entries.push_back({1234, 1, 1, 3, 5});              // another transport
    add_ucx_tcp_layouts(&own);
    UcxAddressInfo peer;
    peer.entries.push_back({kUcxTcpNameCsum, 0, 0, 6, 2});  // tcp on eth0
    EXPECT_TRUE(ucx_address_fits(peer, own));
    peer.entries[0].dev_addr_len = 18;  // IPv6
    EXPECT_TRUE(ucx_address_fits(peer, own));
    peer.entries[0].dev_addr_len = 7;
    EXPECT_FALSE(ucx_address_fits(peer, own));
    peer.entries[0] = {1234, 1, 1, 6, 5};  // other transports keep their own lengths
    EXPECT_FALSE(ucx_address_fits(peer, own));
}
