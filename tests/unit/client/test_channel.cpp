// SPDX-License-Identifier: Apache-2.0
// The fetch channel (consumer side, over a real rpc server on a socket), the
// acknowledgement window, and the chunked send pipeline (through a
// recording SendChannel on a real event loop and a real file).
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "client/fetch_channel.hpp"
#include "common/checksum.hpp"
#include "dtl/chunked.hpp"
#include "dtl/dtl.hpp"
#include "dtl/write_behind.hpp"
#include "rpc/client.hpp"
#include "rpc/server.hpp"
#include "server_loop.hpp"

using namespace dyad;
using Kind = dtl::FetchChannel::Kind;

namespace {

// A dyad.fetch handler that plays the script in the request's "script":
// {"answer": meta, "data": text} (a response frame), {"end": meta},
// {"error": msg, "errno": n, "rc": rc}, {"echo_updates": n} (answers each of
// the next n updates with a response carrying it), {"hang": true}.
void play(std::shared_ptr<rpc::Request> r, size_t from) {
    const auto& script = r->args()["script"];
    for (size_t i = from; i < script.size(); ++i) {
        const auto& step = script[i];
        if (step.contains("answer")) {
            auto data = std::make_shared<std::string>(step.value("data", std::string()));
            r->respond(step["answer"], asio::buffer(*data), [data](bool) {});
        } else if (step.contains("end")) {
            r->end(step["end"]);
        } else if (step.contains("error")) {
            r->error(step.value("errno", EIO), step["error"].get<std::string>(),
                     static_cast<dyad_rc_t>(step.value("rc", static_cast<int>(DYAD_RC_BADFETCH))));
        } else if (step.contains("echo_updates")) {
            auto left = std::make_shared<int>(step["echo_updates"].get<int>());
            std::weak_ptr<rpc::Request> weak = r;
            r->on_update([weak, left, i](const nlohmann::json& m) {
                auto self = weak.lock();
                if (!self) return;
                self->respond({{"echo", m}});
                if (--*left == 0) play(self, i + 1);
            });
            return;
        } else if (step.contains("hang")) {
            return;
        }
    }
}

// A service whose dyad.fetch plays the request's script.
class Service : public test_support::ServerLoop {
  public:
    Service()
        : test_support::ServerLoop([](rpc::Server& server) {
              server.handle("dyad.fetch", [](std::shared_ptr<rpc::Request> r) { play(r, 0); });
          }) {}
    std::unique_ptr<rpc::Connection> connect() {
        return rpc::Connection::connect(uri, Deadline::after(5)).value();
    }
};

// A connection to `svc` and a fetch channel on it, opened with `steps`.
struct Fetch {
    std::unique_ptr<rpc::Connection> conn;
    std::unique_ptr<client::RpcFetchChannel> ch;
    Fetch(Service& svc, const nlohmann::json& steps, double idle_s = 5)
        : conn(svc.connect()), ch(std::make_unique<client::RpcFetchChannel>(*conn, idle_s)) {
        EXPECT_TRUE(ch->open(steps, Deadline::after(5)).is_ok());
    }
};

nlohmann::json script(std::initializer_list<nlohmann::json> steps) {
    return {{"script", nlohmann::json::array_t(steps)}};
}

std::string read_all(dtl::FetchChannel& ch, const dtl::FetchChannel::Message& m) {
    std::string s(m.data_len, '\0');
    EXPECT_TRUE(ch.read(s.data(), s.size()).is_ok());
    return s;
}

}  // namespace

TEST(FetchChannel, AnswerDataAndEndInOrder) {
    Service svc;
    Fetch f(svc, script({{{"answer", {{"size", 10}}}, {"data", "hello"}},
                         {{"answer", nullptr}, {"data", "world"}},
                         {{"end", {{"size", 10}, {"xxh3", "x"}}}}}));
    auto& ch = *f.ch;
    auto a = ch.first("test");
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    EXPECT_EQ(a->kind, Kind::answer);
    EXPECT_EQ(a->meta["size"], 10);
    EXPECT_EQ(read_all(ch, a.value()), "hello");
    auto d = ch.next();
    ASSERT_TRUE(d.is_ok());
    EXPECT_EQ(d->kind, Kind::data);
    EXPECT_TRUE(d->meta.is_object());  // null meta reads as {}
    EXPECT_EQ(read_all(ch, d.value()), "world");
    auto e = ch.end("test");
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    EXPECT_EQ((*e)["size"], 10);
    EXPECT_TRUE(ch.ended());
    // Nothing after the end.
    auto past = ch.next();
    ASSERT_FALSE(past.is_ok());
    EXPECT_EQ(past.status().rc(), DYAD_RC_BADRPC);
}

TEST(FetchChannel, UnreadDataIsSkipped) {
    Service svc;
    Fetch f(svc, script({{{"answer", {{"n", 1}}}, {"data", std::string(100000, 'a')}},
                         {{"answer", {{"n", 2}}}, {"data", "b"}},
                         {{"end", {{"size", 0}, {"xxh3", ""}}}}}));
    auto& ch = *f.ch;
    ASSERT_EQ(ch.next()->meta["n"], 1);
    auto m = ch.next();  // the first message's bytes were never read
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_EQ(m->meta["n"], 2);
    EXPECT_EQ(read_all(ch, m.value()), "b");
    std::string more(1, '\0');
    EXPECT_FALSE(ch.read(more.data(), 1).is_ok());  // no more than the message has
    EXPECT_EQ(ch.next()->kind, Kind::end);
}

TEST(FetchChannel, ErrorFramesBecomeTheirStatus) {
    Service svc;
    for (bool after_answer : {false, true}) {
        nlohmann::json err = {{"error", "no file 'x' in producer directory"},
                              {"errno", ENOENT},
                              {"rc", static_cast<int>(DYAD_RC_BADFIO)}};
        auto s = after_answer ? script({{{"answer", {{"size", 3}}}}, err}) : script({err});
        Fetch f(svc, s);
        auto& ch = *f.ch;
        if (after_answer) {
            ASSERT_TRUE(ch.first("test").is_ok());
        }
        auto m = ch.next();
        ASSERT_FALSE(m.is_ok());
        EXPECT_EQ(m.status().rc(), DYAD_RC_BADFIO);
        EXPECT_EQ(m.status().err(), ENOENT);
        EXPECT_NE(m.status().message().find("no file 'x'"), std::string::npos);
    }
}

TEST(FetchChannel, FirstMustBeAnAnswer) {
    Service svc;
    Fetch f(svc, script({{{"end", {{"size", 0}}}}}));
    auto& ch = *f.ch;
    auto m = ch.first("test");
    ASSERT_FALSE(m.is_ok());
    EXPECT_EQ(m.status().rc(), DYAD_RC_BADRPC);
}

TEST(FetchChannel, MetaThatIsNotAnObjectIsRefused) {
    Service svc;
    Fetch f(svc, script({{{"answer", nlohmann::json::array({1, 2})}}}));
    auto& ch = *f.ch;
    auto m = ch.next();
    ASSERT_FALSE(m.is_ok());
    EXPECT_EQ(m.status().rc(), DYAD_RC_BADRPC);
}

TEST(FetchChannel, IdleDeadline) {
    Service svc;
    Fetch f(svc, script({{{"answer", {{"size", 1}}}}, {{"hang", true}}}), 0.3);
    auto& ch = *f.ch;
    ASSERT_TRUE(ch.first("test").is_ok());
    auto t0 = std::chrono::steady_clock::now();
    auto m = ch.next();
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(m.is_ok());
    EXPECT_EQ(m.status().rc(), DYAD_RC_TIMEOUT);
    EXPECT_GE(waited, 0.25);
}

TEST(FetchChannel, FramesOfOtherRequestsAreSkipped) {
    Service svc;
    auto c = svc.connect();
    // Another request on the same connection, whose answer arrives first.
    auto other = c->send_request(
        "dyad.fetch",
        script({{{"answer", {{"other", true}}}, {"data", "zzz"}}, {{"end", {{"other", true}}}}}),
        Deadline::after(5));
    ASSERT_TRUE(other.is_ok());
    client::RpcFetchChannel ch(*c, 5);
    ASSERT_TRUE(ch.open(script({{{"answer", {{"mine", true}}}}, {{"end", {{"mine", true}}}}}),
                        Deadline::after(5))
                    .is_ok());
    auto a = ch.next();
    ASSERT_TRUE(a.is_ok());
    EXPECT_TRUE(a->meta.contains("mine"));
    auto e = ch.next();
    ASSERT_TRUE(e.is_ok());
    EXPECT_EQ(e->kind, Kind::end);
    EXPECT_TRUE(e->meta.contains("mine"));
}

TEST(FetchChannel, UpdatesReachTheService) {
    Service svc;
    Fetch f(svc, script({{{"answer", {{"size", 0}}}},
                         {{"echo_updates", 2}},
                         {{"end", {{"size", 0}, {"xxh3", ""}}}}}));
    auto& ch = *f.ch;
    ASSERT_TRUE(ch.first("test").is_ok());
    for (uint64_t seq : {7u, 8u}) {
        ASSERT_TRUE(ch.ack(seq).is_ok());
        auto m = ch.next();
        ASSERT_TRUE(m.is_ok()) << m.status().to_string();
        EXPECT_EQ(m->meta["echo"]["ack"], seq);
    }
    EXPECT_EQ(ch.next()->kind, Kind::end);
}

TEST(FetchChannel, TrailerChecks) {
    client::Received got{5, "abc", false};
    EXPECT_TRUE(client::verify_trailer({{"size", 5}, {"xxh3", "abc"}}, got, "f").is_ok());
    auto bad = client::verify_trailer({{"size", 5}, {"xxh3", "abd"}}, got, "f");
    EXPECT_EQ(bad.rc(), DYAD_RC_BADCHECKSUM);
    EXPECT_EQ(client::verify_trailer({{"size", 6}, {"xxh3", "abc"}}, got, "f").rc(),
              DYAD_RC_BADCHECKSUM);
    EXPECT_EQ(client::verify_trailer({{"size", "5"}, {"xxh3", "abc"}}, got, "f").rc(),
              DYAD_RC_BADRPC);
    EXPECT_EQ(client::verify_trailer(nlohmann::json::object(), got, "f").rc(), DYAD_RC_BADRPC);
    // An in-kernel copy has no hash: only its size is checked.
    client::Received kernel{5, "", true};
    EXPECT_TRUE(client::verify_trailer({{"size", 5}, {"xxh3", ""}}, kernel, "f").is_ok());
}

// ---- the acknowledgement window ----

TEST(AckWindow, BoundsOutstandingChunksAndIgnoresBogusAcks) {
    dtl::AckWindow<int> w(3);
    EXPECT_EQ(w.push(10), 0u);
    EXPECT_EQ(w.push(11), 1u);
    EXPECT_EQ(w.push(12), 2u);
    EXPECT_TRUE(w.full());
    // Out of order.
    EXPECT_EQ(w.ack({{"ack", 1}}), 11);
    EXPECT_FALSE(w.full());
    EXPECT_EQ(w.push(13), 3u);
    // Twice, unknown, malformed: ignored and counted.
    EXPECT_FALSE(w.ack({{"ack", 1}}));
    EXPECT_FALSE(w.ack({{"ack", 99}}));
    EXPECT_FALSE(w.ack({{"ack", "0"}}));
    EXPECT_FALSE(w.ack(nlohmann::json::array()));
    EXPECT_EQ(w.bogus(), 4u);
    EXPECT_EQ(w.ack({{"ack", 0}}), 10);
    EXPECT_EQ(w.outstanding(), 2u);
    std::vector<int> left;
    w.drain([&](int v) { left.push_back(v); });
    EXPECT_EQ(left, (std::vector<int>{12, 13}));
    EXPECT_EQ(w.outstanding(), 0u);
    EXPECT_EQ(w.next_seq(), 4u);  // numbering goes on after a drain
}

// ---- the chunked send pipeline ----

namespace {

// Records what a transfer sends; write completions are released by the test.
class RecordingChannel : public dtl::SendChannel {
  public:
    explicit RecordingChannel(asio::io_context& io) : io_(io) {}
    asio::io_context& io() override { return io_; }
    void send(nlohmann::json meta, asio::const_buffer data, WriteDone done) override {
        metas.push_back(meta);
        bytes.append(static_cast<const char*>(data.data()), data.size());
        if (done) pending.push_back(std::move(done));
        max_pending = std::max(max_pending, pending.size());
    }
    void send_file(nlohmann::json, int, uint64_t, size_t, WriteDone done) override { done(false); }
    void on_cancel(std::function<void()> fn) override { cancel = std::move(fn); }
    void on_update(std::function<void(const nlohmann::json&)>) override {}
    void close() override { closed = true; }
    bool can_send_fd() const override { return false; }
    void send_fd(nlohmann::json, int, WriteDone done) override { done(false); }

    std::vector<nlohmann::json> metas;
    std::string bytes;
    std::deque<WriteDone> pending;
    size_t max_pending = 0;
    std::function<void()> cancel;
    bool closed = false;

  private:
    asio::io_context& io_;
};

class TestTransfer : public dtl::ChunkedTransfer {
  public:
    using ChunkedTransfer::ChunkedTransfer;

  protected:
    void write_chunk(const char* p, size_t n, nlohmann::json meta,
                     std::function<void(bool)> done) override {
        job().ch->send(std::move(meta), asio::buffer(p, n), std::move(done));
    }
    bool inline_first_chunk() const override { return true; }
    nlohmann::json first_meta() const override { return {{"size", job().size}}; }
};

struct Pipeline {
    asio::io_context io;
    asio::thread_pool files{1};
    std::shared_ptr<RecordingChannel> ch = std::make_shared<RecordingChannel>(io);
    std::string content;
    std::string path;
    bool finished = false;
    Status result;
    uint64_t sent = 0;
    std::string hash;

    explicit Pipeline(size_t size) {
        char tmpl[] = "/tmp/dyad-chunked-XXXXXX";
        int fd = mkstemp(tmpl);
        path = tmpl;
        content.resize(size);
        for (size_t i = 0; i < size; ++i) content[i] = static_cast<char>(i * 131 % 251);
        EXPECT_EQ(write(fd, content.data(), size), static_cast<ssize_t>(size));
        close(fd);
    }
    ~Pipeline() {
        // Callbacks the channel still holds keep the transfer alive.
        ch->cancel = nullptr;
        ch->pending.clear();
        files.join();
        unlink(path.c_str());
    }
    std::shared_ptr<TestTransfer> start(size_t chunk, int depth, double idle_s = 60) {
        auto job = std::make_shared<dtl::FetchJob>();
        job->ch = ch;
        job->fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        job->size = content.size();
        job->upath = "f";
        job->file_pool = &files;
        job->idle_timeout_s = idle_s;
        auto t = std::make_shared<TestTransfer>(
            job,
            [this](Status st, uint64_t n, std::string h) {
                finished = true;
                result = st;
                sent = n;
                hash = h;
            },
            chunk, depth);
        t->start();
        return t;
    }
    // Runs the loop until `pred` or a few seconds pass.
    template <class P>
    bool run_until(P pred) {
        auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!pred() && std::chrono::steady_clock::now() < end) {
            io.restart();
            io.run_for(std::chrono::milliseconds(5));
        }
        return pred();
    }
};

}  // namespace

TEST(ChunkedTransfer, SendsEveryByteInOrderWithinItsDepth) {
    Pipeline p(3 * 4096 + 100);
    p.start(4096, 2);
    // The consumer is slow: completions come one at a time, late.
    while (!p.finished) {
        ASSERT_TRUE(p.run_until([&] { return p.finished || !p.ch->pending.empty(); }));
        if (p.finished) break;
        EXPECT_LE(p.ch->pending.size(), 2u);  // never more than `depth` chunks out
        auto done = std::move(p.ch->pending.front());
        p.ch->pending.pop_front();
        done(true);
    }
    ASSERT_TRUE(p.result.is_ok()) << p.result.to_string();
    EXPECT_EQ(p.sent, p.content.size());
    EXPECT_EQ(p.ch->bytes, p.content);
    EXPECT_EQ(p.ch->max_pending, 2u);
    Xxh3 h;
    h.update(p.content.data(), p.content.size());
    EXPECT_EQ(p.hash, h.hex());
    EXPECT_EQ(p.ch->metas.front()["size"], p.content.size());  // first chunk carries the size
}

TEST(ChunkedTransfer, ALostConsumerFailsTheTransfer) {
    Pipeline p(10 * 4096);
    p.start(4096, 4);
    ASSERT_TRUE(p.run_until([&] { return !p.ch->pending.empty(); }));
    ASSERT_TRUE(p.ch->cancel);
    p.ch->cancel();  // the consumer went away
    for (auto& d : p.ch->pending) d(false);
    p.ch->pending.clear();
    ASSERT_TRUE(p.run_until([&] { return p.finished; }));
    EXPECT_EQ(p.result.rc(), DYAD_RC_BADFETCH);
    EXPECT_LT(p.ch->bytes.size(), p.content.size());
}

TEST(ChunkedTransfer, AConsumerThatStopsReadingTimesOut) {
    Pipeline p(10 * 4096);
    p.start(4096, 2, 0.2);
    // Completions never come.
    ASSERT_TRUE(p.run_until([&] { return p.finished; }));
    EXPECT_EQ(p.result.rc(), DYAD_RC_TIMEOUT);
    EXPECT_TRUE(p.ch->closed);  // the connection is dropped
    for (auto& d : p.ch->pending) d(false);
}

TEST(ChunkedTransfer, AFileThatShrinksIsAnError) {
    Pipeline p(8 * 4096);
    ASSERT_EQ(truncate(p.path.c_str(), 4096), 0);  // after its size was taken
    p.start(4096, 2);
    ASSERT_TRUE(p.run_until([&] {
        while (!p.ch->pending.empty()) {
            auto d = std::move(p.ch->pending.front());
            p.ch->pending.pop_front();
            d(true);
        }
        return p.finished;
    }));
    EXPECT_EQ(p.result.rc(), DYAD_RC_BADFIO);
    EXPECT_NE(p.result.message().find("shrank"), std::string::npos);
}

TEST(AckWindow, InOrderWindowsRefuseAcknowledgementsOutOfOrder) {
    // A ring of slots: chunk k + capacity reuses chunk k's slot, so chunk
    // k + 1's acknowledgement must not free a place before chunk k's.
    dtl::AckWindow<int> w(2, /*in_order=*/true);
    w.push(0);
    w.push(1);
    EXPECT_FALSE(w.ack({{"ack", 1}}));
    EXPECT_TRUE(w.full());
    EXPECT_EQ(w.oldest_seq(), 0u);
    EXPECT_EQ(w.ack({{"ack", 0}}), 0);
    EXPECT_EQ(w.ack({{"ack", 1}}), 1);
    EXPECT_EQ(w.bogus(), 1u);
}

// ---- passing the open file (SCM_RIGHTS, LOCAL) ----

namespace {

// A temporary directory (for a socket) holding one file of known content.
struct TempDir {
    std::string dir;
    std::string file;
    std::string content;
    TempDir() {
        char tmpl[] = "/tmp/dyad-fd-XXXXXX";
        dir = mkdtemp(tmpl);
        file = dir + "/data.bin";
        content.resize(100000);
        for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 7 % 253);
        int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        EXPECT_EQ(::write(fd, content.data(), content.size()),
                  static_cast<ssize_t>(content.size()));
        ::close(fd);
    }
    ~TempDir() {
        ::unlink(file.c_str());
        ::unlink((dir + "/s.sock").c_str());
        ::rmdir(dir.c_str());
    }
};

size_t open_fds() {
    size_t n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (::readdir(d)) ++n;
        ::closedir(d);
    }
    return n;
}

// dyad.fetch answered, if the request asks ("pass"), with its "file" passed
// by respond_with_fd, then a plain answer {"after": true}, then the end.
// Records whether the request came over a Unix socket and how the
// descriptor's write ended.
class FdService : public test_support::ServerLoop {
  public:
    explicit FdService(const std::string& sock)
        : test_support::ServerLoop(
              [this](rpc::Server& server) {
                  server.handle("dyad.fetch",
                                [this](std::shared_ptr<rpc::Request> r) { serve(r); });
              },
              sock) {}
    std::atomic<int> over_unix{-1};
    std::atomic<int> sent_ok{-1};

  private:
    void serve(const std::shared_ptr<rpc::Request>& r) {
        over_unix = r->over_unix() ? 1 : 0;
        const auto& a = r->args();
        if (a.value("pass", false)) {
            int fd = ::open(a["file"].get<std::string>().c_str(), O_RDONLY | O_CLOEXEC);
            nlohmann::json meta = {{"with_fd", true}};
            if (a.contains("pad")) meta["pad"] = std::string(a["pad"].get<size_t>(), 'p');
            r->respond_with_fd(meta, fd, [this](bool ok) { sent_ok = ok ? 1 : 0; });
            ::close(fd);  // the request keeps its own duplicate
        }
        r->respond({{"after", true}});
        r->end({{"size", 0}, {"xxh3", ""}});
    }
};

}  // namespace

TEST(FdPassing, UnixAnswerCarriesTheOpenFile) {
    TempDir t;
    size_t before = open_fds();
    {
        FdService svc(t.dir + "/s.sock");
        auto conn = rpc::Connection::connect(svc.unix_uri, Deadline::after(5)).value();
        EXPECT_TRUE(conn->over_unix());
        client::RpcFetchChannel ch(*conn, 5);
        ASSERT_TRUE(ch.open({{"pass", true}, {"file", t.file}}, Deadline::after(5)).is_ok());
        auto a = ch.first("test");
        ASSERT_TRUE(a.is_ok()) << a.status().to_string();
        EXPECT_EQ(a->meta, nlohmann::json({{"with_fd", true}}));
        UniqueFd fd = ch.take_fd();
        ASSERT_TRUE(fd.valid());
        EXPECT_FALSE(ch.take_fd().valid());  // once
        // The very file the service opened, read-only, close-on-exec.
        struct stat want, got;
        ASSERT_EQ(::stat(t.file.c_str(), &want), 0);
        ASSERT_EQ(::fstat(fd.get(), &got), 0);
        EXPECT_EQ(got.st_dev, want.st_dev);
        EXPECT_EQ(got.st_ino, want.st_ino);
        EXPECT_EQ(static_cast<size_t>(got.st_size), t.content.size());
        EXPECT_EQ(::fcntl(fd.get(), F_GETFL) & O_ACCMODE, O_RDONLY);
        EXPECT_TRUE(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC);
        std::string back(t.content.size(), '\0');
        EXPECT_EQ(::pread(fd.get(), back.data(), back.size(), 0),
                  static_cast<ssize_t>(back.size()));
        EXPECT_EQ(back, t.content);
        // The next frame carries none.
        auto next = ch.next();
        ASSERT_TRUE(next.is_ok());
        EXPECT_EQ(next->meta["after"], true);
        EXPECT_FALSE(ch.take_fd().valid());
        EXPECT_FALSE(conn->take_fd().valid());
        ASSERT_TRUE(ch.end("test").is_ok());
        EXPECT_EQ(svc.over_unix, 1);
        EXPECT_EQ(svc.sent_ok, 1);
    }
    EXPECT_EQ(open_fds(), before);  // every copy of the descriptor closed
}

TEST(FdPassing, AFrameLargerThanTheSocketBufferIsWrittenInParts) {
    TempDir t;
    FdService svc(t.dir + "/s.sock");
    auto conn = rpc::Connection::connect(svc.unix_uri, Deadline::after(5)).value();
    client::RpcFetchChannel ch(*conn, 5);
    const size_t pad = 900000;  // over the socket's buffer: sendmsg takes part, then EAGAIN
    ASSERT_TRUE(
        ch.open({{"pass", true}, {"file", t.file}, {"pad", pad}}, Deadline::after(5)).is_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the socket fills up
    auto a = ch.first("test");
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    EXPECT_EQ(a->meta["pad"].get<std::string>().size(), pad);
    UniqueFd fd = ch.take_fd();
    ASSERT_TRUE(fd.valid());
    struct stat want, got;
    ASSERT_EQ(::stat(t.file.c_str(), &want), 0);
    ASSERT_EQ(::fstat(fd.get(), &got), 0);
    EXPECT_EQ(got.st_ino, want.st_ino);
    EXPECT_EQ(ch.next()->meta["after"], true);
    ASSERT_TRUE(ch.end("test").is_ok());
    EXPECT_EQ(svc.sent_ok, 1);
}

TEST(FdPassing, OverTcpNothingIsSent) {
    TempDir t;
    FdService svc("");
    auto conn = rpc::Connection::connect(svc.uri, Deadline::after(5)).value();
    EXPECT_FALSE(conn->over_unix());
    client::RpcFetchChannel ch(*conn, 5);
    ASSERT_TRUE(ch.open({{"pass", true}, {"file", t.file}}, Deadline::after(5)).is_ok());
    // The frame with the descriptor was never sent: the plain one comes first.
    auto a = ch.first("test");
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    EXPECT_EQ(a->meta, nlohmann::json({{"after", true}}));
    EXPECT_FALSE(ch.take_fd().valid());
    ASSERT_TRUE(ch.end("test").is_ok());
    EXPECT_EQ(svc.over_unix, 0);
    EXPECT_EQ(svc.sent_ok, 0);
}

TEST(FdPassing, FramesWithoutOneYieldNone) {
    TempDir t;
    size_t before = open_fds();
    {
        FdService svc(t.dir + "/s.sock");
        auto conn = rpc::Connection::connect(svc.unix_uri, Deadline::after(5)).value();
        // Another request's answer, with a descriptor, arrives first on the
        // connection: this fetch must not be handed it.
        ASSERT_TRUE(
            conn->send_request("dyad.fetch", {{"pass", true}, {"file", t.file}}, Deadline::after(5))
                .is_ok());
        client::RpcFetchChannel ch(*conn, 5);
        ASSERT_TRUE(ch.open({{"pass", false}}, Deadline::after(5)).is_ok());
        auto a = ch.first("test");
        ASSERT_TRUE(a.is_ok()) << a.status().to_string();
        EXPECT_EQ(a->meta, nlohmann::json({{"after", true}}));
        EXPECT_FALSE(ch.take_fd().valid());
        ASSERT_TRUE(ch.end("test").is_ok());
        EXPECT_EQ(svc.sent_ok, 1);  // it was sent (to the other request)
    }
    EXPECT_EQ(open_fds(), before);  // and closed here, not leaked
}

namespace {

// A fetch channel that plays given messages and hands over a given fd.
class ScriptedChannel : public dtl::FetchChannel {
  public:
    std::deque<Message> msgs;
    UniqueFd pass;
    int passed_number = -1;
    std::vector<nlohmann::json> updates;
    bool fd_open_at_update = false;

    Result<Message> next() override {
        if (msgs.empty()) return Status(DYAD_RC_TIMEOUT, "no more messages", ETIMEDOUT);
        Message m = msgs.front();
        msgs.pop_front();
        return m;
    }
    Status read(void*, size_t) override {
        return Status(DYAD_RC_SYSFAIL, "no data in these messages", EINVAL);
    }
    Status update(const nlohmann::json& m) override {
        updates.push_back(m);
        fd_open_at_update = passed_number >= 0 && ::fcntl(passed_number, F_GETFD) != -1;
        return Status::ok();
    }
    int fd() const override { return -1; }
    double idle_s() const override { return 1; }
    UniqueFd take_fd() override {
        passed_number = pass.get();
        return std::move(pass);
    }
};

class StringSink : public dtl::Sink {
  public:
    std::string bytes;
    Status write(const void* p, size_t n) override {
        bytes.append(static_cast<const char*>(p), n);
        return Status::ok();
    }
};

// LOCAL's receiver on a channel answering {"size": size} with `fd`.
Result<nlohmann::json> local_receive(UniqueFd fd, uint64_t size, StringSink& sink,
                                     ScriptedChannel* out = nullptr) {
    ScriptedChannel ch;
    dtl::FetchChannel::Message answer;
    answer.meta = {{"size", size}, {"transport", "LOCAL"}};
    ch.msgs.push_back(answer);
    dtl::FetchChannel::Message end;
    end.kind = Kind::end;
    end.meta = {{"size", size}, {"xxh3", ""}};
    ch.msgs.push_back(end);
    ch.pass = std::move(fd);
    auto recv = dtl::find_backend("LOCAL").value()->make_receiver().value();
    auto r = recv->receive(ch, sink);
    if (out) {
        out->updates = ch.updates;
        out->fd_open_at_update = ch.fd_open_at_update;
    }
    return r;
}

}  // namespace

TEST(LocalReceiver, CopiesThePassedFileAndClosesItFirst) {
    TempDir t;
    StringSink sink;
    ScriptedChannel seen;
    auto r = local_receive(UniqueFd(::open(t.file.c_str(), O_RDONLY | O_CLOEXEC)), t.content.size(),
                           sink, &seen);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(sink.bytes, t.content);
    ASSERT_EQ(seen.updates.size(), 1u);
    EXPECT_EQ(seen.updates[0]["copied"], t.content.size());
    // Closed before the service is told (it shares the service's lock).
    EXPECT_FALSE(seen.fd_open_at_update);
}

TEST(LocalReceiver, RefusesAnAnswerWithoutAProperDescriptor) {
    TempDir t;
    struct Case {
        const char* what;
        UniqueFd fd;
        uint64_t size;
        dyad_rc_t rc;
    };
    int pipefd[2];
    ASSERT_EQ(::pipe2(pipefd, O_CLOEXEC), 0);
    ::close(pipefd[1]);
    std::vector<Case> cases;
    cases.push_back({"no descriptor", UniqueFd(), 10, DYAD_RC_BADRPC});
    cases.push_back(
        {"writable", UniqueFd(::open(t.file.c_str(), O_RDWR | O_CLOEXEC)), 10, DYAD_RC_BADRPC});
    cases.push_back({"a pipe", UniqueFd(pipefd[0]), 10, DYAD_RC_BADRPC});
    cases.push_back(
        {"a directory", UniqueFd(::open(t.dir.c_str(), O_RDONLY | O_CLOEXEC)), 0, DYAD_RC_BADRPC});
    cases.push_back({"shorter than announced",
                     UniqueFd(::open(t.file.c_str(), O_RDONLY | O_CLOEXEC)), t.content.size() + 1,
                     DYAD_RC_BADFIO});
    for (auto& c : cases) {
        StringSink sink;
        ScriptedChannel seen;
        auto r = local_receive(std::move(c.fd), c.size, sink, &seen);
        ASSERT_FALSE(r.is_ok()) << c.what;
        EXPECT_EQ(r.status().rc(), c.rc) << c.what << ": " << r.status().to_string();
        EXPECT_TRUE(sink.bytes.empty()) << c.what;
        EXPECT_TRUE(seen.updates.empty()) << c.what;
    }
    StringSink sink;
    auto r = local_receive(UniqueFd(), 10, sink);
    EXPECT_EQ(r.status().err(), EPROTO);
    EXPECT_NE(r.status().message().find("without the file descriptor"), std::string::npos);
}

// ---- write-behind (large stream receives) ----

// A sink that writes slowly (so buffers queue) and can fail at one write.
class SlowSink : public dtl::Sink {
  public:
    explicit SlowSink(int fail_at = -1) : fail_at_(fail_at) {}
    std::string bytes;
    std::atomic<int> writes{0};
    std::thread::id thread;
    Status write(const void* p, size_t n) override {
        thread = std::this_thread::get_id();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        if (writes++ == fail_at_) return Status(DYAD_RC_BADFIO, "disk full", ENOSPC);
        bytes.append(static_cast<const char*>(p), n);
        return Status::ok();
    }

  private:
    int fail_at_;
};

TEST(WriteBehind, WritesEveryBufferInOrderOnItsOwnThread) {
    SlowSink sink;
    std::string expect;
    {
        dtl::WriteBehind wb(sink);
        for (int i = 0; i < 40; ++i) {
            size_t n = 1000 + static_cast<size_t>(i) * 37;  // sizes vary: slots grow
            auto b = wb.take(n);
            ASSERT_TRUE(b.is_ok());
            for (size_t k = 0; k < n; ++k) b.value()[k] = static_cast<char>('a' + (i + k) % 26);
            expect.append(b.value(), n);
            ASSERT_TRUE(wb.push(n).is_ok());
        }
        ASSERT_TRUE(wb.finish().is_ok());
        EXPECT_EQ(sink.writes.load(), 40);
    }
    EXPECT_EQ(sink.bytes, expect);
    EXPECT_NE(sink.thread, std::this_thread::get_id());
}

TEST(WriteBehind, AWriteErrorReachesTheReceiverAndStopsTheWriter) {
    SlowSink sink(3);
    dtl::WriteBehind wb(sink);
    Status err = Status::ok();
    int pushed = 0;
    for (int i = 0; i < 100 && err.is_ok(); ++i) {
        auto b = wb.take(100);
        if (!b) {
            err = b.status();
            break;
        }
        if (!wb.push(100).is_ok()) break;
        ++pushed;
    }
    Status fin = wb.finish();
    EXPECT_FALSE(fin.is_ok());
    EXPECT_EQ(fin.err(), ENOSPC);
    // Nothing is written after the failed write, and the receiver stopped
    // within the slots it had queued.
    EXPECT_EQ(sink.writes.load(), 4);
    EXPECT_EQ(sink.bytes.size(), 300u);
    EXPECT_LE(pushed, 4 + static_cast<int>(dtl::WriteBehind::kSlots));
}

TEST(WriteBehind, GoingAwayWithBuffersQueuedDoesNotWait) {
    SlowSink sink;
    auto t0 = std::chrono::steady_clock::now();
    {
        dtl::WriteBehind wb(sink);
        for (size_t i = 0; i < dtl::WriteBehind::kSlots; ++i) {
            auto b = wb.take(10);
            ASSERT_TRUE(b.is_ok());
            ASSERT_TRUE(wb.push(10).is_ok());
        }
        auto b = wb.take(10);  // one of them is written first
        ASSERT_TRUE(b.is_ok());
        wb.give_back();  // its read failed
    }
    EXPECT_LT(sink.writes.load(), 5);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// The UCX receiver's use: buffers it owns (window slots), reused once
// written() says their write is done.
TEST(BackgroundWriter, NumbersWritesAndFreesCallerBuffersInOrder) {
    SlowSink sink;
    std::vector<std::string> slots(3);
    std::string expect;
    {
        dtl::BackgroundWriter w(sink);
        for (uint64_t i = 0; i < 30; ++i) {
            std::string& b = slots[i % slots.size()];
            if (i >= slots.size()) {
                // The slot's previous write (number i - 3) must be done first.
                ASSERT_TRUE(w.wait_written(i - slots.size() + 1).is_ok());
                EXPECT_GE(w.written(), i - slots.size() + 1);
            }
            b.assign(100 + i, static_cast<char>('a' + i % 26));
            expect += b;
            auto k = w.submit(b.data(), b.size());
            ASSERT_TRUE(k.is_ok());
            EXPECT_EQ(k.value(), i);
        }
        ASSERT_TRUE(w.finish().is_ok());
        EXPECT_EQ(w.written(), 30u);
    }
    EXPECT_EQ(sink.bytes, expect);
    EXPECT_NE(sink.thread, std::this_thread::get_id());
}

// A sink whose first write waits until the test opens the gate, and whose
// second write fails.
class GateSink : public dtl::Sink {
  public:
    std::promise<void> gate;
    std::atomic<int> writes{0};
    Status write(const void*, size_t) override {
        int k = writes++;
        if (k == 0) gate.get_future().wait();
        if (k == 1) return Status(DYAD_RC_BADFIO, "disk full", ENOSPC);
        return Status::ok();
    }
};

TEST(BackgroundWriter, AFailedWriteDropsTheQueueAndIsSeenByEveryCall) {
    GateSink sink;
    dtl::BackgroundWriter w(sink);
    const std::string b(10, 'x');
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(w.submit(b.data(), b.size()).is_ok());
    sink.gate.set_value();
    Status fin = w.finish();
    EXPECT_EQ(fin.err(), ENOSPC);
    EXPECT_EQ(w.written(), 1u);
    EXPECT_EQ(sink.writes.load(), 2);  // the queued three never reached the sink
    EXPECT_EQ(w.wait_written(5).err(), ENOSPC);
    EXPECT_EQ(w.submit(b.data(), b.size()).status().err(), ENOSPC);
}
