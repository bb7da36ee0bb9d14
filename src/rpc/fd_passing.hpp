// SPDX-License-Identifier: Apache-2.0
// Descriptors passed with the bytes of a Unix socket (SCM_RIGHTS): the one
// receive both ends of the rpc layer use (the client's Connection, the
// server's Session).
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace dyad::rpc {

// recvmsg(2) of up to `n` bytes into `p` with `flags` (MSG_CMSG_CLOEXEC is
// added). The first descriptor passed with them goes to *first (-1 when
// none: the caller owns it); every other one is closed here. *truncated
// (may be null) says the kernel dropped descriptors that did not fit (more
// than one, or no free descriptor in this process). The result is recvmsg's.
ssize_t recv_with_rights(int sock, void* p, size_t n, int flags, int* first, bool* truncated);

}  // namespace dyad::rpc
