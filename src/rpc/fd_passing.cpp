// SPDX-License-Identifier: Apache-2.0
#include "fd_passing.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace dyad::rpc {

ssize_t recv_with_rights(int sock, void* p, size_t n, int flags, int* first, bool* truncated) {
    *first = -1;
    if (truncated) *truncated = false;
    struct iovec iov = {p, n};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof ctl.buf;
    const ssize_t r = ::recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
    if (r < 0) return r;
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (*first < 0)
                *first = fd;
            else
                ::close(fd);
        }
    }
    if (truncated) *truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
    return r;
}

}  // namespace dyad::rpc
