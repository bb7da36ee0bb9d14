// SPDX-License-Identifier: Apache-2.0
// The RPC layer over real sockets, in one process:
// the server loop runs on a thread, the blocking client on the test thread.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

#include "rpc/client.hpp"
#include "rpc/server.hpp"
#include "server_loop.hpp"

using namespace dyad;

namespace {
// Two test topics on a real server.
class Loop : public test_support::ServerLoop {
  public:
    Loop()
        : test_support::ServerLoop([](rpc::Server& server) {
              server.handle("test.stream", [](std::shared_ptr<rpc::Request> r) {
                  int n = r->args().value("n", 0);
                  auto data = std::make_shared<std::string>("chunk");
                  for (int i = 0; i < n; ++i)
                      r->respond({{"i", i}}, asio::buffer(*data), [data](bool) {});
                  r->end({{"count", n}});
              });
              server.handle("test.hang", [](std::shared_ptr<rpc::Request>) {});
          }) {}
};
}  // namespace

TEST(Rpc, HelloCarriesServerInfo) {
    Loop l;
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5));
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c.value()->peer_info()["service_id"], "test");
}

TEST(Rpc, StreamingResponsesEndInOrder) {
    Loop l;
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5)).value();
    auto tag = c->send_request("test.stream", {{"n", 5}}, Deadline::after(5));
    ASSERT_TRUE(tag.is_ok());
    int seen = 0;
    for (;;) {
        auto f = c->read_frame(Deadline::after(5));
        ASSERT_TRUE(f.is_ok());
        std::string d(f->header.data_len, '\0');
        ASSERT_TRUE(c->read_data(d.data(), d.size(), Deadline::after(5)).is_ok());
        if (f->header.type == rpc::Type::end) {
            EXPECT_EQ(f->meta["count"], 5);
            break;
        }
        ASSERT_EQ(f->header.type, rpc::Type::response);
        EXPECT_EQ(f->meta["i"], seen++);
        EXPECT_EQ(d, "chunk");
    }
    EXPECT_EQ(seen, 5);
}

TEST(Rpc, UnknownTopicIsAnError) {
    Loop l;
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5)).value();
    auto r = c->call("no.such.topic", {}, Deadline::after(5));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().err(), ENOSYS);
}

TEST(Rpc, ServiceEnforcesTheRequestDeadline) {
    Loop l;
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5)).value();
    auto t0 = std::chrono::steady_clock::now();
    auto r = c->call("test.hang", {}, Deadline::after(0.3), 5.0);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().rc(), DYAD_RC_TIMEOUT);
    EXPECT_LT(dt, 3.0);
}
