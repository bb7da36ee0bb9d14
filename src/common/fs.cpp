// SPDX-License-Identifier: Apache-2.0
#include "fs.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/random.h>
#include <unistd.h>

#include <atomic>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace dyad {

FileSystem& FileSystem::real() {
    static FileSystem fs;
    return fs;
}

int FileSystem::mkostempat(int dirfd, char* tmpl, int flags) {
    static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    size_t len = std::strlen(tmpl);
    if (len < 6 || std::strcmp(tmpl + len - 6, "XXXXXX") != 0) {
        errno = EINVAL;
        return -1;
    }
    char* x = tmpl + len - 6;
    for (int attempt = 0; attempt < 100; ++attempt) {
        unsigned char r[6];
        if (::getrandom(r, sizeof r, 0) != static_cast<ssize_t>(sizeof r)) {
            uint64_t v = static_cast<uint64_t>(::getpid()) * 2654435761u +
                         static_cast<uint64_t>(attempt) * 40503u +
                         static_cast<uint64_t>(std::clock());
            for (auto& c : r) c = static_cast<unsigned char>(v >>= 5);
        }
        for (int i = 0; i < 6; ++i) x[i] = kChars[r[i] % (sizeof kChars - 1)];
        int fd = ::openat(dirfd, tmpl, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | flags, 0600);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}
ssize_t FileSystem::write(int fd, const void* p, size_t n) {
    return ::write(fd, p, n);
}
ssize_t FileSystem::pread(int fd, void* p, size_t n, off_t off) {
    return ::pread(fd, p, n, off);
}
int FileSystem::fsync(int fd) {
    return ::fsync(fd);
}
int FileSystem::renameat(int from_dir, const char* from, int to_dir, const char* to) {
    return ::renameat(from_dir, from, to_dir, to);
}
int FileSystem::unlinkat(int dirfd, const char* path, int flags) {
    return ::unlinkat(dirfd, path, flags);
}
int FileSystem::linkat(int from_dir, const char* from, int to_dir, const char* to, int flags) {
    return ::linkat(from_dir, from, to_dir, to, flags);
}

Status FileSystem::write_all(int fd, const void* p, size_t n, const std::string& what) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return Status(DYAD_RC_BADFIO, "cannot write " + what, errno);
        }
        if (w == 0) return Status(DYAD_RC_BADFIO, "cannot write " + what + ": no progress", EIO);
        c += w;
        n -= static_cast<size_t>(w);
    }
    return Status::ok();
}

Status FileSystem::pread_all(int fd, void* p, size_t n, uint64_t off, const std::string& what) {
    char* c = static_cast<char*>(p);
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, c + got, n - got, static_cast<off_t>(off + got));
        if (r < 0) {
            if (errno == EINTR) continue;
            // A descriptor opened O_NONBLOCK (so that its open could not wait
            // on a FIFO), on a filesystem that honours it for a regular file:
            // blocking from now on.
            if (errno == EAGAIN) {
                int fl = ::fcntl(fd, F_GETFL);
                if (fl >= 0 && (fl & O_NONBLOCK) && ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0)
                    continue;
            }
            return Status(DYAD_RC_BADFIO, "read of " + what + " failed", errno);
        }
        if (r == 0) return Status(DYAD_RC_BADFIO, what + " shrank while being served", EIO);
        got += static_cast<size_t>(r);
    }
    return Status::ok();
}

namespace {
std::atomic<pid_t> cached_pid{0};
void forget_pid() {
    cached_pid.store(0, std::memory_order_relaxed);
}
}  // namespace

pid_t process_id() {
    pid_t p = cached_pid.load(std::memory_order_relaxed);
    if (p != 0) return p;
    static const int registered = ::pthread_atfork(nullptr, nullptr, forget_pid);
    (void)registered;
    p = ::getpid();
    cached_pid.store(p, std::memory_order_relaxed);
    return p;
}

}  // namespace dyad
