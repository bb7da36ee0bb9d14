// SPDX-License-Identifier: Apache-2.0
// One client connection of the rpc server (private to src/rpc): reads
// frames (hello first, within kHelloTimeout), dispatches requests, queues and
// writes answers with flow control (at most kMaxActive requests and
// kMaxQueuedBytes of answers per connection), cancels what is left when the
// peer goes away.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <limits>
#include <vector>

#include "common/fd.hpp"
#include "common/log.hpp"
#include "principal.hpp"
#include "server.hpp"
#include "common/json_text.hpp"

namespace dyad::rpc {

inline constexpr auto kHelloTimeout = std::chrono::seconds(10);
// A connection refused for its peer's cap waits this long for the frame it
// is answered with (the refusal's message), then closes.
inline constexpr auto kRefusalTimeout = std::chrono::seconds(1);
inline constexpr size_t kMaxActive = 256;             // requests in progress per connection
inline constexpr size_t kMaxQueuedBytes = 16u << 20;  // answer bytes waiting per connection
inline constexpr int kMaxSessions = 4096;             // the default of Server::set_max_connections
inline constexpr size_t kReservedSessions = 16;

class Session : public std::enable_shared_from_this<Session> {
  public:
    Session(Server& srv, asio::io_context& io, asio::generic::stream_protocol::socket s)
        : server_(srv), io_(io), sock_(std::move(s)), hello_timer_(io) {
        static std::atomic<uint64_t> next{0};
        id_ = ++next;
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        unix_ = ::getsockname(sock_.native_handle(), reinterpret_cast<sockaddr*>(&ss), &len) == 0 &&
                ss.ss_family == AF_UNIX;
        peer_.address =
            unix_ ? std::string("unix") : socket_endpoint(sock_.native_handle(), /*peer=*/true);
        Principal who = principal_of(sock_.native_handle());
        peer_.key = std::move(who.key);
        peer_.trusted = who.trusted;
        peer_.uid = who.uid;
    }

    // Set by the server before start() when the peer already has as many
    // connections as it may: the first frame is answered with `msg`, then
    // the connection closes.
    void refuse_at_hello(std::string msg) { over_cap_ = std::move(msg); }
    bool counted() const { return over_cap_.empty(); }
    // Called by the server's hangup watch: the peer of a paused session is gone.
    void peer_hung_up() {
        DYAD_DEBUG("rpc", "connection %llu (%s): the peer hung up while it was not read",
                   static_cast<unsigned long long>(id_), peer_.key.c_str());
        close();
    }

    uint64_t id() const { return id_; }

    void start() {
        // A peer gets kHelloTimeout to say hello (kRefusalTimeout to hear
        // why it is refused); then it is dropped.
        std::weak_ptr<Session> weak = shared_from_this();
        hello_timer_.expires_after(over_cap_.empty()
                                       ? std::chrono::steady_clock::duration(kHelloTimeout)
                                       : kRefusalTimeout);
        hello_timer_.async_wait([weak](asio::error_code ec) {
            auto self = weak.lock();
            if (!ec && self && !self->hello_done_) self->close();
        });
        read_header();
    }

    void send(Header h, std::string meta, asio::const_buffer data, Request::WriteDone cb) {
        if (closed_) {
            if (cb) asio::post(io_, [cb] { cb(false); });
            return;
        }
        Out o;
        h.meta_len = static_cast<uint32_t>(meta.size());
        h.data_len = static_cast<uint32_t>(data.size());
        encode_header(h, o.hdr.data());
        o.meta = std::move(meta);
        o.data = data;
        o.cb = std::move(cb);
        seal(o);
        queued_bytes_ += o.meta.size() + kHeaderSize;
        q_.push_back(std::move(o));
        if (!writing_) write_next();
    }

    // A frame whose data is `len` bytes of `fd` from `off` (sendfile).
    void send_file(Header h, std::string meta, int fd, uint64_t off, size_t len,
                   Request::WriteDone cb) {
        int dup = closed_ ? -1 : ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (dup < 0) {
            if (cb) asio::post(io_, [cb] { cb(false); });
            return;
        }
        Out o;
        h.meta_len = static_cast<uint32_t>(meta.size());
        h.data_len = static_cast<uint32_t>(len);
        encode_header(h, o.hdr.data());
        o.meta = std::move(meta);
        o.cb = std::move(cb);
        o.file_fd = dup;
        o.file_off = off;
        o.file_len = len;
        seal(o);
        queued_bytes_ += o.meta.size() + kHeaderSize;
        q_.push_back(std::move(o));
        if (!writing_) write_next();
    }

    // A frame that carries `fd` (owned, closed once sent or dropped) as
    // SCM_RIGHTS with its first byte. Unix sockets only: elsewhere nothing
    // is sent and cb gets false.
    void send_with_fd(Header h, std::string meta, UniqueFd fd, Request::WriteDone cb) {
        if (closed_ || !unix_ || !fd.valid()) {
            if (cb) asio::post(io_, [cb] { cb(false); });
            return;
        }
        Out o;
        h.meta_len = static_cast<uint32_t>(meta.size());
        h.data_len = 0;
        encode_header(h, o.hdr.data());
        o.meta = std::move(meta);
        o.cb = std::move(cb);
        o.pass_fd = std::move(fd);
        seal(o);
        queued_bytes_ += o.meta.size() + kHeaderSize;
        q_.push_back(std::move(o));
        if (!writing_) write_next();
    }

    // True when the peer connected over a Unix socket (descriptors can pass).
    bool over_unix() const { return unix_; }

    void request_finished(uint32_t tag) {
        active_.erase(tag);
        maybe_resume();
    }

    void close() {
        if (closed_) return;
        closed_ = true;
        auto self = std::move(keep_alive_);  // alive to the end of close()
        if (paused_) server_.unwatch_hangup(sock_.native_handle());
        paused_ = false;
        asio::error_code ec;
        sock_.shutdown(asio::socket_base::shutdown_both, ec);
        sock_.close(ec);
        hello_timer_.cancel();
        auto active = std::move(active_);
        active_.clear();
        for (auto& [tag, r] : active) r->cancel(ECONNRESET);
        server_.forget(this);
    }

    const Peer& peer() const { return peer_; }
    std::string local_host() {
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        if (::getsockname(sock_.native_handle(), reinterpret_cast<sockaddr*>(&ss), &len) != 0)
            return "";
        char buf[INET6_ADDRSTRLEN] = {0};
        if (ss.ss_family == AF_INET)
            ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
        else if (ss.ss_family == AF_INET6)
            ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf,
                        sizeof buf);
        return buf;
    }

  private:
    uint64_t id_ = 0;
    struct Out {
        std::array<uint8_t, kHeaderSize> hdr;
        std::string meta;
        std::array<uint8_t, auth::kTagBytes> tag;
        bool tagged = false;  // the tag follows the meta (a keyed connection, once admitted)
        asio::const_buffer data;
        Request::WriteDone cb;
        int file_fd = -1;  // data from this file instead (owned: a dup)
        uint64_t file_off = 0;
        size_t file_len = 0;
        UniqueFd pass_fd;    // passed with the first byte (SCM_RIGHTS), then closed
        size_t fd_sent = 0;  // bytes of a frame with pass_fd already written
    };

    // Tags a frame about to be queued, once the peer is admitted on a keyed
    // connection. Frames leave in the order they are queued, which is the
    // order of the tags' sequence numbers.
    void seal(Out& o) {
        if (!tx_mac_.active()) return;
        tx_mac_.sign(o.hdr.data(), kHeaderSize, o.meta, o.tag.data());
        o.tagged = true;
    }
    static asio::const_buffer tag_of(const Out& o) {
        return asio::buffer(o.tag.data(), o.tagged ? o.tag.size() : 0);
    }

    void read_header() {
        auto self = shared_from_this();
        asio::async_read(sock_, asio::buffer(hdr_), [self](asio::error_code ec, size_t) {
            if (ec) return self->close();
            self->last_activity_ = std::chrono::steady_clock::now();
            Status s = decode_header(self->hdr_.data(), &self->h_);
            if (!s) {
                if (self->server_.peer_warning_allowed())
                    DYAD_WARN("rpc", "dropping connection: %s", s.to_string().c_str());
                // Tell a peer of another version why, then close.
                Header e;
                e.type = Type::error;
                e.errnum = EPROTO;
                nlohmann::json m = {{"msg", s.message()}, {"rc", static_cast<int>(DYAD_RC_BADRPC)}};
                self->send(e, m.dump(-1, ' ', false, kBadUtf8Replaced), {},
                           [self](bool) { self->close(); });
                return;
            }
            self->read_body();
        });
    }

    void read_body() {
        // Clients send no raw data (hello, request and cancel carry JSON only):
        // refusing it up front keeps a bare header from reserving 64 MiB.
        if (h_.data_len != 0) {
            protocol_error(h_.tag, "client frames carry no data");
            return;
        }
        // Before admission a frame is a hello: its meta is small, and a peer
        // the service does not know yet cannot make it reserve more.
        if (!hello_done_ && h_.meta_len > kMaxHelloMeta) {
            protocol_error(h_.tag, "a frame of " + std::to_string(h_.meta_len) +
                                       " bytes of meta before the hello is done; a hello may "
                                       "have at most " +
                                       std::to_string(kMaxHelloMeta));
            return;
        }
        meta_.resize(h_.meta_len);
        std::array<asio::mutable_buffer, 2> bufs = {
            asio::buffer(meta_),
            asio::buffer(rx_tag_.data(), rx_mac_.active() ? rx_tag_.size() : 0)};
        auto self = shared_from_this();
        asio::async_read(sock_, bufs, [self](asio::error_code ec, size_t) {
            if (ec) return self->close();
            if (!self->handle_frame()) return;
            if (self->overloaded()) {
                self->paused_ = true;  // resume when answers drain
                // No read is pending to keep the session alive meanwhile:
                // it keeps itself until it resumes or closes (else it would
                // go with its requests still in flight, never cancelled).
                self->keep_alive_ = self;
                self->server_.watch_hangup(self.get(), self->sock_.native_handle());
                return;
            }
            self->read_header();
        });
    }

    // Backpressure: a peer that keeps asking without reading the answers stops
    // being read once it has too many requests or too many queued bytes.
    bool overloaded() const {
        return active_.size() >= kMaxActive || queued_bytes_ >= kMaxQueuedBytes;
    }
    void maybe_resume() {
        if (paused_ && !closed_ && !overloaded()) {
            auto self = std::move(keep_alive_);
            paused_ = false;
            server_.unwatch_hangup(sock_.native_handle());
            read_header();
        }
    }

    void protocol_error(uint32_t tag, const std::string& msg) {
        Header e;
        e.type = Type::error;
        e.tag = tag;
        e.errnum = EPROTO;
        nlohmann::json m = {{"msg", msg}, {"rc", static_cast<int>(DYAD_RC_BADRPC)}};
        auto self = shared_from_this();
        send(e, m.dump(-1, ' ', false, kBadUtf8Replaced), {}, [self](bool) { self->close(); });
    }

    // Returns false when the session must stop reading.
    bool handle_frame() {
        if (rx_mac_.active() && !rx_mac_.check(hdr_.data(), kHeaderSize, meta_, rx_tag_.data())) {
            // Not the next frame the admitted peer sent: injected, replayed,
            // reordered or changed on the way. Nothing of it is acted on.
            server_.count_auth_refused();
            if (server_.peer_warning_allowed())
                DYAD_WARN("rpc",
                          "closing connection %llu (%s): frame %llu failed its authentication tag "
                          "(injected, replayed or changed on the way)",
                          static_cast<unsigned long long>(id_), peer_.key.c_str(),
                          static_cast<unsigned long long>(rx_mac_.frames()));
            close();
            return false;
        }
        std::string raw = std::move(meta_);
        meta_ = std::string();
        nlohmann::json meta = raw.empty() ? nlohmann::json(nullptr) : parse_meta(raw);
        if (hello_done_) raw = std::string();
        if (meta.is_discarded()) {
            protocol_error(h_.tag, "malformed JSON in frame");
            return false;
        }
        if (!hello_done_ && !over_cap_.empty()) {
            // (Counted by the server when it refused the connection.)
            if (server_.peer_warning_allowed())
                DYAD_WARN("rpc", "refused a connection of %s: %s", peer_.key.c_str(),
                          over_cap_.c_str());
            Header e;
            e.type = Type::error;
            e.errnum = EUSERS;
            nlohmann::json m = {{"msg", over_cap_}, {"rc", static_cast<int>(DYAD_RC_CONNFAIL)}};
            auto self = shared_from_this();
            send(e, m.dump(-1, ' ', false, kBadUtf8Replaced), {}, [self](bool) { self->close(); });
            return false;
        }
        if (!hello_done_) return handle_hello(std::move(raw), meta);
        switch (h_.type) {
            case Type::request: {
                if (!meta.is_object() || !meta.contains("topic") || !meta["topic"].is_string()) {
                    protocol_error(h_.tag, "request without a topic");
                    return false;
                }
                if (active_.count(h_.tag)) {
                    protocol_error(0, "tag " + std::to_string(h_.tag) + " already in use");
                    return false;
                }
                auto r = std::make_shared<Request>(weak_from_this(), io_, h_.tag, std::move(meta));
                std::string why;
                auto charge = server_.admit_request(*r, peer_.key, &why);
                if (!charge) {  // over the argument budget: refused, the connection goes on
                    Header e;
                    e.type = Type::error;
                    e.tag = h_.tag;
                    e.errnum = ENOBUFS;
                    nlohmann::json m = {{"msg", why}, {"rc", static_cast<int>(DYAD_RC_BADRPC)}};
                    send(e, m.dump(-1, ' ', false, kBadUtf8Replaced), {}, {});
                    return true;
                }
                r->hold(std::move(charge));
                r->set_peer(peer_);
                active_[h_.tag] = r;
                r->arm_deadline();
                server_.dispatch(r);
                return true;
            }
            case Type::cancel: {
                auto it = active_.find(h_.tag);
                if (it != active_.end()) {
                    auto r = it->second;
                    active_.erase(it);
                    r->cancel(ECANCELED);
                }
                return true;
            }
            case Type::update: {
                // Late updates (the request already finished) are dropped.
                auto it = active_.find(h_.tag);
                if (it != active_.end()) it->second->deliver_update(meta);
                return true;
            }
            default:
                protocol_error(h_.tag, std::string("unexpected ") + type_name(h_.type) +
                                           " frame from a client");
                return false;
        }
    }

    // The hello exchange (docs/wire-protocol.md section 4). Nothing about
    // this service is said before the peer is admitted: a refused peer gets
    // one error frame ("authentication required" and why) and the close.
    bool handle_hello(std::string raw, const nlohmann::json& meta) {
        const AuthPolicy& auth = server_.auth();
        if (h_.type != Type::hello || !meta.is_object()) {
            if (auth.key || awaiting_proof_ || h_.type == Type::hello)
                return refuse(h_.type == Type::hello
                                  ? "authentication required: malformed hello"
                                  : "authentication required: the first frame must be a hello");
            protocol_error(h_.tag, "first frame must be hello");
            return false;
        }
        if (awaiting_proof_) {
            auto p = meta.find("proof");
            if (p == meta.end() || !p->is_string() ||
                !auth.key->verify(p->get<std::string>(), "dyad client",
                                  {client_hello_, challenge_, service_proof_}))
                return refuse(
                    "authentication failed: the peer does not hold this service's key, or its "
                    "hello was not the one this service answered (check DYAD_AUTH_KEY_FILE: it "
                    "must be the file dyadd was given with --auth-key; and that nothing relays "
                    "the connection)");
            peer_.authenticated = true;
            // From here on, every frame each way carries a tag under its
            // direction's key, derived from this connection's transcript.
            rx_mac_ = auth::FrameMac(
                auth.key->derive("dyad client to service", {client_hello_, challenge_}));
            tx_mac_ = auth::FrameMac(
                auth.key->derive("dyad service to client", {client_hello_, challenge_}));
            return admit();
        }
        peer_.pid = meta.contains("pid") && meta["pid"].is_number_integer()
                        ? meta["pid"].get<int64_t>()
                        : 0;
        auto role = meta.find("role");
        if (role != meta.end() && role->is_string() && role->get<std::string>() == "service") {
            auto id = meta.find("service_id");
            if (id == meta.end() || !id->is_string() || id->get<std::string>().empty() ||
                id->get<std::string>().size() > 255)
                return refuse("a service's hello must carry its service_id");
            peer_.role = "service";
            peer_.service_id = id->get<std::string>();
        }
        if (!check_uid()) return false;
        // A client that names the service it wants talks to that one only.
        const std::string own_id = server_.hello_info().value("service_id", std::string());
        auto expect = meta.find("expect");
        if (expect != meta.end() && (!expect->is_string() || expect->get<std::string>() != own_id))
            return refuse(
                "this is not the service the client expected (it asked for another service id): "
                "check the URI it was given (DYAD_SERVICE_URI) or the record's endpoint");
        if (!auth.key) return admit();
        auto n = meta.find("nonce");
        if (n == meta.end() || !n->is_string() || !auth::valid_nonce(n->get<std::string>()))
            return refuse(
                "authentication required: this service accepts only peers that hold the job's "
                "key (set DYAD_AUTH_KEY_FILE)");
        // The challenge says who this service is and how it sees the
        // connection; its proof covers the client's hello as received and
        // the challenge as sent, so a relay can change neither.
        nlohmann::json binding = nlohmann::json::object();
        if (unix_) {
            binding["pid"] = static_cast<int64_t>(::getpid());
        } else {
            binding["local"] = socket_endpoint(sock_.native_handle(), false);
            binding["peer"] = socket_endpoint(sock_.native_handle(), true);
        }
        nlohmann::json challenge = {{"auth", auth::kScheme},
                                    {"binding", std::move(binding)},
                                    {"nonce", auth::new_nonce()},
                                    {"service_id", own_id},
                                    {"wire_version", kVersion}};
        client_hello_ = std::move(raw);
        challenge_ = challenge.dump(-1, ' ', false, kBadUtf8Replaced);
        service_proof_ = auth.key->proof("dyad service", {client_hello_, challenge_});
        awaiting_proof_ = true;
        Header r;
        r.type = Type::hello;
        nlohmann::json sent = {
            {"auth", auth::kScheme}, {"challenge", challenge_}, {"proof", service_proof_}};
        send(r, sent.dump(-1, ' ', false, kBadUtf8Replaced), {}, {});
        return true;
    }

    // Unix socket peers: the kernel says who they are.
    bool check_uid() {
        if (!unix_) return true;
        struct ucred cred {};
        socklen_t cl = sizeof cred;
        if (::getsockopt(sock_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0)
            return refuse("cannot tell who the peer on the Unix socket is");
        peer_.uid = cred.uid;
        const AuthPolicy& auth = server_.auth();
        if (auth.any_uid || cred.uid == 0 || cred.uid == ::geteuid() ||
            std::find(auth.uids.begin(), auth.uids.end(), cred.uid) != auth.uids.end())
            return true;
        return refuse("uid " + std::to_string(cred.uid) +
                      " may not use this service's Unix socket (it serves uid " +
                      std::to_string(::geteuid()) + " and root; see dyadd --allow-uid)");
    }

    bool admit() {
        hello_done_ = true;
        awaiting_proof_ = false;
        client_hello_ = std::string();
        challenge_ = std::string();
        service_proof_ = std::string();
        hello_timer_.cancel();
        last_activity_ = std::chrono::steady_clock::now();
        arm_idle(server_.idle_timeout());
        Header r;
        r.type = Type::hello;
        nlohmann::json info = server_.hello_info();
        info["auth"] = server_.auth().key ? auth::kScheme : "none";
        send(r, info.dump(-1, ' ', false, kBadUtf8Replaced), {}, {});
        return true;
    }

    // The idle timeout (Server::set_idle_timeout), on the hello's timer once
    // the hello is done: a connection with a request in flight, or answers
    // still going out, is never idle; one without is closed once `limit`
    // passed since its last frame in or out.
    void arm_idle(std::chrono::milliseconds wait) {
        const auto limit = server_.idle_timeout();
        if (closed_ || limit.count() <= 0) return;
        std::weak_ptr<Session> weak = shared_from_this();
        hello_timer_.expires_after(wait);
        hello_timer_.async_wait([weak, limit](asio::error_code ec) {
            auto self = weak.lock();
            if (ec || !self || self->closed_) return;
            if (!self->active_.empty() || self->writing_ || !self->q_.empty())
                return self->arm_idle(limit);
            auto idle = std::chrono::steady_clock::now() - self->last_activity_;
            if (idle < limit)
                return self->arm_idle(
                    std::chrono::duration_cast<std::chrono::milliseconds>(limit - idle) +
                    std::chrono::milliseconds(1));
            DYAD_DEBUG("rpc", "closing connection %llu (%s, pid %lld): idle for %lld ms",
                       static_cast<unsigned long long>(self->id_), self->peer_.address.c_str(),
                       static_cast<long long>(self->peer_.pid),
                       static_cast<long long>(limit.count()));
            self->server_.count_idle_closed();
            self->close();
        });
    }

    bool refuse(const std::string& msg) {
        server_.count_auth_refused();
        if (server_.peer_warning_allowed())
            DYAD_WARN("rpc", "refused a peer (pid %lld): %s", static_cast<long long>(peer_.pid),
                      msg.c_str());
        Header e;
        e.type = Type::error;
        e.errnum = EACCES;
        nlohmann::json m = {{"msg", msg}, {"rc", static_cast<int>(DYAD_RC_NOAUTH)}};
        auto self = shared_from_this();
        send(e, m.dump(-1, ' ', false, kBadUtf8Replaced), {}, [self](bool) { self->close(); });
        return false;
    }

    // asio's transfer_all offers the socket at most 64 KiB per write (its
    // default_max_transfer_size): a 1 MiB chunk took 17 sendmsg calls, each
    // with a trip through the event loop. Offer everything; the kernel takes
    // what fits in the send buffer.
    static size_t all_at_once(const asio::error_code& ec, size_t) {
        return ec ? 0 : std::numeric_limits<int32_t>::max();
    }

    void write_next() {
        writing_ = true;
        Out& o = q_.front();
        if (o.pass_fd.valid()) return write_with_fd();
        auto self = shared_from_this();
        if (o.file_fd >= 0) {
            std::array<asio::const_buffer, 3> bufs = {asio::buffer(o.hdr), asio::buffer(o.meta),
                                                      tag_of(o)};
            asio::async_write(sock_, bufs, all_at_once, [self](asio::error_code ec, size_t) {
                if (!ec) return self->write_file_data();
                self->front_written(ec);
            });
            return;
        }
        // Frames queued together leave in one write (a small file's answer
        // and its END; answers of several requests): at most kGatherFrames
        // frames or kGatherBytes bytes, and never past a frame that carries
        // a descriptor or file data.
        constexpr size_t kGatherFrames = 64, kGatherBytes = 4u << 20;
        std::vector<asio::const_buffer> bufs;
        size_t frames = 0, bytes = 0;
        for (const Out& f : q_) {
            if (f.pass_fd.valid() || f.file_fd >= 0) break;
            size_t n = kHeaderSize + f.meta.size() + tag_of(f).size() + f.data.size();
            if (frames > 0 && (frames == kGatherFrames || bytes + n > kGatherBytes)) break;
            bufs.push_back(asio::buffer(f.hdr));
            if (!f.meta.empty()) bufs.push_back(asio::buffer(f.meta));
            if (f.tagged) bufs.push_back(tag_of(f));
            if (f.data.size()) bufs.push_back(f.data);
            ++frames;
            bytes += n;
        }
        asio::async_write(sock_, bufs, all_at_once, [self, frames](asio::error_code ec, size_t) {
            self->frames_written(frames, ec);
        });
    }

    // The data of a file frame: sendfile until done, waiting for the socket
    // to take more when it is full. A short file cannot complete the frame
    // it announced: the connection is closed (the consumer sees the error).
    void write_file_data() {
        write_until_done(
            [this] {
                Out& o = q_.front();
                if (o.file_len == 0) return ssize_t(0);
                off_t off = static_cast<off_t>(o.file_off);
                ssize_t n = ::sendfile(sock_.native_handle(), o.file_fd, &off,
                                       std::min<size_t>(o.file_len, 1u << 30));
                if (n > 0) {
                    o.file_off += static_cast<uint64_t>(n);
                    o.file_len -= static_cast<size_t>(n);
                }
                return n;
            },
            [this] { return q_.front().file_len == 0; }, &Session::write_file_data);
    }

    // Drives one non-blocking write of the front frame: `step` writes once
    // (and books what it wrote), returning the syscall's result; `done` says
    // when the frame is out. A full socket is waited for on the loop, then
    // `resume` carries on; an error or EOF ends the frame (front_written).
    template <class Step, class Done>
    void write_until_done(Step step, Done done, void (Session::*resume)()) {
        asio::error_code ec;
        if (!sock_.native_non_blocking()) sock_.native_non_blocking(true, ec);
        while (!ec && !done()) {
            ssize_t n = step();
            if (n > 0 || (n < 0 && errno == EINTR)) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                auto self = shared_from_this();
                sock_.async_wait(asio::socket_base::wait_write, [self, resume](asio::error_code e) {
                    if (e) return self->front_written(e);
                    ((*self).*resume)();
                });
                return;
            }
            ec = n == 0 ? asio::error::eof
                        : asio::error_code(errno, asio::error::get_system_category());
        }
        front_written(ec);
    }

    void write_with_fd() {
        const size_t total = kHeaderSize + q_.front().meta.size() + tag_of(q_.front()).size();
        write_until_done(
            [this] {
                Out& o = q_.front();
                struct iovec iov[3];
                size_t n = 0;
                // The frame's parts in order (header, meta, tag), from
                // what is already out.
                size_t skip = o.fd_sent;
                auto part = [&](const void* p, size_t len) {
                    if (skip >= len) {
                        skip -= len;
                        return;
                    }
                    iov[n].iov_base = const_cast<char*>(static_cast<const char*>(p)) + skip;
                    iov[n++].iov_len = len - skip;
                    skip = 0;
                };
                part(o.hdr.data(), kHeaderSize);
                part(o.meta.data(), o.meta.size());
                part(o.tag.data(), tag_of(o).size());
                struct msghdr msg = {};
                msg.msg_iov = iov;
                msg.msg_iovlen = n;
                union {
                    struct cmsghdr align;
                    char buf[CMSG_SPACE(sizeof(int))];
                } ctl;
                if (o.pass_fd.valid()) {
                    std::memset(&ctl, 0, sizeof ctl);
                    msg.msg_control = ctl.buf;
                    msg.msg_controllen = sizeof ctl.buf;
                    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
                    c->cmsg_level = SOL_SOCKET;
                    c->cmsg_type = SCM_RIGHTS;
                    c->cmsg_len = CMSG_LEN(sizeof(int));
                    int fd = o.pass_fd.get();
                    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
                }
                ssize_t w = ::sendmsg(sock_.native_handle(), &msg, MSG_NOSIGNAL);
                if (w > 0) {
                    o.fd_sent += static_cast<size_t>(w);
                    o.pass_fd.reset();  // it went with these bytes
                }
                return w;
            },
            [this, total] { return q_.front().fd_sent >= total; }, &Session::write_with_fd);
    }

    void front_written(asio::error_code ec) { frames_written(1, ec); }

    // The first `frames` frames of the queue are out (or failed with ec).
    void frames_written(size_t frames, asio::error_code ec) {
        last_activity_ = std::chrono::steady_clock::now();
        std::vector<Out> done;
        done.reserve(frames);
        for (size_t i = 0; i < frames && !q_.empty(); ++i) {
            done.push_back(std::move(q_.front()));
            q_.pop_front();
        }
        for (Out& d : done) {
            if (d.file_fd >= 0) ::close(d.file_fd);
            queued_bytes_ -= d.meta.size() + kHeaderSize;
            if (d.cb) d.cb(!ec);
        }
        if (ec) {
            close();
            auto rest = std::move(q_);
            q_.clear();
            for (auto& o : rest) {
                if (o.file_fd >= 0) ::close(o.file_fd);
                if (o.cb) o.cb(false);
            }
            writing_ = false;
            return;
        }
        if (!q_.empty())
            write_next();
        else
            writing_ = false;
        maybe_resume();
    }

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
    bool closed_ = false;
    bool writing_ = false;
    bool unix_ = false;                    // a Unix socket: descriptors can pass
    std::string over_cap_;                 // non-empty: refused (its peer has too many connections)
    std::shared_ptr<Session> keep_alive_;  // itself, while paused
    Peer peer_;
    std::deque<Out> q_;
    std::unordered_map<uint32_t, std::shared_ptr<Request>> active_;
};

}  // namespace dyad::rpc
