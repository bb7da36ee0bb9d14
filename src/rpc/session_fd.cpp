// SPDX-License-Identifier: Apache-2.0
// A descriptor a client passes with a request over the Unix socket
// (SCM_RIGHTS with the frame's first byte; docs/wire-protocol.md, "Passing
// a descriptor"): a local publish proves with it that its user can open
// the file (docs/security.md, "The node-wide service"). The service keeps
// only what the kernel says of it (device, inode, mode, how it was opened)
// and closes it at once: a peer holds no descriptor of the service's table
// with it, however many it sends. At most one descriptor per frame is
// looked at; the others are closed unread.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "fd_passing.hpp"
#include "session.hpp"

namespace dyad::rpc {
namespace {

// What the kernel says of `fd`, without asking its file system (a FUSE or
// NFS file of the peer's cannot hold the loop: AT_STATX_DONT_SYNC).
std::optional<PassedFile> describe(int fd) {
    struct statx sx {};
    if (::statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE | STATX_MODE | STATX_INO,
                &sx) != 0)
        return std::nullopt;
    const int fl = ::fcntl(fd, F_GETFL);
    PassedFile f;
    f.dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
    f.ino = sx.stx_ino;
    f.mode = sx.stx_mode;
    f.readable = fl >= 0 && !(fl & O_PATH) && (fl & O_ACCMODE) != O_WRONLY;
    return f;
}

}  // namespace

ssize_t Session::recv_header_part(size_t got) {
    int fd = -1;
    const ssize_t r = recv_with_rights(sock_.native_handle(), hdr_.data() + got, kHeaderSize - got,
                                       MSG_DONTWAIT, &fd, nullptr);
    // The first descriptor of the frame is described; any other is closed
    // unread (here, or by the kernel when more than one came).
    if (fd >= 0) {
        if (got == 0 && !rx_file_) rx_file_ = describe(fd);
        ::close(fd);
    }
    return r;
}

void Session::read_header_unix(size_t got) {
    // Most often the header is there already: read at once. Otherwise, and
    // for an error or the peer's close (handled from the loop, never from
    // the caller), once the socket is readable.
    for (ssize_t r; (r = recv_header_part(got)) > 0;) {
        got += static_cast<size_t>(r);
        if (got == kHeaderSize) return header_read();
    }
    auto self = shared_from_this();
    sock_.async_wait(asio::socket_base::wait_read, [self, got](asio::error_code ec) {
        if (ec || self->closed_) return self->close();
        ssize_t r = self->recv_header_part(got);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return self->read_header_unix(got);
        if (r <= 0) return self->close();
        const size_t have = got + static_cast<size_t>(r);
        if (have == kHeaderSize) return self->header_read();
        self->read_header_unix(have);
    });
}

}  // namespace dyad::rpc
