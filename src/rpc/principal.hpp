// SPDX-License-Identifier: Apache-2.0
// Who is at the other end of a connection, as the per-peer caps count it
// (docs/security.md, "Caps per peer"): what the kernel says, never what the
// peer claims. A local process is its uid, whatever loopback address
// (127.0.0.0/8, ::1) or socket it comes from: SO_PEERCRED on a Unix socket;
// over TCP the owner of the peer's socket, looked up with NETLINK_SOCK_DIAG
// (inet_diag), else in /proc/net/tcp{,6}. A remote peer is its host. The
// service's own uid and root are trusted (they can stop or trace the
// service anyway): their processes keep caps of their own (by process on
// the Unix socket, by address over TCP), and they may use the connection
// slots kept for the service's own tools.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dyad::rpc {

struct Principal {
    std::string key;       // "uid 1000", "host 10.0.0.5", "pid 42 (uid 0)", ...
    bool trusted = false;  // the service's own uid or root
    int64_t uid = -1;      // -1: unknown (a remote host)
    bool local = false;    // a Unix socket or a loopback address
    // The process's gid and supplementary groups (Unix socket only:
    // SO_PEERCRED and SO_PEERGROUPS); -1 and none elsewhere.
    int64_t gid = -1;
    std::vector<uint32_t> groups;
};

// The principal of the peer of connected socket `fd`.
Principal principal_of(int fd);

// The uid owning the TCP socket of this host whose local end is `peer` and
// whose remote end is `local` (the other end of one of our connections);
// -1 when there is none (the peer is on another host or namespace).
int64_t local_tcp_owner(const sockaddr_storage& peer, const sockaddr_storage& local);

}  // namespace dyad::rpc
