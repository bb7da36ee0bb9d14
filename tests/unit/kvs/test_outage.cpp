// SPDX-License-Identifier: Apache-2.0
// Whether the metadata store answers (kvs::Outage): the outage and the
// recovery, counted once each; the error requests get while it is down; and
// a consumer's wait on a store that is unreachable from its start.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "kvs/outage.hpp"
#include "kvs/store.hpp"

using namespace dyad;

namespace {
// A loopback port nothing listens on (bound, then closed).
int closed_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0)
        port = ntohs(a.sin_port);
    ::close(fd);
    return port;
}
}  // namespace

TEST(Outage, CountsOutagesOnceAndErrorsEach) {
    kvs::Outage o("etcd://10.0.0.9:2379");
    EXPECT_TRUE(o.up());
    o.answered();
    o.failed("watch stream broke");
    o.failed("lease keep-alive stream broke");
    EXPECT_FALSE(o.up());
    auto v = o.view();
    EXPECT_EQ(v.errors, 2u);
    EXPECT_EQ(v.outages, 1u);
    EXPECT_EQ(v.error, "lease keep-alive stream broke");
    EXPECT_FALSE(v.since.empty());
    uint64_t asked = 0;
    o.answered([&] { return ++asked; });
    o.answered([&] { return ++asked; });
    EXPECT_EQ(asked, 1u);  // the recovery is said once
    EXPECT_TRUE(o.up());
    o.failed("again");
    EXPECT_EQ(o.view().outages, 2u);
}

TEST(Outage, TheErrorNamesTheStoreAndIsRecognized) {
    kvs::Outage o("etcd://10.0.0.9:2379");
    o.failed("Socket closed");
    Status s = o.unreachable_status();
    EXPECT_EQ(s.rc(), DYAD_RC_CONNFAIL);
    EXPECT_EQ(s.err(), EHOSTUNREACH);
    EXPECT_NE(s.message().find("the metadata store at etcd://10.0.0.9:2379 is unreachable since "),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("Socket closed"), std::string::npos);
    EXPECT_TRUE(kvs::Outage::unreachable(s));
    EXPECT_NE(o.health_text().find("degraded: metadata store at etcd://10.0.0.9:2379 unreachable"),
              std::string::npos);
    // A connection refused by the service itself is another failure.
    EXPECT_FALSE(kvs::Outage::unreachable(
        Status(DYAD_RC_CONNFAIL, "connect to tcp://h:1 failed: No route to host", EHOSTUNREACH)));
    nlohmann::json j;
    o.describe(j);
    EXPECT_EQ(j["reachable"], false);
    EXPECT_EQ(j["store_outages"], 1);
    EXPECT_TRUE(j.contains("unreachable_since"));
}

// A store whose address nothing listens on: a wait with a deadline tries
// until it and says so; one without a deadline is told at once.
TEST(Outage, WaitForAStoreDownAtTheStart) {
    const int port = closed_port();
    ASSERT_NE(port, 0);
    auto pool = std::make_shared<rpc::ConnectionPool>(rpc::Credentials{});
    kvs::RpcStore store("tcp://127.0.0.1:" + std::to_string(port), pool);
    auto r = store.wait("ns", "k", Deadline::after(0.5));
    ASSERT_FALSE(static_cast<bool>(r));
    EXPECT_EQ(r.status().rc(), DYAD_RC_CONNFAIL) << r.status().to_string();
    EXPECT_NE(r.status().message().find("DYAD retried until the wait's deadline"),
              std::string::npos)
        << r.status().message();
    auto now = store.wait("ns", "k", Deadline::never());
    ASSERT_FALSE(static_cast<bool>(now));
    EXPECT_EQ(now.status().rc(), DYAD_RC_CONNFAIL);
    EXPECT_EQ(now.status().message().find("retried"), std::string::npos);
}
