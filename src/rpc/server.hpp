// SPDX-License-Identifier: Apache-2.0
// Asynchronous RPC server on an Asio event loop: TCP and Unix listeners, one
// session per connection (no thread per connection), requests dispatched by
// topic, streaming answers with per-frame write completion (flow control),
// a deadline on every request and cancellation when the peer disconnects.
//
// Threading: the loop runs on one thread. Request methods may be called
// from any thread; they are forwarded to the loop in call order. Handlers run
// on the loop; a handler that throws is answered with EINVAL.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <asio.hpp>
#include <nlohmann/json.hpp>

#include "common/auth.hpp"
#include "common/rate_limit.hpp"
#include "common/status.hpp"
#include "wire.hpp"

namespace dyad::rpc {

class Session;

// Who may talk to a server (docs/security.md). With a key, every peer must
// prove it holds it before anything else is answered. On a Unix socket the
// peer's uid (SO_PEERCRED) must also be ours, root's, or one of `uids`.
struct AuthPolicy {
    std::shared_ptr<const auth::Key> key;  // null: no authentication
    std::vector<uint32_t> uids;            // more uids allowed on the Unix socket
    bool any_uid = false;                  // every local user (--allow-uid any)
};

// What a peer proved about itself in its hello.
struct Peer {
    bool authenticated = false;   // proved it holds the key (always false without one)
    std::string role = "client";  // claimed in the hello: "client" or "service"
    std::string service_id;       // with role "service"
    int64_t pid = 0;
    // What the kernel says: SO_PEERCRED on a Unix socket, the owner of the
    // peer's socket for a local TCP peer (principal.hpp); -1 for a remote one.
    int64_t uid = -1;
    std::string address;  // "IP:PORT" over TCP, "unix" over a Unix socket (for logs)
    // Who the per-peer caps count (docs/security.md, "Caps per peer"): what
    // the kernel says of the other end, never what the peer claims
    // (principal.hpp): a local user ("uid 1000", whatever loopback address
    // or socket it comes from), a remote host ("host 10.0.0.5"); the
    // service's own uid and root, trusted, are told apart by process.
    std::string key;
    // The kernel says the peer runs as the service's own uid or as root
    // (it may use the slots kept for the service's own tools).
    bool trusted = false;
    // On this host: a Unix socket or a loopback address (uid known or not).
    bool local = false;
    // The peer process's gid and supplementary groups as the kernel holds
    // them (SO_PEERCRED, SO_PEERGROUPS; Unix socket only: gid -1 and no
    // groups elsewhere). docs/security.md, "The node-wide service".
    int64_t gid = -1;
    std::shared_ptr<const std::vector<uint32_t>> groups;
};

// What the kernel says of a descriptor a client passed (SCM_RIGHTS) with a
// request over a Unix socket: the descriptor itself is closed at once.
struct PassedFile {
    uint64_t dev = 0, ino = 0;
    uint32_t mode = 0;      // st_mode (type and permissions)
    bool readable = false;  // opened for reading (not O_PATH, not write-only)
};

// How a request ended, for a RequestObserver.
struct Outcome {
    enum class How {
        ended,      // answered (end)
        error,      // answered with an error frame by its handler
        expired,    // its deadline passed on the service (the client got ETIMEDOUT)
        cancelled,  // the peer cancelled it or went away (errnum ECANCELED, ECONNRESET)
    };
    How how = How::ended;
    int errnum = 0;
    std::string msg;
    dyad_rc_t rc = DYAD_RC_OK;
};

class Request;

// Sees every request of a server (metrics, request logs), on the loop:
// started() before its handler runs, finished() exactly once when it ends,
// however it ends. Must not throw.
class RequestObserver {
  public:
    virtual ~RequestObserver() = default;
    virtual void started(const Request& r) = 0;
    virtual void finished(const Request& r, const Outcome& o) = 0;
};

class Request : public std::enable_shared_from_this<Request> {
  public:
    using WriteDone = std::function<void(bool ok)>;

    Request(std::weak_ptr<Session> s, asio::io_context& io, uint32_t tag, nlohmann::json args);
    ~Request();

    const std::string& topic() const { return topic_; }
    const nlohmann::json& args() const { return args_; }
    uint32_t tag() const { return tag_; }
    asio::io_context& io() { return io_; }
    // What the connection's peer said and proved in its hello.
    const Peer& peer() const;
    // The service id the peer speaks for ("" unless it said it is a service,
    // and proved it holds the key where there is one).
    std::string peer_service() const;
    // The local IP address the client connected to ("" for a Unix socket).
    std::string local_host() const;
    // True when the client connected over a Unix socket (respond_with_fd
    // works); false over TCP or once the connection closed.
    bool over_unix() const;
    // The descriptor the client passed with this request's frame (Unix
    // socket only), as the kernel described it; nullopt when none.
    const std::optional<PassedFile>& passed_file() const { return passed_; }
    // A number unique to the connection this request came on (0 once it closed).
    uint64_t session_id() const;
    // The same number, kept after the connection closed (for logs).
    uint64_t connection() const { return connection_; }
    // When the request arrived (steady clock).
    std::chrono::steady_clock::time_point arrived() const { return arrived_; }

    // One part of the answer. `data` must stay valid until `done` runs
    // (with ok=false if the connection went away first). `tag_flags`
    // (kFlagTagHead, kFlagTagData: wire.hpp) has the frame's tag cover the
    // data's head, or all of it, on a keyed connection: for data that
    // carries metadata (a compact answer).
    void respond(nlohmann::json meta, asio::const_buffer data = {}, WriteDone done = {},
                 uint8_t tag_flags = 0);
    // The same, with `len` bytes of file `fd` from `off` as the data, sent by
    // sendfile(2) from the page cache (no copy through this process). The
    // fd is duplicated: the caller may close its own at once.
    void respond_file(nlohmann::json meta, int fd, uint64_t off, size_t len, WriteDone done);
    // One part of the answer (no data) that hands the client the open file
    // descriptor `fd` (SCM_RIGHTS with the frame's first byte). Unix sockets
    // only: over TCP nothing is sent and `done` gets ok=false. The fd is
    // duplicated: the caller may close its own at once.
    void respond_with_fd(nlohmann::json meta, int fd, WriteDone done);
    void end(nlohmann::json meta = nullptr);
    // The last part of the answer, with `data` (kept until written), which
    // its tag covers on a keyed connection (kFlagTagData: a compact answer).
    void end(nlohmann::json meta, std::string data);
    // end(meta), written at once from the calling thread when the
    // connection has nothing else going out (else queued on the loop as
    // end() does); the request's bookkeeping follows on the loop. For an
    // answer made off the loop (a store's thread woken by what a wait
    // waited for), it saves the hand-off to the loop before the client
    // hears it. Only for a request whose answer is this one frame: a
    // respond() still queued for the loop would be overtaken.
    void end_now(nlohmann::json meta);
    void error(int errnum, const std::string& msg, dyad_rc_t rc = DYAD_RC_BADRPC);
    // Answers with `s` as an error frame: its errno (EIO when it has none),
    // message and rc. The one way to turn a Status into an RPC error.
    void fail(const Status& s);

    // True once answered (end/error) or cancelled.
    bool finished() const { return finished_.load(); }
    bool cancelled() const { return cancelled_.load(); }
    // Called once, on the loop, if the request is cancelled (peer gone,
    // cancel frame, deadline passed) before it finished.
    void on_cancel(std::function<void()> fn);
    // Called on the loop for each UPDATE frame the client sends for this
    // request (flow-control credits and the like); dropped when unset.
    void on_update(std::function<void(const nlohmann::json&)> fn) { on_update_ = std::move(fn); }

    // Closes the whole connection (a peer that stopped reading).
    void close_connection();

    // Internal (Session).
    void set_peer(Peer p) { peer_ = std::move(p); }
    void set_passed_file(std::optional<PassedFile> f) { passed_ = f; }
    void set_observer(std::shared_ptr<RequestObserver> o) { observer_ = std::move(o); }
    RequestObserver* observer() const { return observer_.get(); }
    void cancel(int why_errnum);
    void arm_deadline();
    // The request ends with ETIMEDOUT at most `most` after it arrived,
    // whatever deadline its client gave (a wait held by the service).
    void cap_deadline(std::chrono::milliseconds most);
    // Keeps only these arguments (and "topic", "timeout_ms"); the rest of
    // what the peer sent is let go before the handler runs.
    void keep_only(const std::vector<std::string>& names);
    // What the request holds of the argument budget, let go when it ends.
    void hold(std::shared_ptr<void> charge) { charge_ = std::move(charge); }
    void deliver_update(const nlohmann::json& meta) {
        if (on_update_ && !finished_) on_update_(meta);
    }

  private:
    void finish();
    // What end() does on the loop once closing_ is taken.
    void end_on_loop(nlohmann::json meta, std::shared_ptr<std::string> data);
    void notify(Outcome::How how, int errnum, std::string msg, dyad_rc_t rc);

    std::weak_ptr<Session> session_;
    uint64_t connection_ = 0;
    std::chrono::steady_clock::time_point arrived_;
    std::shared_ptr<RequestObserver> observer_;
    asio::io_context& io_;
    uint32_t tag_;
    nlohmann::json args_;
    Peer peer_;
    std::optional<PassedFile> passed_;
    std::string topic_;
    std::atomic<bool> closing_{false};   // end/error/cancel called (first wins)
    std::atomic<bool> finished_{false};  // set on the loop once the answer is queued
    std::atomic<bool> cancelled_{false};
    std::function<void()> on_cancel_;
    std::function<void(const nlohmann::json&)> on_update_;
    std::unique_ptr<asio::steady_timer> timer_;
    std::shared_ptr<void> charge_;  // its bytes of the argument budget (Server)
};

using Handler = std::function<void(std::shared_ptr<Request>)>;

class Server {
  public:
    Server(asio::io_context& io, nlohmann::json hello_info);
    ~Server();

    // Listens on HOST:PORT (port 0 picks one); returns "tcp://HOST:PORT".
    Result<std::string> listen_tcp(const std::string& host, uint16_t port);
    Result<std::string> listen_unix(const std::string& path);
    // A socket bound (and maybe listening) by whoever started us, taken
    // over as listen_tcp / listen_unix would have made it: `fd` must be a
    // TCP socket bound to `port` (0: any), or a Unix socket bound to `path`
    // (listened on by us, never before: see adopt_unix).
    Result<std::string> adopt_tcp(int fd, uint16_t port);
    Result<std::string> adopt_unix(int fd, const std::string& path);
    // Before listen_*: they bind (the address is known and reserved) but do
    // not listen, so connecting is refused until start_accepting(): a service
    // takes connections only once it is ready to serve them.
    void defer_accepting() { deferred_ = true; }
    Status start_accepting();
    void handle(const std::string& topic, Handler h);
    // The arguments the handler of `topic` reads (then or later): the
    // others are dropped before it runs, so a request holds no more than it
    // needs while it waits. Unset: the handler reads all.
    void reads_args(const std::string& topic, std::vector<std::string> args);
    void set_hello_info(nlohmann::json info) { hello_info_ = std::move(info); }
    void set_auth(AuthPolicy a) { auth_ = std::move(a); }
    const AuthPolicy& auth() const { return auth_; }
    // Peers refused in their hello (wrong or missing key, uid not allowed).
    uint64_t auth_refused() const { return auth_refused_; }
    void count_auth_refused() { ++auth_refused_; }
    // Warnings caused by peers (refusals, bad frames) are logged at most
    // 20 every 10 s (log::RateLimit): a flood of bad peers
    // cannot flood the log. The next one logged after a window says how
    // many were left out; every case stays counted in the status.
    bool peer_warning_allowed() { return peer_warnings_.allow(); }
    // Sees every request from now on (null: none). Requests keep the
    // observer they started with.
    void set_observer(std::shared_ptr<RequestObserver> o) { observer_ = std::move(o); }
    const std::shared_ptr<RequestObserver>& observer() const { return observer_; }
    // Connections closed at once because the table was full (for them:
    // set_max_connections).
    uint64_t connections_refused() const { return connections_refused_; }
    // At most `n` connections per peer (Peer::key; 0: no cap). One more is
    // answered with an error frame (EUSERS) at its first frame and closed.
    void set_max_connections_per_peer(size_t n) { max_per_peer_ = n; }
    size_t max_connections_per_peer() const { return max_per_peer_; }
    // Connections refused because their peer had max_connections_per_peer.
    uint64_t refused_peer_connections() const { return refused_peer_connections_; }
    // Peers with at least one open connection, and their most connections.
    size_t peer_count() const { return peer_connections_.size(); }
    size_t busiest_peer_connections() const;
    // Connections closed after `t` without a request in flight and without
    // traffic, once past the hello (zero: never; dyadd --idle-timeout).
    void set_idle_timeout(std::chrono::milliseconds t) { idle_timeout_ = t; }
    std::chrono::milliseconds idle_timeout() const { return idle_timeout_; }
    uint64_t idle_closed() const { return idle_closed_; }
    void count_idle_closed() { ++idle_closed_; }
    // The bytes of arguments requests in progress may hold (the memory of
    // what the service keeps after dropping what their handler does not
    // read, plus kRequestOverhead): per
    // peer (Peer::key) and for the whole service (0: no cap). A request
    // beyond either is answered ENOBUFS and counted.
    void set_request_bytes(uint64_t per_peer, uint64_t total);
    uint64_t max_request_bytes_per_peer() const { return args_->per_peer; }
    uint64_t max_request_bytes() const { return args_->total; }
    uint64_t refused_request_bytes_peer() const;
    uint64_t refused_request_bytes_total() const;
    // {held, busiest_peer}: bytes of arguments held now.
    nlohmann::json request_bytes_stats() const;
    // The longest a kvs.get wait is held before it answers TIMEOUT (its
    // client asks again); dyadd --max-wait.
    void set_max_wait(std::chrono::milliseconds t) { max_wait_ = t; }
    std::chrono::milliseconds max_wait() const { return max_wait_; }
    // At most `n` connections at once (default kMaxSessions), of which
    // `reserved` only for trusted peers (the service's own uid and root:
    // its `dyad service status`) and, with a key, one per other peer
    // that proves it in time: a full table never locks those out.
    void set_max_connections(size_t n, size_t reserved);
    size_t max_connections() const { return max_sessions_; }
    // Connections let in to the reserved slots (the others are counted in
    // connections_refused()).
    uint64_t reserved_admitted() const { return reserved_admitted_; }

    // Closes listeners and every session; pending requests are cancelled.
    void stop();

    // Internal (Session).
    void dispatch(std::shared_ptr<Request> r);
    // Drops the arguments r's handler does not read and takes what r
    // keeps in memory of the budget of set_request_bytes: null (and *why)
    // when that would pass a cap.
    std::shared_ptr<void> admit_request(Request& r, const std::string& peer, std::string* why);
    static constexpr uint64_t kRequestOverhead = 256;  // charged per request besides its args
    const nlohmann::json& hello_info() const { return hello_info_; }
    void forget(Session* s);
    // A paused session (it reads nothing until its answers drain) is told
    // when its peer hangs up (EPOLLRDHUP), so that what it holds is let go
    // at once rather than at its requests' deadlines.
    void watch_hangup(Session* s, int fd);
    void unwatch_hangup(int fd);

    size_t session_count() const { return sessions_.size(); }

  private:
    Result<std::string> take_unix(std::unique_ptr<asio::local::stream_protocol::acceptor> acc,
                                  const std::string& path);
    void accept_tcp();
    void accept_unix();
    void start_session(asio::generic::stream_protocol::socket sock);
    void arm_hangups();

    asio::io_context& io_;
    nlohmann::json hello_info_;
    AuthPolicy auth_;
    uint64_t auth_refused_ = 0;
    log::RateLimit peer_warnings_{"rpc", "about peers; dyad service status counts every case"};
    uint64_t connections_refused_ = 0;
    std::chrono::milliseconds idle_timeout_{120000};
    uint64_t idle_closed_ = 0;
    std::shared_ptr<RequestObserver> observer_;
    std::unique_ptr<asio::ip::tcp::acceptor> tcp_;
    std::unique_ptr<asio::local::stream_protocol::acceptor> unix_;
    std::string unix_path_;
    struct Topic {
        Handler handler;
        std::vector<std::string> args;  // empty: the handler reads all
    };
    std::unordered_map<std::string, Topic> handlers_;
    // Bytes of arguments held by requests in progress (thread-safe: let go
    // wherever the last copy of a request's charge goes).
    struct ArgUse {
        std::mutex mu;
        uint64_t per_peer = 32ull << 20, total = 256ull << 20;
        uint64_t held = 0;
        std::unordered_map<std::string, uint64_t> by_peer;
        uint64_t refused_peer = 0, refused_total = 0;
    };
    std::shared_ptr<ArgUse> args_ = std::make_shared<ArgUse>();
    std::chrono::milliseconds max_wait_{60000};
    size_t max_sessions_;
    size_t reserved_sessions_;
    uint64_t reserved_admitted_ = 0;
    std::unordered_map<std::string, size_t> in_reserve_;  // untrusted peers in reserved slots
    std::unordered_map<Session*, std::string> reserve_holders_;
    std::unordered_map<Session*, std::weak_ptr<Session>> sessions_;
    size_t max_per_peer_ = 512;
    uint64_t refused_peer_connections_ = 0;
    std::unordered_map<std::string, size_t> peer_connections_;  // by Peer::key
    // Connections refused for their peer's cap and not yet closed, by Peer::key.
    std::unordered_map<std::string, size_t> refusing_;
    bool deferred_ = false;  // defer_accepting() until start_accepting()
    static constexpr size_t kMaxRefusalsPerPeer = 8;
    std::unique_ptr<asio::posix::stream_descriptor> hangups_;  // an epoll fd
    std::unordered_map<int, Session*> hangup_fds_;
    asio::steady_timer retry_tcp_;
    asio::steady_timer retry_unix_;
    bool stopped_ = false;
};

}  // namespace dyad::rpc
