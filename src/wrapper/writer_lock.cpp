// SPDX-License-Identifier: Apache-2.0
#include "writer_lock.hpp"

#include <cerrno>
#include <cstdio>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace dyad::wrapper {

namespace {

// System calls, not the interposed functions of this library.
int sys_open(const char* path, int flags, mode_t mode) {
    return static_cast<int>(::syscall(SYS_openat, AT_FDCWD, path, flags, mode));
}
void sys_close(int fd) {
    ::syscall(SYS_close, fd);
}

// Lock descriptors sit high, out of the way of descriptors programs place
// themselves (dup2 to 3..9, a shell's saved ones from 10).
constexpr int kHighFd = 700;

int move_high(int fd) {
    int high = static_cast<int>(::syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, kHighFd));
    if (high < 0) return fd;  // a low descriptor limit: stays where it is
    sys_close(fd);
    return high;
}

}  // namespace

WriterLock WriterLock::take(const std::string& dir, int fd) {
    WriterLock l;
    struct stat sb;
    if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) return l;
    char name[64];
    std::snprintf(name, sizeof name, "/%llx-%llx", static_cast<unsigned long long>(sb.st_dev),
                  static_cast<unsigned long long>(sb.st_ino));
    const std::string path = dir + name;
    for (int attempt = 0; attempt < 4; ++attempt) {
        int lfd = sys_open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (lfd < 0 && errno == ENOENT) {
            // PRODUCER_DIR/.dyad, then its writers/ (best effort: the open says).
            const std::string parent = dir.substr(0, dir.rfind('/'));
            ::mkdir(parent.c_str(), 0700);
            ::mkdir(dir.c_str(), 0700);
            lfd = sys_open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        }
        if (lfd < 0) return l;
        int r;
        while ((r = ::flock(lfd, LOCK_SH)) != 0 && errno == EINTR) {
        }
        // The last holder removes the file when it is done: a lock on a
        // removed file counts for nothing, take it again.
        struct stat mine, named;
        if (r == 0 && ::fstat(lfd, &mine) == 0 && ::stat(path.c_str(), &named) == 0 &&
            mine.st_ino == named.st_ino && mine.st_dev == named.st_dev) {
            l.fd_ = move_high(lfd);
            l.path_ = path;
            return l;
        }
        sys_close(lfd);
        if (r != 0) return l;
    }
    return l;
}

bool WriterLock::last() {
    if (fd_ < 0) return false;
    // Dropping the shared lock first: of two holders ending at once, one
    // gets the exclusive lock.
    return ::flock(fd_, LOCK_EX | LOCK_NB) == 0;
}

void WriterLock::end(bool was_last) {
    if (fd_ < 0) return;
    if (was_last) ::unlink(path_.c_str());
    sys_close(fd_);
    fd_ = -1;
}

}  // namespace dyad::wrapper
