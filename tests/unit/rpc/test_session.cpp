// SPDX-License-Identifier: Apache-2.0
// A server connection (src/rpc/session*.cpp) seen from a raw socket: what
// a peer that breaks the protocol is answered (one error frame, then the
// close), and the hello's two deadlines.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

#include "common/fd.hpp"
#include "rpc/wire.hpp"
#include "server_loop.hpp"

using namespace dyad;
using dyad::test_support::ServerLoop;

namespace {

UniqueFd connect_raw(const std::string& uri) {
    auto u = rpc::parse_uri(uri);
    EXPECT_TRUE(u.is_ok());
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(u->port);
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    timeval tv{5, 0};  // a broken test fails, never hangs
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    return fd;
}

void send_frame(int fd, rpc::Header h, const std::string& meta, size_t data_len = 0) {
    h.meta_len = static_cast<uint32_t>(meta.size());
    h.data_len = static_cast<uint32_t>(data_len);
    uint8_t hdr[rpc::kHeaderSize];
    rpc::encode_header(h, hdr);
    std::string out(reinterpret_cast<char*>(hdr), sizeof hdr);
    out += meta;
    ASSERT_EQ(::send(fd, out.data(), out.size(), MSG_NOSIGNAL), static_cast<ssize_t>(out.size()));
}

bool read_all(int fd, void* p, size_t n) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
        ssize_t r = ::recv(fd, c, n, 0);
        if (r <= 0) return false;
        c += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

struct Got {
    rpc::Header h;
    nlohmann::json meta;
};

Got read_frame(int fd) {
    Got g;
    uint8_t hdr[rpc::kHeaderSize];
    EXPECT_TRUE(read_all(fd, hdr, sizeof hdr));
    EXPECT_TRUE(rpc::decode_header(hdr, &g.h).is_ok());
    std::string meta(g.h.meta_len, '\0');
    EXPECT_TRUE(read_all(fd, meta.data(), meta.size()));
    g.meta = nlohmann::json::parse(meta, nullptr, false);
    return g;
}

// The server closed the connection: the next read sees the end.
bool closed_by_peer(int fd) {
    char c;
    return ::recv(fd, &c, 1, 0) == 0;
}

rpc::Header hello_header() {
    rpc::Header h;
    h.type = rpc::Type::hello;
    return h;
}

}  // namespace

TEST(Session, HelloDeadlinesOneForEachSide) {
    // A client gives up on a silent service well before a service gives up
    // on a silent client.
    EXPECT_LT(rpc::kHelloAnswerTimeout, rpc::kHelloAdmitTimeout);
}

TEST(Session, ABadHeaderIsAnsweredThenClosed) {
    ServerLoop s([](rpc::Server&) {});
    auto fd = connect_raw(s.uri);
    char junk[rpc::kHeaderSize];
    std::memset(junk, 'x', sizeof junk);
    ASSERT_EQ(::send(fd.get(), junk, sizeof junk, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof junk));
    Got g = read_frame(fd.get());
    EXPECT_EQ(g.h.type, rpc::Type::error);
    EXPECT_EQ(g.h.errnum, EPROTO);
    EXPECT_EQ(g.meta.value("rc", 0), static_cast<int>(DYAD_RC_BADRPC));
    EXPECT_TRUE(closed_by_peer(fd.get()));
}

TEST(Session, TheFirstFrameMustBeAHello) {
    ServerLoop s([](rpc::Server&) {});
    auto fd = connect_raw(s.uri);
    rpc::Header h;
    h.type = rpc::Type::request;
    h.tag = 5;
    send_frame(fd.get(), h, R"({"topic":"x"})");
    Got g = read_frame(fd.get());
    EXPECT_EQ(g.h.type, rpc::Type::error);
    EXPECT_EQ(g.h.tag, 5u);
    EXPECT_EQ(g.meta.value("msg", std::string()), "first frame must be hello");
    EXPECT_TRUE(closed_by_peer(fd.get()));
}

TEST(Session, ClientFramesCarryNoData) {
    ServerLoop s([](rpc::Server&) {});
    auto fd = connect_raw(s.uri);
    send_frame(fd.get(), hello_header(), R"({"version":3})", 10);
    Got g = read_frame(fd.get());
    EXPECT_EQ(g.h.type, rpc::Type::error);
    EXPECT_EQ(g.meta.value("msg", std::string()), "client frames carry no data");
    EXPECT_TRUE(closed_by_peer(fd.get()));
}

TEST(Session, AdmittedThenARequestWithoutATopicIsAProtocolError) {
    ServerLoop s([](rpc::Server&) {});
    auto fd = connect_raw(s.uri);
    send_frame(fd.get(), hello_header(), R"({"version":3,"pid":1,"role":"client"})");
    Got hello = read_frame(fd.get());
    ASSERT_EQ(hello.h.type, rpc::Type::hello);
    EXPECT_EQ(hello.meta.value("service_id", std::string()), "test");
    EXPECT_EQ(hello.meta.value("auth", std::string()), "none");
    rpc::Header h;
    h.type = rpc::Type::request;
    h.tag = 9;
    send_frame(fd.get(), h, R"({"no_topic":1})");
    Got g = read_frame(fd.get());
    EXPECT_EQ(g.h.type, rpc::Type::error);
    EXPECT_EQ(g.h.tag, 9u);
    EXPECT_EQ(g.h.errnum, EPROTO);
    EXPECT_EQ(g.meta.value("msg", std::string()), "request without a topic");
    EXPECT_TRUE(closed_by_peer(fd.get()));
}
