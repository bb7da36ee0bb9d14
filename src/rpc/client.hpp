// SPDX-License-Identifier: Apache-2.0
// Blocking RPC client connection: one request at a time per connection (the
// caller's thread waits), every wait bounded by a Deadline. Not thread-safe;
// use one connection per thread (see ConnectionPool).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/auth.hpp"
#include "common/deadline.hpp"
#include "common/fd.hpp"
#include "common/status.hpp"
#include "wire.hpp"

namespace dyad::rpc {

struct Frame {
    Header header;
    nlohmann::json meta;  // null when meta_len == 0
};

// Who this process is to the services it connects to. With a key, the
// hello is a challenge-response in both directions (docs/wire-protocol.md
// section 4): the service proves it holds the key before we say anything
// else, and we prove it before it serves anything. Without a key, only a
// service that asks for none is accepted.
struct Credentials {
    std::shared_ptr<const auth::Key> key;  // null: no authentication
    std::string role = "client";           // "client" or "service"
    std::string service_id;                // with role "service": the service's id
    // The key of DYAD_AUTH_KEY_FILE, if set (errors: unreadable, loose mode).
    static Result<Credentials> from_settings();
};

class Connection {
  public:
    // Connects and exchanges HELLO frames (version check, authentication).
    // A peer that does not answer the hello like a DYAD service within
    // kHelloAnswerTimeout (wire.hpp; silence, bytes that are not a frame, a close) is
    // DYAD_RC_CONNFAIL with errno EPROTO and a message saying so
    // (not_dyad() recognises it).
    // `expect`, when not empty, is the service id of the service the caller
    // means to reach (a record's owner): another is refused, and with a key
    // it must prove it is that one.
    static Result<std::unique_ptr<Connection>> connect(const std::string& uri, Deadline deadline,
                                                       const Credentials& creds = Credentials(),
                                                       const std::string& expect = "");

    const nlohmann::json& peer_info() const { return peer_info_; }
    // The service id the peer proved (with a key) or said (without one).
    const std::string& peer_id() const { return peer_id_; }
    const std::string& uri() const { return uri_; }
    bool broken() const { return broken_; }
    // The socket, for waiting on it together with other event sources:
    // poll it only when buffered() is false.
    int fd() const { return fd_.get(); }
    // Bytes already read from the socket and not yet consumed (TCP reads
    // take up to kReadAhead bytes at once: a small answer and its END in
    // one recv). Then the next read needs no wait.
    bool buffered() const { return rpos_ < rend_ || held_pos_ < held_.size(); }

    // Sends a request; returns its tag. args become the meta with "topic"
    // and, if propagate, "timeout_ms" (the time left before `deadline`) added:
    // the service then abandons the request at the same deadline.
    // With `pass_fd` (a Unix socket only; ignored over TCP), the request's
    // first byte carries that descriptor (SCM_RIGHTS; the caller keeps its own).
    Result<uint32_t> send_request(const std::string& topic, nlohmann::json args, Deadline deadline,
                                  bool propagate = true, int pass_fd = -1);
    // Reads the next frame's header and meta. Its data (header.data_len
    // bytes) must then be consumed with read_data or skip_data.
    Result<Frame> read_frame(Deadline deadline);
    Status read_data(void* buf, size_t n, Deadline deadline);
    Status skip_data(size_t n, Deadline deadline);
    // The file descriptor the service passed (SCM_RIGHTS) with the frame
    // read_frame returned last, once; an invalid one if that frame carried
    // none. Only Unix-socket connections receive descriptors; one not taken
    // is closed by the next read_frame.
    UniqueFd take_fd() { return std::move(passed_fd_); }
    bool over_unix() const { return unix_; }
    Status send_cancel(uint32_t tag);
    // More input for an active request (e.g. flow-control credits).
    Status send_update(uint32_t tag, const nlohmann::json& meta, Deadline deadline);

    // Request with a single answer (response or end); errors become Status.
    // grace_s extends the wait for the answer past the deadline sent to the
    // service, so that the service's own timeout error can arrive. The
    // answer's data, if any, goes to *data when given (else it is skipped);
    // more than data_max bytes of it is EPROTO, and the connection is
    // dropped unread (a peer cannot make the caller hold 64 MiB).
    Result<nlohmann::json> call(const std::string& topic, nlohmann::json args, Deadline deadline,
                                double grace_s = 0, std::string* data = nullptr,
                                size_t data_max = kMaxMeta, int pass_fd = -1);

    // Turns an error frame into a Status.
    static Status error_status(const Frame& f, const std::string& context);
    // Is this connect() failure "the peer is not (or not acting like) a DYAD
    // service" rather than "nothing there" or a refusal?
    static bool not_dyad(const Status& s) {
        return s.rc() == DYAD_RC_CONNFAIL && s.err() == EPROTO;
    }
    // Came from a ConnectionPool's idle connections (not freshly connected).
    bool reused() const { return reused_; }
    // The last request failed because the service had closed the connection
    // before it: nothing of the request was accepted (its send failed at
    // once), or, `idempotent` alike, the service closed without any answer.
    bool lost_before_request(bool idempotent) const {
        return loss_ == Loss::unsent || (idempotent && loss_ == Loss::unanswered);
    }

  private:
    friend class ConnectionPool;
    Connection(UniqueFd fd, std::string uri)
        : fd_(std::move(fd)), uri_(std::move(uri)), unix_(is_unix_socket(fd_.get())) {}
    static bool is_unix_socket(int fd);
    // The peer's answer to a hello: another hello, or an error naming why
    // (hello_s: the seconds it was given, for the message).
    Result<Frame> read_hello(Deadline deadline, double hello_s);
    Status send_frame(const Header& h, const std::string& meta, Deadline deadline,
                      int pass_fd = -1);
    // The first bytes of `p` with `fd` (SCM_RIGHTS): how many went.
    Result<size_t> send_first_with_fd(const char* p, size_t n, int fd, Deadline deadline);
    Status write_exact(const void* p, size_t n, Deadline deadline);
    // With take_fds (frame headers on a Unix socket), by recvmsg keeping a
    // passed descriptor in passed_fd_.
    Status read_exact(void* p, size_t n, Deadline deadline, bool take_fds = false);
    ssize_t recv_with_fd(void* p, size_t n);

    UniqueFd fd_;
    std::string uri_;
    bool unix_ = false;
    UniqueFd passed_fd_;  // came with the header of the last frame read
    // Read-ahead (TCP only: on a Unix socket a passed descriptor travels
    // with its frame's first byte, so reads never cross a frame there).
    static constexpr size_t kReadAhead = 64u << 10;
    std::unique_ptr<char[]> rbuf_;
    size_t rpos_ = 0, rend_ = 0;
    // The part of the last frame's data its tag covers (its flags say how
    // much), read with the frame to check the tag: read_data and skip_data
    // take it first.
    std::string held_;
    size_t held_pos_ = 0;
    size_t take_held(void* buf, size_t n);
    std::string bad_header_;  // the bytes of the last header that did not decode
    nlohmann::json peer_info_;
    std::string peer_id_;
    auth::FrameMac tx_mac_, rx_mac_;  // active once a keyed hello is done
    uint32_t next_tag_ = 1;
    bool broken_ = false;
    bool reused_ = false;
    // How the last request was lost to a closed connection, if it was.
    enum class Loss { none, unsent, unanswered } loss_ = Loss::none;
    bool sending_request_ = false;  // in send_request: a failed first write is Loss::unsent
    bool sent_any_ = false;         // bytes of the current request accepted by the kernel
    bool read_any_ = false;         // bytes read since the current request was sent
};

// Idle connections kept per URI so that many small requests do not pay for
// a connect each. Thread-safe; a connection is used by one thread at a time.
class ConnectionPool {
  public:
    explicit ConnectionPool(Credentials creds = Credentials(), size_t max_idle_per_uri = 8)
        : creds_(std::move(creds)), max_idle_(max_idle_per_uri) {}
    // A connection to `uri`; with `expect`, to the service of that id only
    // (an idle one of another service is not reused; a new one must be it).
    Result<std::unique_ptr<Connection>> get(const std::string& uri, Deadline deadline,
                                            const std::string& expect = "");
    // Returns a connection after a completed exchange; broken ones are dropped.
    void put(std::unique_ptr<Connection> c);
    void clear();
    // A request with a single answer (Connection::call) on a connection of
    // the pool. An idle connection the service closed under the pool
    // (dyadd --idle-timeout, a restart) is not an error: the request is sent
    // once more on a fresh connection when it certainly did not reach the
    // service (or, for an `idempotent` request, when the service closed the
    // connection without answering it). When no connection could be had,
    // *connect_failed (if given) is set.
    Result<nlohmann::json> call(const std::string& uri, const std::string& topic,
                                const nlohmann::json& args, Deadline deadline, double grace_s = 0,
                                bool idempotent = false, bool* connect_failed = nullptr,
                                std::string* data = nullptr, size_t data_max = kMaxMeta,
                                int pass_fd = -1);
    // Requests sent again by call() on a fresh connection.
    uint64_t retries() const { return retries_.load(); }

  private:
    std::atomic<uint64_t> retries_{0};
    std::mutex mu_;
    Credentials creds_;
    size_t max_idle_;
    std::unordered_map<std::string, std::vector<std::unique_ptr<Connection>>> idle_;
};

}  // namespace dyad::rpc
