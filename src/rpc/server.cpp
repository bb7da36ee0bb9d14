// SPDX-License-Identifier: Apache-2.0
// The rpc server: listeners, sessions, dispatch by topic.
#include "session.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>

namespace dyad::rpc {

Server::Server(asio::io_context& io, nlohmann::json hello_info)
    : io_(io),
      hello_info_(std::move(hello_info)),
      max_sessions_(kMaxSessions),
      reserved_sessions_(kReservedSessions),
      retry_tcp_(io),
      retry_unix_(io) {}

Server::~Server() {
    stop();
}

Result<std::string> Server::listen_tcp(const std::string& host, uint16_t port) {
    asio::error_code ec;
    auto addr = asio::ip::make_address(host, ec);
    if (ec) {
        asio::ip::tcp::resolver res(io_);
        auto eps = res.resolve(host, std::to_string(port), ec);
        if (ec || eps.empty())
            return Status(DYAD_RC_CONNFAIL,
                          "cannot resolve listen address '" + host + "': " + ec.message(), EINVAL);
        addr = eps.begin()->endpoint().address();
    }
    asio::ip::tcp::endpoint ep(addr, port);
    auto acc = std::make_unique<asio::ip::tcp::acceptor>(io_);
    acc->open(ep.protocol(), ec);
    if (!ec) acc->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acc->bind(ep, ec);
    if (!ec && !deferred_) acc->listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
        return Status(DYAD_RC_CONNFAIL,
                      "cannot listen on " + host + ":" + std::to_string(port) + ": " +
                          ec.message() +
                          " (is another dyadd running there? choose another --listen)",
                      ec.value());
    auto local = acc->local_endpoint(ec);
    tcp_ = std::move(acc);
    if (!deferred_) accept_tcp();
    std::string h = local.address().is_v6() ? "[" + local.address().to_string() + "]"
                                            : local.address().to_string();
    return "tcp://" + h + ":" + std::to_string(local.port());
}

Result<std::string> Server::listen_unix(const std::string& path) {
    asio::error_code ec;
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(path.c_str());
    auto acc = std::make_unique<asio::local::stream_protocol::acceptor>(io_);
    asio::local::stream_protocol::endpoint ep(path);
    acc->open(ep.protocol(), ec);
    if (!ec) acc->bind(ep, ec);
    if (ec)
        return Status(DYAD_RC_CONNFAIL,
                      "cannot listen on unix socket '" + path + "': " + ec.message(), ec.value());
    return take_unix(std::move(acc), path);
}

// A bound Unix acceptor: listening unless deferred, then ours.
Result<std::string> Server::take_unix(std::unique_ptr<asio::local::stream_protocol::acceptor> acc,
                                      const std::string& path) {
    asio::error_code ec;
    if (!deferred_) acc->listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
        return Status(DYAD_RC_CONNFAIL,
                      "cannot listen on unix socket '" + path + "': " + ec.message(), ec.value());
    unix_ = std::move(acc);
    unix_path_ = path;
    if (!deferred_) accept_unix();
    return "unix:" + path;
}

Result<std::string> Server::adopt_tcp(int fd, uint16_t port) {
    struct sockaddr_storage ss = {};
    socklen_t len = sizeof ss;
    int type = 0;
    socklen_t tlen = sizeof type;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
        ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_STREAM ||
        (ss.ss_family != AF_INET && ss.ss_family != AF_INET6))
        return Status(DYAD_RC_CONNFAIL,
                      "descriptor " + std::to_string(fd) + " is not a bound TCP socket", EBADF);
    asio::error_code ec;
    auto acc = std::make_unique<asio::ip::tcp::acceptor>(io_);
    acc->assign(ss.ss_family == AF_INET ? asio::ip::tcp::v4() : asio::ip::tcp::v6(), fd, ec);
    auto local = ec ? asio::ip::tcp::endpoint() : acc->local_endpoint(ec);
    if (ec)
        return Status(DYAD_RC_CONNFAIL,
                      "cannot take over descriptor " + std::to_string(fd) + ": " + ec.message(),
                      ec.value());
    if (port != 0 && local.port() != port) {
        acc->release(ec);  // (the descriptor stays the caller's)
        return Status(DYAD_RC_CONNFAIL,
                      "descriptor " + std::to_string(fd) + " is bound to port " +
                          std::to_string(local.port()) + ", not " + std::to_string(port),
                      EINVAL);
    }
    tcp_ = std::move(acc);
    if (!deferred_) accept_tcp();
    std::string h = local.address().is_v6() ? "[" + local.address().to_string() + "]"
                                            : local.address().to_string();
    return "tcp://" + h + ":" + std::to_string(local.port());
}

Result<std::string> Server::adopt_unix(int fd, const std::string& path) {
    struct sockaddr_un sa = {};
    socklen_t len = sizeof sa;
    int type = 0;
    socklen_t tlen = sizeof type;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0 ||
        ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_STREAM ||
        sa.sun_family != AF_UNIX ||
        std::string(sa.sun_path, ::strnlen(sa.sun_path, sizeof sa.sun_path)) != path)
        return Status(
            DYAD_RC_CONNFAIL,
            "descriptor " + std::to_string(fd) + " is not a Unix socket bound to '" + path + "'",
            EBADF);
    asio::error_code ec;
    auto acc = std::make_unique<asio::local::stream_protocol::acceptor>(io_);
    acc->assign(asio::local::stream_protocol(), fd, ec);
    if (ec)
        return Status(DYAD_RC_CONNFAIL,
                      "cannot take over descriptor " + std::to_string(fd) + ": " + ec.message(),
                      ec.value());
    // (Listened on here: its peer credentials are then this process's.)
    return take_unix(std::move(acc), path);
}

Status Server::start_accepting() {
    if (!deferred_) return Status::ok();
    deferred_ = false;
    asio::error_code ec;
    if (unix_) {
        unix_->listen(asio::socket_base::max_listen_connections, ec);
        if (ec)
            return Status(DYAD_RC_CONNFAIL,
                          "cannot listen on unix socket '" + unix_path_ + "': " + ec.message(),
                          ec.value());
        accept_unix();
    }
    if (tcp_) {
        tcp_->listen(asio::socket_base::max_listen_connections, ec);
        if (ec)
            return Status(DYAD_RC_CONNFAIL, "cannot listen on TCP: " + ec.message(), ec.value());
        accept_tcp();
    }
    return Status::ok();
}

void Server::handle(const std::string& topic, Handler h) {
    handlers_[topic].handler = std::move(h);
}

void Server::reads_args(const std::string& topic, std::vector<std::string> args) {
    handlers_[topic].args = std::move(args);
}

void Server::set_request_bytes(uint64_t per_peer, uint64_t total) {
    std::lock_guard<std::mutex> lk(args_->mu);
    args_->per_peer = per_peer;
    args_->total = total;
}

uint64_t Server::refused_request_bytes_peer() const {
    std::lock_guard<std::mutex> lk(args_->mu);
    return args_->refused_peer;
}

uint64_t Server::refused_request_bytes_total() const {
    std::lock_guard<std::mutex> lk(args_->mu);
    return args_->refused_total;
}

nlohmann::json Server::request_bytes_stats() const {
    std::lock_guard<std::mutex> lk(args_->mu);
    uint64_t most = 0;
    for (const auto& [who, n] : args_->by_peer) most = std::max(most, n);
    return {{"held", args_->held}, {"busiest_peer", most}};
}

namespace {
// About the memory a parsed JSON value holds: its own 16 bytes, a string's
// object and characters, a container's header, an object member's tree
// node and key (a padded request is charged for what it costs, however
// small its text: 1 MiB of "[0,0,...]" holds 8 MiB).
uint64_t json_footprint(const nlohmann::json& v) {
    uint64_t n = 16;
    switch (v.type()) {
        case nlohmann::json::value_t::string:
            return n + 48 + v.get_ref<const std::string&>().size();
        case nlohmann::json::value_t::binary:
            return n + 48 + v.get_binary().size();
        case nlohmann::json::value_t::array:
            n += 32;
            for (const auto& e : v) n += json_footprint(e);
            return n;
        case nlohmann::json::value_t::object:
            n += 48;
            for (auto e = v.begin(); e != v.end(); ++e)
                n += 80 + e.key().size() + json_footprint(e.value());
            return n;
        default:
            return n;
    }
}
}  // namespace

std::shared_ptr<void> Server::admit_request(Request& r, const std::string& peer, std::string* why) {
    // What the request keeps: what its handler reads (else everything the
    // peer sent), as the service holds it in memory.
    auto it = handlers_.find(r.topic());
    if (it != handlers_.end() && !it->second.args.empty()) r.keep_only(it->second.args);
    const uint64_t bytes = json_footprint(r.args()) + kRequestOverhead;
    std::shared_ptr<ArgUse> use = args_;
    std::lock_guard<std::mutex> lk(use->mu);
    uint64_t& mine = use->by_peer[peer];
    std::string over;
    if (use->per_peer && mine + bytes > use->per_peer) {
        ++use->refused_peer;
        over = "its requests in progress hold " + std::to_string(mine) +
               " bytes of arguments, and this one " + std::to_string(bytes) + " more than the " +
               std::to_string(use->per_peer) +
               " one peer may hold (dyadd --max-request-bytes-per-peer)";
    } else if (use->total && use->held + bytes > use->total) {
        ++use->refused_total;
        over = "the requests in progress of all peers hold " + std::to_string(use->held) +
               " bytes of arguments, and this one " + std::to_string(bytes) + " more than the " +
               std::to_string(use->total) + " the service holds (dyadd --max-request-bytes)";
    }
    if (!over.empty()) {
        if (mine == 0) use->by_peer.erase(peer);
        *why = "the service refused a " + r.topic() + " request of " + peer + ": " + over +
               "; wait for those requests to end, or start dyadd with a larger cap";
        if (peer_warning_allowed()) DYAD_WARN("rpc", "%s", why->c_str());
        return nullptr;
    }
    mine += bytes;
    use->held += bytes;
    return std::shared_ptr<void>(new int(0), [use, peer, bytes](int* p) {
        delete p;
        std::lock_guard<std::mutex> g(use->mu);
        use->held -= std::min(use->held, bytes);
        auto m = use->by_peer.find(peer);
        if (m == use->by_peer.end()) return;
        m->second -= std::min(m->second, bytes);
        if (m->second == 0) use->by_peer.erase(m);
    });
}

void Server::set_max_connections(size_t n, size_t reserved) {
    max_sessions_ = n;
    reserved_sessions_ = std::min(reserved, n);
}

void Server::accept_tcp() {
    tcp_->async_accept([this](asio::error_code ec, asio::ip::tcp::socket s) {
        if (stopped_) return;
        if (!ec) {
            s.set_option(asio::ip::tcp::no_delay(true), ec);
            start_session(asio::generic::stream_protocol::socket(std::move(s)));
        } else if (ec == asio::error::operation_aborted) {
            return;
        } else {
            // Out of fds (EMFILE) and the like: back off instead of spinning.
            DYAD_WARN("rpc", "accept failed: %s; retrying in 100 ms", ec.message().c_str());
            retry_tcp_.expires_after(std::chrono::milliseconds(100));
            retry_tcp_.async_wait([this](asio::error_code e) {
                if (!e && !stopped_) accept_tcp();
            });
            return;
        }
        accept_tcp();
    });
}

void Server::accept_unix() {
    unix_->async_accept([this](asio::error_code ec, asio::local::stream_protocol::socket s) {
        if (stopped_) return;
        if (!ec) {
            start_session(asio::generic::stream_protocol::socket(std::move(s)));
        } else if (ec == asio::error::operation_aborted) {
            return;
        } else {
            // Out of fds (EMFILE) and the like: back off instead of spinning.
            DYAD_WARN("rpc", "accept failed: %s; retrying in 100 ms", ec.message().c_str());
            retry_unix_.expires_after(std::chrono::milliseconds(100));
            retry_unix_.async_wait([this](asio::error_code e) {
                if (!e && !stopped_) accept_unix();
            });
            return;
        }
        accept_unix();
    });
}

void Server::start_session(asio::generic::stream_protocol::socket sock) {
    if (sessions_.size() >= max_sessions_) {
        ++connections_refused_;
        if (peer_warning_allowed())
            DYAD_WARN("rpc", "refusing a connection: %zu connections already", max_sessions_);
        return;  // the socket closes here
    }
    auto s = std::make_shared<Session>(*this, io_, std::move(sock));
    const std::string& who = s->peer().key;
    // The last reserved_sessions_ slots: for the service's own uid and root
    // (its `dyad service status`), and with a key for one connection per
    // other peer at a time, which must prove the key within
    // kRefusalTimeout. A table full of others' connections locks none of
    // them out.
    if (sessions_.size() + reserved_sessions_ >= max_sessions_ && !s->peer().trusted) {
        if (!auth_.key || in_reserve_[who] > 0) {
            if (in_reserve_[who] == 0) in_reserve_.erase(who);
            ++connections_refused_;
            if (peer_warning_allowed())
                DYAD_WARN("rpc",
                          "refusing a connection of %s: %zu connections open, the last %zu "
                          "slots are kept for the service's own uid%s",
                          who.c_str(), sessions_.size(), reserved_sessions_,
                          auth_.key ? " and one connection of each peer that holds the key" : "");
            return;  // the socket closes here
        }
        ++in_reserve_[who];
        reserve_holders_[s.get()] = who;
        auto timer = std::make_shared<asio::steady_timer>(io_, kRefusalTimeout);
        std::weak_ptr<Session> weak = s;
        timer->async_wait([timer, weak](asio::error_code ec) {
            auto self = weak.lock();
            if (!ec && self && !self->peer().authenticated) self->close();
        });
    }
    if (sessions_.size() + reserved_sessions_ >= max_sessions_) ++reserved_admitted_;
    size_t& mine = peer_connections_[who];
    if (max_per_peer_ > 0 && mine >= max_per_peer_) {
        ++refused_peer_connections_;
        if (mine == 0) peer_connections_.erase(who);
        // A few refused connections wait (kRefusalTimeout) to be told why;
        // more than that close at once, so a peer at its cap cannot fill the
        // service's table with connections that never speak.
        size_t& told = refusing_[who];
        if (told >= kMaxRefusalsPerPeer) {
            if (peer_warning_allowed())
                DYAD_WARN("rpc",
                          "closed a connection of %s at once: it is over its cap with %zu "
                          "refused connections still open",
                          who.c_str(), told);
            return;  // the socket closes here
        }
        ++told;
        s->refuse_at_hello("too many connections from " + who + ": it has " +
                           std::to_string(max_per_peer_) +
                           " open to this service, the most one peer may have (dyadd "
                           "--max-connections-per-peer); close some (idle ones are closed after "
                           "dyadd --idle-timeout) or start dyadd with a larger cap");
    } else {
        ++mine;
    }
    sessions_[s.get()] = s;
    s->start();
}

void Server::forget(Session* s) {
    if (sessions_.erase(s) == 0) return;
    if (auto h = reserve_holders_.find(s); h != reserve_holders_.end()) {
        auto r = in_reserve_.find(h->second);
        if (r != in_reserve_.end() && --r->second == 0) in_reserve_.erase(r);
        reserve_holders_.erase(h);
    }
    if (!s->counted()) {
        auto r = refusing_.find(s->peer().key);
        if (r != refusing_.end() && --r->second == 0) refusing_.erase(r);
        return;
    }
    auto it = peer_connections_.find(s->peer().key);
    if (it != peer_connections_.end() && --it->second == 0) peer_connections_.erase(it);
}

size_t Server::busiest_peer_connections() const {
    size_t most = 0;
    for (const auto& [who, n] : peer_connections_) most = std::max(most, n);
    return most;
}

// One epoll set for the sockets of paused sessions, watched for EPOLLRDHUP
// only (EPOLLHUP and EPOLLERR come anyway): readable data does not wake it,
// so a paused session costs nothing until its peer hangs up.
void Server::watch_hangup(Session* s, int fd) {
    if (stopped_ || fd < 0) return;
    if (!hangups_) {
        int ep = ::epoll_create1(EPOLL_CLOEXEC);
        if (ep < 0) {
            DYAD_WARN("rpc",
                      "epoll_create1: %s: a paused connection whose peer hangs up is "
                      "noticed only at its requests' deadlines",
                      std::strerror(errno));
            return;
        }
        hangups_ = std::make_unique<asio::posix::stream_descriptor>(io_, ep);
        arm_hangups();
    }
    struct epoll_event ev {};
    ev.events = EPOLLRDHUP;
    ev.data.fd = fd;
    if (::epoll_ctl(hangups_->native_handle(), EPOLL_CTL_ADD, fd, &ev) == 0) hangup_fds_[fd] = s;
}

void Server::unwatch_hangup(int fd) {
    auto it = hangup_fds_.find(fd);
    if (it == hangup_fds_.end()) return;
    hangup_fds_.erase(it);
    if (hangups_) ::epoll_ctl(hangups_->native_handle(), EPOLL_CTL_DEL, fd, nullptr);
}

void Server::arm_hangups() {
    hangups_->async_wait(asio::posix::descriptor_base::wait_read, [this](asio::error_code ec) {
        if (ec || stopped_ || !hangups_) return;
        struct epoll_event evs[64];
        int n = ::epoll_wait(hangups_->native_handle(), evs, 64, 0);
        for (int i = 0; i < n; ++i) {
            auto it = hangup_fds_.find(evs[i].data.fd);
            if (it == hangup_fds_.end()) continue;
            auto w = sessions_.find(it->second);
            auto s = w == sessions_.end() ? nullptr : w->second.lock();
            if (s)
                s->peer_hung_up();  // unwatches it
            else
                unwatch_hangup(evs[i].data.fd);
        }
        arm_hangups();
    });
}

void Server::dispatch(std::shared_ptr<Request> r) {
    r->set_observer(observer_);
    if (observer_) {
        try {
            observer_->started(*r);
        } catch (const std::exception&) {
            // an observer never stops a request
        }
    }
    auto it = handlers_.find(r->topic());
    if (it == handlers_.end() || !it->second.handler) {
        r->error(ENOSYS, "unknown topic '" + r->topic() + "'", DYAD_RC_BADRPC);
        return;
    }
    // A peer's malformed fields (wrong JSON types) must never take the
    // service down: they become an EINVAL answer.
    try {
        it->second.handler(r);
    } catch (const std::exception& e) {
        // (One warning per failed request comes from the observer, with this.)
        DYAD_DEBUG("rpc", "malformed %s request: %s", r->topic().c_str(), e.what());
        r->error(EINVAL, std::string("malformed request: ") + e.what(), DYAD_RC_BADUNPACK);
    }
}

void Server::stop() {
    if (stopped_) return;
    stopped_ = true;
    asio::error_code ec;
    retry_tcp_.cancel();
    retry_unix_.cancel();
    if (tcp_) tcp_->close(ec);
    if (unix_) {
        unix_->close(ec);
        ::unlink(unix_path_.c_str());
    }
    auto sessions = sessions_;
    for (auto& [p, w] : sessions)
        if (auto s = w.lock()) s->close();
    sessions_.clear();
    peer_connections_.clear();
    in_reserve_.clear();
    reserve_holders_.clear();
    hangup_fds_.clear();
    if (hangups_) hangups_->close(ec);
}

}  // namespace dyad::rpc
