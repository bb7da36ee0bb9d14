// SPDX-License-Identifier: Apache-2.0
#include "principal.hpp"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/fd.hpp"

namespace dyad::rpc {
namespace {

// An IPv4-mapped IPv6 address (::ffff:a.b.c.d) as the IPv4 address it is.
sockaddr_storage unmapped(const sockaddr_storage& a) {
    if (a.ss_family != AF_INET6) return a;
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (!IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) return a;
    sockaddr_storage out{};
    auto* in = reinterpret_cast<sockaddr_in*>(&out);
    in->sin_family = AF_INET;
    in->sin_port = in6->sin6_port;
    std::memcpy(&in->sin_addr, in6->sin6_addr.s6_addr + 12, 4);
    return out;
}

bool loopback(const sockaddr_storage& a) {
    if (a.ss_family == AF_INET)
        return (ntohl(reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr) >> 24) == 127;
    if (a.ss_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr);
    return false;
}

std::string ip_text(const sockaddr_storage& a) {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (a.ss_family == AF_INET)
        ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a)->sin_addr, buf, sizeof buf);
    else if (a.ss_family == AF_INET6)
        ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr, buf,
                    sizeof buf);
    return buf;
}

uint16_t port_of(const sockaddr_storage& a) {
    return a.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in*>(&a)->sin_port
                                  : reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port;
}

// The address bytes as inet_diag holds them (network order, 4 or 16 bytes).
void put_addr(const sockaddr_storage& a, __be32 out[4]) {
    if (a.ss_family == AF_INET)
        std::memcpy(out, &reinterpret_cast<const sockaddr_in*>(&a)->sin_addr, 4);
    else
        std::memcpy(out, &reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr, 16);
}

// One exact lookup (no dump) of the socket with this 4-tuple. -1: none;
// -2: the kernel could not be asked.
int64_t diag_owner(const sockaddr_storage& peer, const sockaddr_storage& local) {
    UniqueFd nl(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
    if (!nl.valid()) return -2;
    struct timeval tv = {0, 200000};  // the kernel answers at once; never hang the loop
    ::setsockopt(nl.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct {
        nlmsghdr nlh;
        inet_diag_req_v2 r;
    } req{};
    req.nlh.nlmsg_len = sizeof req;
    req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nlh.nlmsg_flags = NLM_F_REQUEST;
    req.r.sdiag_family = static_cast<uint8_t>(peer.ss_family);
    req.r.sdiag_protocol = IPPROTO_TCP;
    req.r.idiag_states = ~0u;
    req.r.id.idiag_sport = port_of(peer);
    req.r.id.idiag_dport = port_of(local);
    put_addr(peer, req.r.id.idiag_src);
    put_addr(local, req.r.id.idiag_dst);
    req.r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (::sendto(nl.get(), &req, sizeof req, 0, reinterpret_cast<sockaddr*>(&kernel),
                 sizeof kernel) != static_cast<ssize_t>(sizeof req))
        return -2;
    alignas(nlmsghdr) char buf[8192];
    ssize_t n = ::recv(nl.get(), buf, sizeof buf, 0);
    if (n < static_cast<ssize_t>(sizeof(nlmsghdr))) return -2;
    const size_t got = static_cast<size_t>(n);
    for (size_t off = 0; off + sizeof(nlmsghdr) <= got;) {
        auto* h = reinterpret_cast<nlmsghdr*>(buf + off);
        if (h->nlmsg_len < sizeof(nlmsghdr) || off + h->nlmsg_len > got) break;
        off += NLMSG_ALIGN(h->nlmsg_len);
        if (h->nlmsg_type == NLMSG_ERROR) {
            auto* e = static_cast<nlmsgerr*>(NLMSG_DATA(h));
            return e->error == -ENOENT ? -1 : -2;
        }
        if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
            h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg)))
            return static_cast<inet_diag_msg*>(NLMSG_DATA(h))->idiag_uid;
        if (h->nlmsg_type == NLMSG_DONE) break;
    }
    return -1;
}

// /proc/net/tcp{,6}: "sl local_address rem_address st ... uid ...", the
// addresses as the kernel holds them, in hex by 32-bit words.
std::string proc_addr(const sockaddr_storage& a) {
    __be32 w[4];
    put_addr(a, w);
    char buf[48];
    std::string out;
    for (int i = 0; i < (a.ss_family == AF_INET ? 1 : 4); ++i) {
        std::snprintf(buf, sizeof buf, "%08X", static_cast<unsigned>(w[i]));
        out += buf;
    }
    std::snprintf(buf, sizeof buf, ":%04X", static_cast<unsigned>(ntohs(port_of(a))));
    return out + buf;
}

int64_t proc_owner(const sockaddr_storage& peer, const sockaddr_storage& local) {
    std::ifstream f(peer.ss_family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6");
    const std::string want_local = proc_addr(peer), want_remote = proc_addr(local);
    std::string line;
    std::getline(f, line);  // the titles
    while (std::getline(f, line)) {
        std::istringstream in(line);
        std::string sl, loc, rem, st, queues, timer, retr;
        int64_t uid = -1;
        if (!(in >> sl >> loc >> rem >> st >> queues >> timer >> retr >> uid)) continue;
        if (loc == want_local && rem == want_remote) return uid;
    }
    return -1;
}

// The supplementary groups of the Unix socket's peer as they were when it
// connected (SO_PEERGROUPS, Linux 4.13); none when the kernel cannot say.
std::vector<uint32_t> peer_groups(int fd) {
    std::vector<uint32_t> g(64);
    for (int tries = 0; tries < 3; ++tries) {
        socklen_t len = static_cast<socklen_t>(g.size() * sizeof(uint32_t));
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g.data(), &len) == 0) {
            g.resize(len / sizeof(uint32_t));
            return g;
        }
        // ERANGE: len says how many bytes they need (at most NGROUPS_MAX).
        if (errno != ERANGE || len / sizeof(uint32_t) <= g.size() || len > (1u << 20)) break;
        g.resize(len / sizeof(uint32_t));
    }
    return {};
}

}  // namespace

int64_t local_tcp_owner(const sockaddr_storage& peer_in, const sockaddr_storage& local_in) {
    const sockaddr_storage peer = unmapped(peer_in), local = unmapped(local_in);
    if (peer.ss_family != local.ss_family ||
        (peer.ss_family != AF_INET && peer.ss_family != AF_INET6))
        return -1;
    int64_t uid = diag_owner(peer, local);
    if (uid == -2) uid = proc_owner(peer, local);
    return uid;
}

Principal principal_of(int fd) {
    Principal p;
    const uid_t me = ::geteuid();
    auto trusted = [me](int64_t uid) { return uid == 0 || uid == static_cast<int64_t>(me); };
    sockaddr_storage local{}, remote{};
    socklen_t ll = sizeof local, rl = sizeof remote;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) {
        p.key = "an unknown peer";
        return p;
    }
    if (local.ss_family == AF_UNIX) {
        struct ucred cred {};
        socklen_t cl = sizeof cred;
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
            p.key = "an unknown local process";
            return p;
        }
        p.uid = cred.uid;
        p.gid = cred.gid;
        p.local = true;
        p.groups = peer_groups(fd);
        p.trusted = trusted(p.uid);
        p.key = p.trusted
                    ? "pid " + std::to_string(cred.pid) + " (uid " + std::to_string(cred.uid) + ")"
                    : "uid " + std::to_string(cred.uid);
        return p;
    }
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rl) != 0) {
        p.key = "host (unknown)";
        return p;
    }
    remote = unmapped(remote);
    p.local = loopback(remote);
    const std::string host = ip_text(remote);
    p.uid = local_tcp_owner(remote, local);
    if (p.uid >= 0) {
        p.trusted = trusted(p.uid);
        // The service's own processes keep the caps of their address.
        p.key = p.trusted ? "host " + host : "uid " + std::to_string(p.uid);
        return p;
    }
    // A local process whose owner could not be found: every loopback
    // address is the same host.
    p.key = loopback(remote) ? std::string("host 127.0.0.0/8 (a local process of unknown uid)")
                             : "host " + (host.empty() ? std::string("(unknown)") : host);
    return p;
}

}  // namespace dyad::rpc
