// SPDX-License-Identifier: Apache-2.0
// The UCX_TLS that dyadd's own worker uses toward consumers: the user's
// choice without shared-memory transports (src/dtl/peer_address.hpp).
#include <gtest/gtest.h>

#include "dtl/peer_address.hpp"

using dyad::dtl::ucx_service_tls;

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
