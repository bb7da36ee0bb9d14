// SPDX-License-Identifier: Apache-2.0
// The file-system seam, in the spirit of LevelDB's Env: the consumer store
// and the service's file source make their file system calls through it,
// so tests can inject ENOSPC, EIO, short writes and rename failures without
// root tricks. Each call has the system call's contract (-1 and errno on
// failure, short counts allowed); FileSystem::real() makes the calls.
#pragma once

#include <fcntl.h>
#include <sys/types.h>

#include <cstddef>
#include <string>

#include "status.hpp"

namespace dyad {

class FileSystem {
  public:
    virtual ~FileSystem() = default;
    static FileSystem& real();

    // mkostemp(3) in the directory `dirfd`: `tmpl` is a name ending in
    // XXXXXX, created O_EXCL | O_NOFOLLOW, mode 0600.
    virtual int mkostempat(int dirfd, char* tmpl, int flags);
    virtual ssize_t write(int fd, const void* p, size_t n);
    virtual ssize_t pread(int fd, void* p, size_t n, off_t off);
    virtual int fsync(int fd);
    virtual int renameat(int from_dir, const char* from, int to_dir, const char* to);
    virtual int unlinkat(int dirfd, const char* path, int flags);
    virtual int linkat(int from_dir, const char* from, int to_dir, const char* to, int flags);

    // All n bytes, through write() (retrying short writes and EINTR).
    [[nodiscard]] Status write_all(int fd, const void* p, size_t n, const std::string& what);
    // Exactly n bytes at off, through pread(); a file that ends first is EIO.
    [[nodiscard]] Status pread_all(int fd, void* p, size_t n, uint64_t off,
                                   const std::string& what);
};

// getpid(), asked of the kernel once per process (and again in a child
// after fork): glibc no longer caches it.
pid_t process_id();

}  // namespace dyad
