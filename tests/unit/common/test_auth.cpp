// SPDX-License-Identifier: Apache-2.0
// The authenticated hello and the store's write rules, over real sockets:
// a server on its own loop thread, the blocking client on the test thread.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/auth.hpp"
#include "kvs/store.hpp"
#include "rpc/client.hpp"
#include "rpc/server.hpp"
#include "rpc/wire.hpp"
#include "server_loop.hpp"

using namespace dyad;

namespace {

std::shared_ptr<const auth::Key> key_a() {
    return auth::Key::from_secret("a-job-key-of-at-least-32-bytes-AAAAAAAA");
}
std::shared_ptr<const auth::Key> key_b() {
    return auth::Key::from_secret("another-job-key-of-32-bytes-BBBBBBBBBB");
}

struct Store {
    kvs::MemoryStore store;
};

// A server with the embedded store and `policy`.
class Keyed : public Store, public test_support::ServerLoop {
  public:
    explicit Keyed(rpc::AuthPolicy policy)
        : test_support::ServerLoop([this, policy](rpc::Server& s) {
              s.set_auth(policy);
              s.set_hello_info({{"service_id", "test"}, {"producer_dir", "/secret/dir"}});
              kvs::serve(s, store);
          }) {}
};

rpc::Credentials creds(std::shared_ptr<const auth::Key> k, std::string role = "client",
                       std::string id = "") {
    rpc::Credentials c;
    c.key = std::move(k);
    c.role = std::move(role);
    c.service_id = std::move(id);
    return c;
}

std::string temp_path(const char* name) {
    return ::testing::TempDir() + "/" + name + "." + std::to_string(::getpid());
}

}  // namespace

TEST(Auth, ProofsAreLabelledAndChecked) {
    auto k = key_a();
    std::string cn = auth::new_nonce(), sn = auth::new_nonce();
    EXPECT_NE(cn, sn);
    EXPECT_TRUE(auth::valid_nonce(cn));
    EXPECT_FALSE(auth::valid_nonce(cn.substr(1)));
    EXPECT_FALSE(auth::valid_nonce(std::string(64, 'g')));
    std::string p = k->proof("dyad client", {cn, sn});
    EXPECT_TRUE(k->verify(p, "dyad client", {cn, sn}));
    EXPECT_FALSE(
        k->verify(p, "dyad service", {cn, sn}));  // one side's proof never passes for the other
    EXPECT_FALSE(k->verify(p, "dyad client", {sn, cn}));
    EXPECT_FALSE(key_b()->verify(p, "dyad client", {cn, sn}));
    EXPECT_FALSE(k->verify(p.substr(2), "dyad client", {cn, sn}));
    EXPECT_FALSE(k->verify(std::string(64, 'z'), "dyad client", {cn, sn}));
    // Parts are length-prefixed: moving bytes from one part to the next is
    // another transcript.
    EXPECT_FALSE(k->verify(p, "dyad client", {cn + sn.substr(0, 1), sn.substr(1)}));
    EXPECT_FALSE(k->verify(p, "dyad client", {cn, sn, ""}));
}

TEST(Auth, FrameTagsFollowTheirSequence) {
    auto k = key_a();
    auth::SessionKey tx = k->derive("dyad client to service", {"hello", "challenge"});
    auth::SessionKey other = k->derive("dyad service to client", {"hello", "challenge"});
    EXPECT_NE(tx, other);
    auth::FrameMac send(tx), recv(tx), wrong_dir(other);
    const uint8_t hdr[24] = {1, 2, 3};
    uint8_t t0[auth::kTagBytes], t1[auth::kTagBytes];
    send.sign(hdr, sizeof hdr, "{\"a\":1}", t0);
    send.sign(hdr, sizeof hdr, "{\"a\":1}", t1);
    EXPECT_NE(0, std::memcmp(t0, t1, sizeof t0));  // the same frame twice: two tags
    EXPECT_FALSE(wrong_dir.check(hdr, sizeof hdr, "{\"a\":1}", t0));
    EXPECT_FALSE(recv.check(hdr, sizeof hdr, "{\"a\":1}", t1));  // out of order
    auth::FrameMac fresh(tx);
    EXPECT_TRUE(fresh.check(hdr, sizeof hdr, "{\"a\":1}", t0));
    EXPECT_FALSE(fresh.check(hdr, sizeof hdr, "{\"a\":2}", t1));  // meta changed
    auth::FrameMac again(tx);
    const uint8_t hdr2[24] = {1, 2, 4};
    EXPECT_FALSE(again.check(hdr2, sizeof hdr2, "{\"a\":1}", t0));  // header changed
}

// A compact answer's tag covers the part of its data its flags name: a
// byte changed there fails it (issue 45).
TEST(Auth, FrameTagsCoverTheDataTheyAreGiven) {
    auth::SessionKey tx = key_a()->derive("dyad service to client", {"hello", "challenge"});
    const uint8_t hdr[24] = {1, 2, 3};
    std::string data(100, 'x');
    uint8_t t[auth::kTagBytes];
    auth::FrameMac send(tx);
    send.sign(hdr, sizeof hdr, "", t, data);
    auth::FrameMac ok(tx), bad(tx), none(tx);
    EXPECT_TRUE(ok.check(hdr, sizeof hdr, "", t, data));
    data[57] ^= 1;
    EXPECT_FALSE(bad.check(hdr, sizeof hdr, "", t, data));
    EXPECT_FALSE(none.check(hdr, sizeof hdr, "", t));  // not without the data
}

TEST(Auth, KeyFilesAreCheckedAndNeverOverwritten) {
    std::string path = temp_path("dyad-key");
    ::unlink(path.c_str());
    ASSERT_TRUE(auth::Key::generate(path).is_ok());
    struct stat sb;
    ASSERT_EQ(::stat(path.c_str(), &sb), 0);
    EXPECT_EQ(sb.st_mode & 0777, 0600u);
    EXPECT_EQ(sb.st_size, 65);  // 64 hex digits and a newline
    auto k = auth::Key::load(path);
    ASSERT_TRUE(k.is_ok()) << k.status().to_string();
    EXPECT_EQ(auth::Key::generate(path).err(), EEXIST);

    ::chmod(path.c_str(), 0644);
    auto loose = auth::Key::load(path);
    ASSERT_FALSE(loose.is_ok());
    EXPECT_EQ(loose.status().rc(), DYAD_RC_NOAUTH);
    EXPECT_NE(loose.status().message().find("chmod 600"), std::string::npos);
    ::unlink(path.c_str());

    std::string shortp = temp_path("dyad-short-key");
    {
        std::ofstream f(shortp);
        f << "too short\n";
    }
    ::chmod(shortp.c_str(), 0600);
    auto s = auth::Key::load(shortp);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.status().message().find("at least 32"), std::string::npos);
    ::unlink(shortp.c_str());
    EXPECT_FALSE(auth::Key::load(temp_path("no-such-key")).is_ok());
}

TEST(Auth, SameKeyAdmitsBothWays) {
    Keyed l({key_a(), {}, false});
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5), creds(key_a()));
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c.value()->peer_info().value("service_id", ""), "test");
    EXPECT_EQ(c.value()->peer_info().value("auth", ""), "hmac-sha256-transcript");
    EXPECT_EQ(c.value()->peer_id(), "test");
    EXPECT_TRUE(c.value()->call("kvs.list", {{"ns", "n"}}, Deadline::after(5)).is_ok());
}

TEST(Auth, WrongOrMissingKeyIsRefusedAndLearnsNothing) {
    Keyed l({key_a(), {}, false});
    auto wrong = rpc::Connection::connect(l.uri, Deadline::after(5), creds(key_b()));
    ASSERT_FALSE(wrong.is_ok());
    EXPECT_EQ(wrong.status().rc(), DYAD_RC_NOAUTH);
    auto none = rpc::Connection::connect(l.uri, Deadline::after(5), creds(nullptr));
    ASSERT_FALSE(none.is_ok());
    EXPECT_EQ(none.status().rc(), DYAD_RC_NOAUTH);
    EXPECT_NE(none.status().message().find("DYAD_AUTH_KEY_FILE"), std::string::npos);
    // The wrong key is caught by the client (the service's proof fails); the
    // missing one by the service, which counts it.
    EXPECT_GE(l.on_loop([&] { return l.server.auth_refused(); }), 1u);
    // Whatever it said, a peer without the key heard nothing about the service.
    EXPECT_EQ(wrong.status().message().find("/secret/dir"), std::string::npos);
}

TEST(Auth, KeyedClientRefusesAServiceWithoutKey) {
    Keyed l({nullptr, {}, false});
    auto c = rpc::Connection::connect(l.uri, Deadline::after(5), creds(key_a()));
    ASSERT_FALSE(c.is_ok());
    EXPECT_EQ(c.status().rc(), DYAD_RC_NOAUTH);
    EXPECT_NE(c.status().message().find("does not authenticate"), std::string::npos);
    // Without a key on either side (loopback only): admitted.
    EXPECT_TRUE(rpc::Connection::connect(l.uri, Deadline::after(5)).is_ok());
}

TEST(Auth, StoreWritesOnlyByServicesForThemselves) {
    Keyed l({key_a(), {}, false});
    auto pool_client = std::make_shared<rpc::ConnectionPool>(creds(key_a()));
    kvs::RpcStore client(l.uri, pool_client);
    std::string rec_a = nlohmann::json{{"owner", "a"}, {"path", "f"}}.dump();
    auto r = client.put("dyad", "k", rec_a, Deadline::after(5));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().rc(), DYAD_RC_NOAUTH);
    EXPECT_EQ(r.status().err(), EPERM);

    kvs::RpcStore a(l.uri, std::make_shared<rpc::ConnectionPool>(creds(key_a(), "service", "a")));
    kvs::RpcStore b(l.uri, std::make_shared<rpc::ConnectionPool>(creds(key_a(), "service", "b")));
    EXPECT_EQ(a.put("dyad", "k", rec_a, Deadline::after(5)).value(), 1u);
    EXPECT_EQ(a.put("dyad", "k", rec_a, Deadline::after(5)).value(), 2u);  // re-produce
    // b may not write a record naming a, nor take a's key with its own record.
    EXPECT_EQ(b.put("dyad", "k2", rec_a, Deadline::after(5)).status().err(), EPERM);
    std::string rec_b = nlohmann::json{{"owner", "b"}, {"path", "f"}}.dump();
    auto clash = b.put("dyad", "k", rec_b, Deadline::after(5));
    ASSERT_FALSE(clash.is_ok());
    EXPECT_EQ(clash.status().err(), EEXIST);
    EXPECT_NE(clash.status().message().find("produced by service 'a'"), std::string::npos);
    // Unless b consumed generation 2 and publishes its change of it; a stale
    // generation is still refused.
    EXPECT_EQ(b.put("dyad", "k", rec_b, Deadline::after(5), 1).status().err(), EEXIST);
    EXPECT_EQ(b.put("dyad", "k", rec_b, Deadline::after(5), 2).value(), 3u);
    EXPECT_EQ(a.put("dyad", "k", rec_a, Deadline::after(5)).status().err(), EEXIST);
    EXPECT_EQ(b.put("dyad", "k", rec_a, Deadline::after(5)).status().err(), EPERM);
    rec_a = rec_b;
    EXPECT_EQ(client.get("dyad", "k", Deadline::after(5)).value().value, rec_a);
    // The registry: each service only its own entry.
    EXPECT_TRUE(a.put(kvs::kServicesNamespace, "a", "{}", Deadline::after(5)).is_ok());
    EXPECT_EQ(b.put(kvs::kServicesNamespace, "a", "{}", Deadline::after(5)).status().err(), EPERM);
    // Not JSON, or no owner: refused.
    EXPECT_EQ(a.put("dyad", "k3", "not json", Deadline::after(5)).status().err(), EPERM);
}

TEST(Auth, UnixPeersMustBeTheSameUserOrRoot) {
    // A socket pair stands for a Unix connection: the server sees our uid,
    // which is its own, so it is admitted; the uid rule itself is exercised
    // by the integration tests with a real other user.
    Keyed l({nullptr, {}, false});
    std::string path = temp_path("dyad-auth.sock");
    ::unlink(path.c_str());
    auto ep = l.on_loop([&] { return l.server.listen_unix(path); });
    ASSERT_TRUE(ep.is_ok()) << ep.status().to_string();
    auto c = rpc::Connection::connect(ep.value(), Deadline::after(5));
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    ::unlink(path.c_str());
}

TEST(Auth, RequestsBeforeTheProofAreRefused) {
    Keyed l({key_a(), {}, false});
    // A raw peer that skips the hello: refused with "authentication required".
    auto u = rpc::parse_uri(l.uri).value();
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(u.port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    rpc::Header h;
    h.type = rpc::Type::request;
    h.tag = 1;
    std::string meta = R"({"topic":"kvs.list","ns":"dyad"})";
    h.meta_len = static_cast<uint32_t>(meta.size());
    uint8_t hdr[rpc::kHeaderSize];
    rpc::encode_header(h, hdr);
    ASSERT_EQ(::write(fd, hdr, sizeof hdr), static_cast<ssize_t>(sizeof hdr));
    ASSERT_EQ(::write(fd, meta.data(), meta.size()), static_cast<ssize_t>(meta.size()));
    std::string got;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
    ::close(fd);
    EXPECT_NE(got.find("authentication required"), std::string::npos) << got;
    EXPECT_EQ(got.find("entries"), std::string::npos);
}
