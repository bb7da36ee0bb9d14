// SPDX-License-Identifier: Apache-2.0
// A connection's life: reading frames, dispatching requests, flow control
// (a peer that does not read its answers stops being read), the hello's
// deadline and then the idle timeout, and the close that cancels what is
// left. The hello itself: session_hello.cpp; the writes: session_write.cpp.
#include "session.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>

#include "common/json_text.hpp"
#include "common/log.hpp"
#include "principal.hpp"

namespace dyad::rpc {

Session::Session(Server& srv, asio::io_context& io, asio::generic::stream_protocol::socket s)
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
    peer_.local = who.local;
    peer_.gid = who.gid;
    if (!who.groups.empty())
        peer_.groups = std::make_shared<const std::vector<uint32_t>>(std::move(who.groups));
}

void Session::peer_hung_up() {
    DYAD_DEBUG("rpc", "connection %llu (%s): the peer hung up while it was not read",
               static_cast<unsigned long long>(id_), peer_.key.c_str());
    close();
}

void Session::start() {
    // A peer gets kHelloAdmitTimeout to say hello (kRefusalTimeout to hear
    // why it is refused); then it is dropped.
    std::weak_ptr<Session> weak = shared_from_this();
    hello_timer_.expires_after(over_cap_.empty()
                                   ? std::chrono::steady_clock::duration(kHelloAdmitTimeout)
                                   : kRefusalTimeout);
    hello_timer_.async_wait([weak](asio::error_code ec) {
        auto self = weak.lock();
        if (!ec && self && !self->hello_done_) self->close();
    });
    read_header();
}

void Session::request_finished(uint32_t tag) {
    active_.erase(tag);
    maybe_resume();
}

void Session::close() {
    if (closed_) return;
    auto self = std::move(keep_alive_);  // alive to the end of close()
    if (paused_) server_.unwatch_hangup(sock_.native_handle());
    paused_ = false;
    {
        // Not while send_now writes to the socket from another thread.
        std::lock_guard<std::mutex> lk(wmu_);
        closed_ = true;
        asio::error_code ec;
        sock_.shutdown(asio::socket_base::shutdown_both, ec);
        sock_.close(ec);
    }
    hello_timer_.cancel();
    auto active = std::move(active_);
    active_.clear();
    for (auto& [tag, r] : active) r->cancel(ECONNRESET);
    server_.forget(this);
}

std::string Session::local_host() {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getsockname(sock_.native_handle(), reinterpret_cast<sockaddr*>(&ss), &len) != 0)
        return "";
    char buf[INET6_ADDRSTRLEN] = {0};
    if (ss.ss_family == AF_INET)
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
    else if (ss.ss_family == AF_INET6)
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
    return buf;
}

void Session::read_header() {
    rx_file_.reset();
    // On a Unix socket a descriptor may come with a frame's first byte:
    // headers are read with recvmsg there (session_fd.cpp).
    if (unix_) return read_header_unix(0);
    auto self = shared_from_this();
    asio::async_read(sock_, asio::buffer(hdr_), [self](asio::error_code ec, size_t) {
        if (ec) return self->close();
        self->header_read();
    });
}

void Session::header_read() {
    last_activity_ = std::chrono::steady_clock::now();
    Status s = decode_header(hdr_.data(), &h_);
    if (!s) {
        if (server_.peer_warning_allowed())
            DYAD_WARN("rpc", "dropping connection: %s", s.to_string().c_str());
        // Tell a peer of another version why, then close.
        send_error(0, EPROTO, s.message(), DYAD_RC_BADRPC, true);
        return;
    }
    read_body();
}

void Session::read_body() {
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
        asio::buffer(meta_), asio::buffer(rx_tag_.data(), rx_mac_.active() ? rx_tag_.size() : 0)};
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

bool Session::overloaded() {
    std::lock_guard<std::mutex> lk(wmu_);
    return active_.size() >= kMaxActive || queued_bytes_ >= kMaxQueuedBytes;
}

void Session::maybe_resume() {
    if (paused_ && !closed_ && !overloaded()) {
        auto self = std::move(keep_alive_);
        paused_ = false;
        server_.unwatch_hangup(sock_.native_handle());
        read_header();
    }
}

void Session::send_error(uint32_t tag, int errnum, const std::string& msg, dyad_rc_t rc,
                         bool then_close) {
    Header e;
    e.type = Type::error;
    e.tag = tag;
    e.errnum = errnum;
    nlohmann::json m = {{"msg", msg}, {"rc", static_cast<int>(rc)}};
    Request::WriteDone done;
    if (then_close) done = [self = shared_from_this()](bool) { self->close(); };
    send(e, m.dump(-1, ' ', false, kBadUtf8Replaced), {}, std::move(done));
}

void Session::protocol_error(uint32_t tag, const std::string& msg) {
    send_error(tag, EPROTO, msg, DYAD_RC_BADRPC, true);
}

bool Session::handle_frame() {
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
        send_error(0, EUSERS, over_cap_, DYAD_RC_CONNFAIL, true);
        return false;
    }
    if (!hello_done_) return handle_hello(std::move(raw), meta);
    switch (h_.type) {
        case Type::request:
            return handle_request(std::move(meta));
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
            protocol_error(
                h_.tag, std::string("unexpected ") + type_name(h_.type) + " frame from a client");
            return false;
    }
}

bool Session::handle_request(nlohmann::json meta) {
    auto topic = meta.is_object() ? meta.find("topic") : meta.end();
    if (!meta.is_object() || topic == meta.end() || !topic->is_string()) {
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
        send_error(h_.tag, ENOBUFS, why, DYAD_RC_BADRPC, false);
        return true;
    }
    r->hold(std::move(charge));
    r->set_peer(peer_);
    r->set_passed_file(rx_file_);
    rx_file_.reset();
    active_[h_.tag] = r;
    r->arm_deadline();
    server_.dispatch(r);
    return true;
}

void Session::arm_idle(std::chrono::milliseconds wait) {
    // A connection with a request in flight, or answers still going out,
    // is never idle; one without is closed once `limit` passed since its
    // last frame in or out.
    const auto limit = server_.idle_timeout();
    if (closed_ || limit.count() <= 0) return;
    std::weak_ptr<Session> weak = shared_from_this();
    hello_timer_.expires_after(wait);
    hello_timer_.async_wait([weak, limit](asio::error_code ec) {
        auto self = weak.lock();
        if (ec || !self || self->closed_) return;
        if (!self->active_.empty() || self->sending()) return self->arm_idle(limit);
        auto idle = std::chrono::steady_clock::now() - self->last_activity_;
        if (idle < limit)
            return self->arm_idle(
                std::chrono::duration_cast<std::chrono::milliseconds>(limit - idle) +
                std::chrono::milliseconds(1));
        DYAD_DEBUG("rpc", "closing connection %llu (%s, pid %lld): idle for %lld ms",
                   static_cast<unsigned long long>(self->id_), self->peer_.address.c_str(),
                   static_cast<long long>(self->peer_.pid), static_cast<long long>(limit.count()));
        self->server_.count_idle_closed();
        self->close();
    });
}

}  // namespace dyad::rpc
