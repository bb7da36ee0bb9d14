// SPDX-License-Identifier: Apache-2.0
// One client connection of the rpc server (private to src/rpc): reads
// frames (hello first, within kHelloAdmitTimeout), dispatches requests,
// queues and writes answers with flow control (at most kMaxActive requests
// and kMaxQueuedBytes of answers per connection), cancels what is left when
// the peer goes away. Its parts, one concept a file:
//   session.cpp        lifecycle, reading frames, dispatch, flow control,
//                      the idle timeout
//   session_hello.cpp  the hello: peer identity, authentication, admission
//   session_write.cpp  the answer queue: gathered writes, sendfile, passing
//                      a descriptor (SCM_RIGHTS)
//   session_fd.cpp     a descriptor a client passes with a request (SCM_RIGHTS)
#pragma once

#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/auth.hpp"
#include "common/fd.hpp"
#include "server.hpp"
#include "wire.hpp"

namespace dyad::rpc {

// A connection refused for its peer's cap waits this long for the frame it
// is answered with (the refusal's message), then closes.
inline constexpr auto kRefusalTimeout = std::chrono::seconds(1);
inline constexpr size_t kMaxActive = 256;             // requests in progress per connection
inline constexpr size_t kMaxQueuedBytes = 16u << 20;  // answer bytes waiting per connection
inline constexpr int kMaxSessions = 4096;             // the default of Server::set_max_connections
inline constexpr size_t kReservedSessions = 16;

class Session : public std::enable_shared_from_this<Session> {
  public:
    Session(Server& srv, asio::io_context& io, asio::generic::stream_protocol::socket s);

    // Set by the server before start() when the peer already has as many
    // connections as it may: the first frame is answered with `msg`, then
    // the connection closes.
    void refuse_at_hello(std::string msg) { over_cap_ = std::move(msg); }
    bool counted() const { return over_cap_.empty(); }
    // Called by the server's hangup watch: the peer of a paused session is gone.
    void peer_hung_up();

    uint64_t id() const { return id_; }

    // Arms the hello's deadline and reads the first frame.
    void start();

    // Queues a frame (answers leave in the order they are queued; cb, if
    // any, is called once with whether it was written).
    void send(Header h, std::string meta, asio::const_buffer data, Request::WriteDone cb);
    // A frame whose data is `len` bytes of `fd` from `off` (sendfile).
    void send_file(Header h, std::string meta, int fd, uint64_t off, size_t len,
                   Request::WriteDone cb);
    // A frame that carries `fd` (owned, closed once sent or dropped) as
    // SCM_RIGHTS with its first byte. Unix sockets only: elsewhere nothing
    // is sent and cb gets false.
    void send_with_fd(Header h, std::string meta, UniqueFd fd, Request::WriteDone cb);
    // From any thread: a frame without data, written at once when nothing
    // else is queued or being written (what the kernel does not take yet,
    // the loop writes after). False, and nothing sent, when the connection
    // is busy or closed: then send() it on the loop.
    bool send_now(Header h, std::string meta);

    // True when the peer connected over a Unix socket (descriptors can pass).
    bool over_unix() const { return unix_; }

    void request_finished(uint32_t tag);
    void close();

    const Peer& peer() const { return peer_; }
    // The address of this end ("" for a Unix socket).
    std::string local_host();

  private:
    struct Out {
        std::array<uint8_t, kHeaderSize> hdr;
        std::string meta;
        std::array<uint8_t, auth::kTagBytes> tag;
        bool tagged = false;  // the tag follows the meta (a keyed connection, once admitted)
        asio::const_buffer data;
        size_t tagged_data = 0;  // bytes of data the tag covers (the header's flags)
        Request::WriteDone cb;
        int file_fd = -1;  // data from this file instead (owned: a dup)
        uint64_t file_off = 0;
        size_t file_len = 0;
        UniqueFd pass_fd;    // passed with the first byte (SCM_RIGHTS), then closed
        size_t fd_sent = 0;  // bytes of a frame with pass_fd already written
    };

    // ---- reading and dispatch (session.cpp) ----
    void read_header();
    void header_read();  // hdr_ holds a whole header
    void read_body();
    // ---- descriptors a client passes (session_fd.cpp) ----
    // Reads the header from byte `got` on a Unix socket with recvmsg,
    // keeping what the kernel says of a passed descriptor in rx_file_.
    void read_header_unix(size_t got);
    ssize_t recv_header_part(size_t got);
    // Returns false when the session must stop reading.
    bool handle_frame();
    bool handle_request(nlohmann::json meta);
    // Backpressure: a peer that keeps asking without reading the answers
    // stops being read once it has too many requests or too many queued bytes.
    bool overloaded();
    // Answers queued or being written.
    bool sending() {
        std::lock_guard<std::mutex> lk(wmu_);
        return writing_ || !q_.empty();
    }
    void maybe_resume();
    // An error frame {"msg", "rc"} with `errnum` for request `tag`; the
    // connection closes once it is written when `then_close`.
    void send_error(uint32_t tag, int errnum, const std::string& msg, dyad_rc_t rc,
                    bool then_close);
    void protocol_error(uint32_t tag, const std::string& msg);
    // The idle timeout (Server::set_idle_timeout), on the hello's timer once
    // the hello is done.
    void arm_idle(std::chrono::milliseconds wait);

    // ---- the hello (session_hello.cpp) ----
    bool handle_hello(std::string raw, const nlohmann::json& meta);
    bool check_proof(const nlohmann::json& meta);
    bool challenge(std::string raw, const std::string& own_id);
    bool check_uid();
    bool admit();
    bool refuse(const std::string& msg);

    // ---- writing (session_write.cpp) ----
    void enqueue(Out o);
    // The frame as queued: header (flags cut to what the tag can cover), meta, data.
    Out make_out(Header h, std::string meta, asio::const_buffer data);
    void seal(Out& o);
    static asio::const_buffer tag_of(const Out& o);
    void write_next();
    void write_file_data();
    template <class Step, class Done>
    void write_until_done(Step step, Done done, void (Session::*resume)());
    void write_with_fd();
    void front_written(asio::error_code ec) { frames_written(1, ec); }
    // The first `frames` frames of the queue are out (or failed with ec).
    void frames_written(size_t frames, asio::error_code ec);

    uint64_t id_ = 0;
    Server& server_;
    asio::io_context& io_;
    asio::generic::stream_protocol::socket sock_;
    std::array<uint8_t, kHeaderSize> hdr_{};
    Header h_;
    std::string meta_;
    asio::steady_timer hello_timer_;  // the hello's deadline, then the idle timeout
    std::chrono::steady_clock::time_point last_activity_ = std::chrono::steady_clock::now();
    size_t queued_bytes_ = 0;
    bool paused_ = false;
    bool hello_done_ = false;
    bool awaiting_proof_ = false;
    // The transcript of a keyed hello, while the client's proof is awaited.
    std::string client_hello_, challenge_, service_proof_;
    auth::FrameMac tx_mac_, rx_mac_;  // active once a keyed peer is admitted
    std::array<uint8_t, auth::kTagBytes> rx_tag_{};
    // The write side (q_, writing_, queued_bytes_, tx_mac_'s sequence, the
    // socket's close) is the loop's, and also send_now's from another
    // thread: under wmu_ where both may touch it.
    std::mutex wmu_;
    bool closed_ = false;
    bool writing_ = false;
    bool unix_ = false;                    // a Unix socket: descriptors can pass
    std::string over_cap_;                 // non-empty: refused (its peer has too many connections)
    std::shared_ptr<Session> keep_alive_;  // itself, while paused
    Peer peer_;
    std::optional<PassedFile> rx_file_;  // came with the frame being read (Unix socket)
    std::deque<Out> q_;
    std::unordered_map<uint32_t, std::shared_ptr<Request>> active_;
};

}  // namespace dyad::rpc
