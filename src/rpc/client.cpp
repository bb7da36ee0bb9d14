// SPDX-License-Identifier: Apache-2.0
#include "client.hpp"
#include "fd_passing.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "common/log.hpp"
#include "common/settings.hpp"
#include "common/json_text.hpp"
#include "common/seconds.hpp"

namespace dyad::rpc {
namespace {

Status timeout_status(const std::string& what) {
    return Status(DYAD_RC_TIMEOUT, what + ": deadline passed", ETIMEDOUT);
}

// Waits for `events` on fd until the deadline. Returns ok, TIMEOUT or SYSFAIL.
Status wait_fd(int fd, short events, Deadline deadline, const std::string& what) {
    for (;;) {
        struct pollfd p = {fd, events, 0};
        int r = ::poll(&p, 1, deadline.poll_ms());
        if (r > 0) return Status::ok();
        if (r == 0) {
            if (deadline.expired()) return timeout_status(what);
            continue;
        }
        if (errno == EINTR) continue;
        return Status(DYAD_RC_CONNFAIL, what + ": poll failed", errno);
    }
}

Result<UniqueFd> connect_fd(const Uri& u, Deadline deadline) {
    std::string what = "connect to " + u.str();
    auto finish = [&](UniqueFd fd, const sockaddr* sa, socklen_t len) -> Result<UniqueFd> {
        if (::connect(fd.get(), sa, len) != 0) {
            if (errno != EINPROGRESS && errno != EAGAIN)
                return Status(DYAD_RC_CONNFAIL, what + " failed", errno);
            Status s = wait_fd(fd.get(), POLLOUT, deadline, what);
            if (!s) return s;
            int err = 0;
            socklen_t el = sizeof err;
            getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &el);
            if (err != 0) return Status(DYAD_RC_CONNFAIL, what + " failed", err);
        }
        return fd;
    };
    if (u.is_unix) {
        sockaddr_un sa{};
        sa.sun_family = AF_UNIX;
        std::strncpy(sa.sun_path, u.path.c_str(), sizeof sa.sun_path - 1);
        // A socket that is there and refuses is a service still starting
        // (`dyad job node-up` binds it before dyadd listens: the job starts
        // meanwhile) or a stale one: tried again for up to
        // kStartingSocketWait, then the error.
        const Deadline starting = deadline.min(Deadline::after(kStartingSocketWait));
        while (true) {
            UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
            if (!fd.valid()) return Status(DYAD_RC_CONNFAIL, "socket", errno);
            auto r = finish(std::move(fd), reinterpret_cast<sockaddr*>(&sa), sizeof sa);
            if (r || r.status().err() != ECONNREFUSED || starting.expired()) return r;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    }
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = AF_UNSPEC;
    addrinfo* res = nullptr;
    int g = getaddrinfo(u.host.c_str(), std::to_string(u.port).c_str(), &hints, &res);
    if (g != 0)
        return Status(DYAD_RC_CONNFAIL, what + ": cannot resolve host: " + gai_strerror(g),
                      EHOSTUNREACH);
    Status last(DYAD_RC_CONNFAIL, what + " failed", ECONNREFUSED);
    for (addrinfo* a = res; a; a = a->ai_next) {
        UniqueFd fd(::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (!fd.valid()) continue;
        int one = 1;
        setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        auto r = finish(std::move(fd), a->ai_addr, a->ai_addrlen);
        if (r) {
            freeaddrinfo(res);
            return r;
        }
        last = r.status();
    }
    freeaddrinfo(res);
    return last;
}

}  // namespace

Result<Credentials> Credentials::from_settings() {
    Credentials c;
    std::string path = settings::text("DYAD_AUTH_KEY_FILE");
    if (path.empty()) return c;
    auto k = auth::Key::load(path);
    if (!k) return Status(k.status()).wrap("DYAD_AUTH_KEY_FILE");
    c.key = k.value();
    return c;
}

namespace {

Status auth_error(const std::string& msg) {
    return Status(DYAD_RC_NOAUTH, msg, EACCES);
}

// What a peer that is not a DYAD service sent instead of a frame header,
// for the message: its printable start ("HTTP/1.1 400 Bad Request").
std::string shown(const std::string& raw) {
    std::string out;
    for (char ch : raw) {
        if (ch == '\r' || ch == '\n') break;
        out += (ch >= 0x20 && ch < 0x7f) ? ch : '.';
    }
    return out;
}

}  // namespace

Result<Frame> Connection::read_hello(Deadline deadline, double hello_s) {
    auto not_dyad = [&](const std::string& why) {
        return Status(
            DYAD_RC_CONNFAIL,
            "the service at " + uri_ + " did not answer like a DYAD service (" + why + ")", EPROTO);
    };
    bad_header_.clear();
    auto f = read_frame(deadline);
    if (!f) {
        const Status& e = f.status();
        if (e.rc() == DYAD_RC_TIMEOUT)
            return not_dyad("no answer to the hello within " + seconds_text(hello_s) +
                            " s: not a dyadd, or a stopped one");
        if (e.err() == ECONNRESET)
            return not_dyad(
                "it closed the connection during the hello: not a dyadd, or one "
                "that is stopping");
        if (!bad_header_.empty() && bad_header_.compare(0, 4, "DYAD") != 0)
            return not_dyad("it sent \"" + shown(bad_header_) + "\" instead of a DYAD frame");
        return Status(e).wrap("hello from " + uri_);
    }
    if (f->header.type == Type::error)
        return Connection::error_status(f.value(),
                                        "service at " + uri_ + " refused the connection");
    if (f->header.type != Type::hello || f->header.data_len != 0 || !f->meta.is_object())
        return Status(
            DYAD_RC_BADRPC,
            "service at " + uri_ + " answered hello with a " + type_name(f->header.type) + " frame",
            EPROTO);
    return f;
}

namespace {

// Does the service's view of the connection (its challenge's "binding")
// match ours? A relay has a connection of its own to the service: the
// service sees the relay's addresses (or, on a Unix socket, is not the
// process at our end). Returns what differs, "" when all matches.
std::string binding_mismatch(int fd, bool unix_socket, const nlohmann::json& b) {
    if (!b.is_object()) return "the service sent no view of the connection";
    if (unix_socket) {
        struct ucred cred {};
        socklen_t cl = sizeof cred;
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0)
            return "cannot tell which process listens on the socket";
        auto pid = b.find("pid");
        if (pid == b.end() || !pid->is_number_integer() || pid->get<int64_t>() != cred.pid)
            return "the socket is held by pid " + std::to_string(cred.pid) +
                   ", not by the service that answered";
        return "";
    }
    const std::string mine = socket_endpoint(fd, false), theirs = socket_endpoint(fd, true);
    auto peer = b.find("peer"), local = b.find("local");
    if (peer == b.end() || !peer->is_string() || local == b.end() || !local->is_string())
        return "the service sent no view of the connection";
    if (peer->get<std::string>() != mine || local->get<std::string>() != theirs)
        return "this end is " + mine + " to " + theirs + ", the service sees " +
               peer->get<std::string>() + " to " + local->get<std::string>();
    return "";
}

// What a keyed service's hello proved: who it is, and its challenge and
// proof as sent (the client's answer covers both).
struct Proven {
    std::string service_id, challenge, proof;
};

// The challenge of a keyed service's hello (`meta`): the service's proof
// over our hello and the challenge as sent; then who it is and how it sees
// this connection (fd), against who we expect ("" for anyone).
Result<Proven> check_challenge(const nlohmann::json& meta, const auth::Key& key,
                               const std::string& client_hello, int fd, bool unix_socket,
                               const std::string& uri, const std::string& expect) {
    auto challenge = meta.find("challenge");
    auto sproof = meta.find("proof");
    nlohmann::json ch;
    if (challenge != meta.end() && challenge->is_string()) ch = parse_meta(*challenge);
    if (sproof == meta.end() || !sproof->is_string() || !ch.is_object() ||
        !key.verify(sproof->get<std::string>(), "dyad service",
                    {client_hello, challenge->get<std::string>()}))
        return auth_error("service at " + uri +
                          " could not prove it holds the job's key: it is not this job's service, "
                          "or the key files differ (DYAD_AUTH_KEY_FILE=" +
                          key.path() + ")");
    auto nonce = ch.find("nonce");
    auto id = ch.find("service_id");
    if (nonce == ch.end() || !nonce->is_string() || !auth::valid_nonce(nonce->get<std::string>()) ||
        id == ch.end() || !id->is_string())
        return auth_error("service at " + uri + " sent a malformed challenge");
    std::string why = binding_mismatch(fd, unix_socket, ch.value("binding", nlohmann::json()));
    if (!why.empty())
        return auth_error("the connection to " + uri +
                          " is relayed: the service that proved the key is not at the other end "
                          "of it (" +
                          why +
                          "). Something between this process and the service forwards the "
                          "connection (a wrong DYAD_SERVICE_URI, a process posing as the service, "
                          "or NAT): refused");
    if (!expect.empty() && id->get<std::string>() != expect)
        return auth_error("service at " + uri + " proved it is '" + id->get<std::string>() +
                          "', not '" + expect + "' that was expected");
    return Proven{id->get<std::string>(), challenge->get<std::string>(),
                  sproof->get<std::string>()};
}

}  // namespace

Result<std::unique_ptr<Connection>> Connection::connect(const std::string& uri, Deadline deadline,
                                                        const Credentials& creds,
                                                        const std::string& expect) {
    auto u = parse_uri(uri);
    if (!u) return u.status();
    auto fd = connect_fd(u.value(), deadline);
    if (!fd) return fd.status();
    std::unique_ptr<Connection> c(new Connection(std::move(fd.value()), uri));
    // The hello exchange has a short deadline of its own (kHelloAnswerTimeout).
    const double hello_s =
        std::min(std::chrono::duration<double>(kHelloAnswerTimeout).count(), deadline.remaining());
    deadline = deadline.min(Deadline::after(hello_s));
    Header h;
    h.type = Type::hello;
    nlohmann::json hello = {{"version", kVersion}, {"pid", ::getpid()}, {"role", creds.role}};
    if (!creds.service_id.empty()) hello["service_id"] = creds.service_id;
    if (!expect.empty()) hello["expect"] = expect;
    if (creds.key) hello["nonce"] = auth::new_nonce();
    const std::string client_hello = hello.dump(-1, ' ', false, kBadUtf8Replaced);
    Status s = c->send_frame(h, client_hello, deadline);
    if (!s) return s.wrap("hello to " + uri);
    auto f = c->read_hello(deadline, hello_s);
    if (!f) return f.status();
    std::string scheme = f->meta.value("auth", std::string("none"));
    if (scheme == "none") {
        // A service that asks for no key could be anyone's: a process that
        // holds the job's key talks only to services that prove they do.
        if (creds.key)
            return auth_error("service at " + uri +
                              " does not authenticate (dyadd started without --auth-key) but this "
                              "process has a key (DYAD_AUTH_KEY_FILE=" +
                              creds.key->path() +
                              "): refusing to trust it; give dyadd the same key");
        c->peer_id_ = f->meta.value("service_id", std::string());
        if (!expect.empty() && c->peer_id_ != expect)
            return auth_error("service at " + uri + " is '" + c->peer_id_ + "', not '" + expect +
                              "' that was expected");
        c->peer_info_ = std::move(f->meta);
        return c;
    }
    if (scheme != auth::kScheme)
        return auth_error("service at " + uri + " asks for authentication scheme '" + scheme +
                          "', this build knows '" + auth::kScheme + "'");
    if (!creds.key)
        return auth_error("service at " + uri +
                          " requires authentication: set DYAD_AUTH_KEY_FILE to the job's key file "
                          "(the one its dyadd was given with --auth-key)");
    auto proven =
        check_challenge(f->meta, *creds.key, client_hello, c->fd_.get(), c->unix_, uri, expect);
    if (!proven) return proven.status();
    const std::string& sc = proven->challenge;
    nlohmann::json answer = {
        {"proof", creds.key->proof("dyad client", {client_hello, sc, proven->proof})}};
    s = c->send_frame(h, answer.dump(-1, ' ', false, kBadUtf8Replaced), deadline);
    if (!s) return s.wrap("hello to " + uri);
    // Every later frame, both ways, carries a tag.
    c->tx_mac_ = auth::FrameMac(creds.key->derive("dyad client to service", {client_hello, sc}));
    c->rx_mac_ = auth::FrameMac(creds.key->derive("dyad service to client", {client_hello, sc}));
    auto g = c->read_hello(deadline, hello_s);
    if (!g) return g.status();
    c->peer_id_ = proven->service_id;
    c->peer_info_ = std::move(g->meta);
    return c;
}

Status Connection::write_exact(const void* p, size_t n, Deadline deadline) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        ssize_t w = ::send(fd_.get(), c, n, MSG_NOSIGNAL);
        if (w > 0) {
            sent_any_ = true;
            c += w;
            n -= static_cast<size_t>(w);
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            Status s = wait_fd(fd_.get(), POLLOUT, deadline, "send to " + uri_);
            if (!s) {
                broken_ = true;
                return s;
            }
            continue;
        }
        int err = errno;
        broken_ = true;
        if (sending_request_ && !sent_any_ && (err == EPIPE || err == ECONNRESET))
            loss_ = Loss::unsent;
        return Status(DYAD_RC_CONNFAIL, "send to " + uri_ + " failed", err);
    }
    return Status::ok();
}

bool Connection::is_unix_socket(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    return ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0 &&
           ss.ss_family == AF_UNIX;
}

// recv that also takes descriptors passed with the bytes (SCM_RIGHTS): the
// first one of the message is kept in passed_fd_ (replacing, and closing,
// one not yet taken), any other is closed.
ssize_t Connection::recv_with_fd(void* p, size_t n) {
    int fd = -1;
    bool truncated = false;
    const ssize_t r = recv_with_rights(fd_.get(), p, n, 0, &fd, &truncated);
    if (fd >= 0) {
        if (passed_fd_.valid())
            DYAD_WARN("rpc", "%s passed a second descriptor before the first was taken",
                      uri_.c_str());
        passed_fd_.reset(fd);
    }
    // Descriptors that did not fit (more than one) or that this process had
    // no room for were closed by the kernel.
    if (truncated)
        DYAD_WARN("rpc", "descriptors passed by %s were dropped (more than one, or no free fd)",
                  uri_.c_str());
    return r;
}

Status Connection::read_exact(void* p, size_t n, Deadline deadline, bool take_fds) {
    char* c = static_cast<char*>(p);
    auto drain = [&] {
        size_t k = std::min(n, rend_ - rpos_);
        std::memcpy(c, rbuf_.get() + rpos_, k);
        rpos_ += k;
        c += k;
        n -= k;
    };
    if (buffered()) drain();
    // Short reads (headers, meta, small data) go through the read-ahead
    // buffer; long ones (file data) straight to their destination, their
    // last bytes too: file bytes are never copied twice here.
    const bool short_read = !unix_ && n < kReadAhead;
    while (n > 0) {
        const bool ahead = short_read;
        if (ahead && !rbuf_) rbuf_.reset(new char[kReadAhead]);
        ssize_t r = ahead      ? ::recv(fd_.get(), rbuf_.get(), kReadAhead, 0)
                    : take_fds ? recv_with_fd(c, n)
                               : ::recv(fd_.get(), c, n, 0);
        if (r > 0) {
            read_any_ = true;
            if (ahead) {
                rpos_ = 0;
                rend_ = static_cast<size_t>(r);
                drain();
                continue;
            }
            c += r;
            n -= static_cast<size_t>(r);
            continue;
        }
        if (r == 0 || (r < 0 && errno == ECONNRESET)) {
            broken_ = true;
            if (!read_any_ && sent_any_ && loss_ == Loss::none) loss_ = Loss::unanswered;
            return Status(DYAD_RC_CONNFAIL,
                          "service at " + uri_ + " closed the connection (did it stop?)",
                          ECONNRESET);
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            Status s = wait_fd(fd_.get(), POLLIN, deadline, "waiting for " + uri_);
            if (!s) {
                broken_ = true;
                return s;
            }
            continue;
        }
        broken_ = true;
        return Status(DYAD_RC_CONNFAIL, "receive from " + uri_ + " failed", errno);
    }
    return Status::ok();
}

Result<size_t> Connection::send_first_with_fd(const char* p, size_t n, int fd, Deadline deadline) {
    for (;;) {
        struct iovec iov = {const_cast<char*>(p), n};
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int))];
        } ctl;
        std::memset(&ctl, 0, sizeof ctl);
        struct msghdr msg = {};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof ctl.buf;
        struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
        ssize_t w = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
        if (w > 0) {
            sent_any_ = true;
            return static_cast<size_t>(w);
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            Status s = wait_fd(fd_.get(), POLLOUT, deadline, "send to " + uri_);
            if (!s) {
                broken_ = true;
                return s;
            }
            continue;
        }
        const int err = errno;
        broken_ = true;
        if (sending_request_ && (err == EPIPE || err == ECONNRESET)) loss_ = Loss::unsent;
        return Status(DYAD_RC_CONNFAIL, "send to " + uri_ + " failed", err);
    }
}

Status Connection::send_frame(const Header& h0, const std::string& meta, Deadline deadline,
                              int pass_fd) {
    Header h = h0;
    h.meta_len = static_cast<uint32_t>(meta.size());
    uint8_t hdr[kHeaderSize];
    encode_header(h, hdr);
    std::string buf(reinterpret_cast<char*>(hdr), kHeaderSize);
    buf += meta;
    if (tx_mac_.active()) {
        uint8_t tag[auth::kTagBytes];
        tx_mac_.sign(hdr, kHeaderSize, meta, tag);
        buf.append(reinterpret_cast<char*>(tag), sizeof tag);
    }
    size_t first = 0;
    if (pass_fd >= 0 && unix_) {
        auto sent = send_first_with_fd(buf.data(), buf.size(), pass_fd, deadline);
        if (!sent) return sent.status();
        first = sent.value();
    }
    return write_exact(buf.data() + first, buf.size() - first, deadline);
}

Result<uint32_t> Connection::send_request(const std::string& topic, nlohmann::json args,
                                          Deadline deadline, bool propagate, int pass_fd) {
    if (broken_) return Status(DYAD_RC_CONNFAIL, "connection to " + uri_ + " is broken", EPIPE);
    uint32_t tag = next_tag_++;
    if (next_tag_ == 0) next_tag_ = 1;
    if (!args.is_object()) args = nlohmann::json::object();
    args["topic"] = topic;
    if (propagate && !deadline.infinite())
        args["timeout_ms"] = static_cast<int64_t>(deadline.remaining() * 1000.0) + 1;
    Header h;
    h.type = Type::request;
    h.tag = tag;
    loss_ = Loss::none;
    sent_any_ = read_any_ = false;
    sending_request_ = true;
    Status s = send_frame(h, args.dump(-1, ' ', false, kBadUtf8Replaced), deadline, pass_fd);
    sending_request_ = false;
    if (!s) return s;
    return tag;
}

Result<Frame> Connection::read_frame(Deadline deadline) {
    // A descriptor travels with the first byte of its frame's header, and no
    // read crosses a frame's end: on a Unix socket headers are read with
    // recvmsg, the rest (meta, data) with plain recv.
    passed_fd_.reset();
    uint8_t hdr[kHeaderSize];
    Status s = read_exact(hdr, kHeaderSize, deadline, unix_);
    if (!s) return s;
    Frame f;
    s = decode_header(hdr, &f.header);
    if (!s) {
        broken_ = true;
        bad_header_.assign(reinterpret_cast<const char*>(hdr), kHeaderSize);
        return s.wrap("from " + uri_);
    }
    std::string meta(f.header.meta_len, '\0');
    if (!meta.empty()) {
        s = read_exact(meta.data(), meta.size(), deadline);
        if (!s) return s;
    }
    held_.clear();
    held_pos_ = 0;
    if (rx_mac_.active()) {
        uint8_t tag[auth::kTagBytes];
        s = read_exact(tag, sizeof tag, deadline);
        if (!s) return s;
        // A compact answer's metadata travels in its data: the tag covers
        // that part too (decode_header checked there is as much).
        held_.resize(tagged_data_len(f.header));
        if (!held_.empty()) {
            s = read_exact(held_.data(), held_.size(), deadline);
            if (!s) return s;
        }
        if (!rx_mac_.check(hdr, kHeaderSize, meta, tag, held_)) {
            broken_ = true;
            return Status(DYAD_RC_BADRPC,
                          "a frame from " + uri_ +
                              " failed its authentication tag (injected, replayed or changed on "
                              "the way): connection dropped",
                          EPROTO);
        }
    }
    if (!meta.empty()) {
        f.meta = parse_meta(meta);
        if (f.meta.is_discarded()) {
            broken_ = true;
            return Status(DYAD_RC_BADUNPACK, "malformed JSON in frame from " + uri_, EPROTO);
        }
    }
    return f;
}

size_t Connection::take_held(void* buf, size_t n) {
    size_t k = std::min(n, held_.size() - held_pos_);
    if (buf && k) std::memcpy(buf, held_.data() + held_pos_, k);
    held_pos_ += k;
    return k;
}

Status Connection::read_data(void* buf, size_t n, Deadline deadline) {
    size_t k = take_held(buf, n);
    if (k == n) return Status::ok();
    return read_exact(static_cast<char*>(buf) + k, n - k, deadline);
}

Status Connection::skip_data(size_t n, Deadline deadline) {
    n -= take_held(nullptr, n);
    char tmp[16384];
    while (n > 0) {
        size_t k = n < sizeof tmp ? n : sizeof tmp;
        Status s = read_exact(tmp, k, deadline);
        if (!s) return s;
        n -= k;
    }
    return Status::ok();
}

Status Connection::send_cancel(uint32_t tag) {
    Header h;
    h.type = Type::cancel;
    h.tag = tag;
    return send_frame(h, "", Deadline::after(1.0));
}

Status Connection::send_update(uint32_t tag, const nlohmann::json& meta, Deadline deadline) {
    Header h;
    h.type = Type::update;
    h.tag = tag;
    return send_frame(h, meta.dump(-1, ' ', false, kBadUtf8Replaced), deadline);
}

Status Connection::error_status(const Frame& f, const std::string& context) {
    std::string msg = "error";
    dyad_rc_t rc = DYAD_RC_BADRPC;
    if (f.meta.is_object()) {
        auto m = f.meta.find("msg");
        if (m != f.meta.end() && m->is_string()) msg = m->get<std::string>();
        auto r = f.meta.find("rc");
        // Only a code this build knows, and never success (an error frame
        // with "rc": 0 is still an error; an unknown value is no dyad_rc_t).
        if (r != f.meta.end() && r->is_number_integer() && r->get<int64_t>() < 0) {
            int64_t v = r->get<int64_t>();
#define DYAD_RC_KNOWN_(name, value, exit_code, text) \
    if (v == static_cast<int64_t>(name)) rc = name;
            DYAD_RC_LIST(DYAD_RC_KNOWN_)
#undef DYAD_RC_KNOWN_
        }
    }
    return Status(rc, context + ": " + msg, f.header.errnum);
}

Result<nlohmann::json> Connection::call(const std::string& topic, nlohmann::json args,
                                        Deadline deadline, double grace_s, std::string* data,
                                        size_t data_max, int pass_fd) {
    auto tag = send_request(topic, std::move(args), deadline, true, pass_fd);
    if (!tag) return tag.status();
    Deadline read_deadline =
        deadline.infinite() ? deadline : Deadline::after(deadline.remaining() + grace_s);
    if (data) data->clear();
    for (;;) {
        auto f = read_frame(read_deadline);
        if (!f) return f.status();
        if (f->header.data_len) {
            const bool answer = f->header.tag == tag.value() &&
                                (f->header.type == Type::response || f->header.type == Type::end);
            Status s;
            if (data && answer) {
                if (f->header.data_len > data_max) {
                    broken_ = true;
                    return Status(DYAD_RC_BADRPC,
                                  topic + " answered with " + std::to_string(f->header.data_len) +
                                      " bytes of data, more than the " + std::to_string(data_max) +
                                      " it may",
                                  EPROTO);
                }
                data->resize(f->header.data_len);
                s = read_data(data->data(), data->size(), read_deadline);
            } else {
                s = skip_data(f->header.data_len, read_deadline);
            }
            if (!s) return s;
        }
        if (f->header.type == Type::error && f->header.tag == 0) {
            broken_ = true;  // the service rejected the connection itself
            return error_status(f.value(), topic);
        }
        if (f->header.tag != tag.value()) continue;  // a late answer to a cancelled request
        switch (f->header.type) {
            case Type::response:
            case Type::end:
                return f->meta;
            case Type::error:
                return error_status(f.value(), topic);
            default:
                broken_ = true;
                return Status(DYAD_RC_BADRPC,
                              std::string("unexpected ") + type_name(f->header.type) + " frame",
                              EPROTO);
        }
    }
}

Result<std::unique_ptr<Connection>> ConnectionPool::get(const std::string& uri, Deadline deadline,
                                                        const std::string& expect) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = idle_.find(uri);
        while (it != idle_.end() && !it->second.empty()) {
            auto c = std::move(it->second.back());
            it->second.pop_back();
            // An idle connection must have nothing to read: readable means the
            // service closed it (restart) or sent junk; drop it.
            struct pollfd p = {c->fd_.get(), POLLIN, 0};
            if (!expect.empty() && c->peer_id() != expect) continue;  // another service now
            if (!c->buffered() && ::poll(&p, 1, 0) == 0) {
                c->reused_ = true;
                return c;
            }
        }
    }
    return Connection::connect(uri, deadline, creds_, expect);
}

void ConnectionPool::put(std::unique_ptr<Connection> c) {
    if (!c || c->broken()) return;
    c->passed_fd_.reset();  // an idle connection holds no one's file open
    std::lock_guard<std::mutex> lk(mu_);
    auto& v = idle_[c->uri()];
    if (v.size() < max_idle_) v.push_back(std::move(c));
}

Result<nlohmann::json> ConnectionPool::call(const std::string& uri, const std::string& topic,
                                            const nlohmann::json& args, Deadline deadline,
                                            double grace_s, bool idempotent, bool* connect_failed,
                                            std::string* data, size_t data_max, int pass_fd) {
    if (connect_failed) *connect_failed = false;
    for (int attempt = 0;; ++attempt) {
        auto c = get(uri, deadline);
        if (!c) {
            if (connect_failed) *connect_failed = true;
            return c.status();
        }
        auto r = c.value()->call(topic, args, deadline, grace_s, data, data_max, pass_fd);
        if (!r && attempt == 0 && c.value()->reused() &&
            c.value()->lost_before_request(idempotent) && !deadline.expired()) {
            DYAD_DEBUG("rpc",
                       "%s: the pooled connection to %s was closed by the service (%s); "
                       "sending again on a new connection",
                       topic.c_str(), uri.c_str(), r.status().message().c_str());
            ++retries_;
            continue;  // the broken connection is dropped here
        }
        put(std::move(c.value()));
        return r;
    }
}

void ConnectionPool::clear() {
    std::lock_guard<std::mutex> lk(mu_);
    idle_.clear();
}

}  // namespace dyad::rpc
