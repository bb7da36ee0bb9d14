// SPDX-License-Identifier: Apache-2.0
#include "serve_file.hpp"

#include <fcntl.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "common/paths.hpp"
#include "proto/fetch.hpp"

namespace dyad::service {

namespace {
// A filesystem without OFD locks is said once per process.
std::atomic<bool> g_warned_no_locks{false};
}  // namespace

Result<ServedFile> ServedFile::open(int dirfd, const std::string& dir, const std::string& up) {
    // Not into .dyad/ through a symlink (`m -> .dyad`, then `m/x`).
    return opened(open_beneath_unreserved(dirfd, dir, up, O_RDONLY | O_NOCTTY | O_NONBLOCK), dir,
                  up);
}

Result<ServedFile> ServedFile::opened(Result<UniqueFd> fd, const std::string& dir,
                                      const std::string& up) {
    if (fd) return ServedFile(std::move(fd.value()), up);
    const int e = fd.status().err();
    if (e == ENOENT)
        return Status(DYAD_RC_BADFIO, "no file '" + up + "' in producer directory " + dir, ENOENT);
    if (e == EXDEV || e == ELOOP)
        return Status(DYAD_RC_BADFIO,
                      "'" + up + "' resolves outside producer directory " + dir + ": refused",
                      EACCES);
    if (fd.status().rc() == DYAD_RC_BADFIO) return fd.status();  // said why already (.dyad/)
    if (e == EACCES || e == EPERM)
        return Status(DYAD_RC_BADFIO, "service may not read '" + up + "' in " + dir, EACCES);
    return fd.status();
}

Result<ServedFile> ServedFile::open_as(int dirfd, const std::string& dir, const std::string& up,
                                       const FsCreds& as) {
    auto acting = ActingAs::take(as);
    if (!acting) return acting.status();
    const std::string refused =
        "'" + up + "' is not readable by " + as.who +
        ": the kernel refuses it to that user (the mode, ACL or group of the file, or a "
        "directory on its way); this service has no key and serves a user only what that user "
        "could read itself (docs/security.md, \"The node-wide service\")";
    UniqueFd d(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!d.valid()) {
        const int e = errno;
        if (e == EACCES || e == EPERM) return Status(DYAD_RC_BADFIO, refused, EACCES);
        return Status(DYAD_RC_BADFIO, "cannot open producer directory " + dir, e);
    }
    struct stat want, got;
    if (::fstat(dirfd, &want) != 0 || ::fstat(d.get(), &got) != 0 || want.st_dev != got.st_dev ||
        want.st_ino != got.st_ino)
        return Status(DYAD_RC_BADFIO,
                      "producer directory " + dir +
                          " is no longer the one this service serves (moved or replaced): "
                          "restart dyadd",
                      ESTALE);
    auto fd = open_beneath_unreserved(d.get(), dir, up, O_RDONLY | O_NOCTTY | O_NONBLOCK);
    const int e = fd ? 0 : fd.status().err();
    if (!fd && fd.status().rc() != DYAD_RC_BADFIO && (e == EACCES || e == EPERM))
        return Status(DYAD_RC_BADFIO, refused, EACCES);
    return opened(std::move(fd), dir, up);
}

Status ServedFile::try_shared_lock() {
    struct flock fl = {};
    fl.l_type = F_RDLCK;
    fl.l_whence = SEEK_SET;
    int lr;
    while ((lr = ::fcntl(fd_.get(), F_OFD_SETLK, &fl)) != 0 && errno == EINTR) {
    }
    const int err = lr == 0 ? 0 : errno;
    if (err == 0) return Status::ok();
    if (err == EAGAIN || err == EACCES)
        return Status(DYAD_RC_BADFIO, "'" + upath_ + "' is locked by its producer", EAGAIN);
    if (err != ENOLCK && err != ENOSYS && err != EOPNOTSUPP && err != EINVAL)
        return Status(DYAD_RC_BADFIO, "cannot take a shared lock on '" + upath_ + "'", err);
    if (!g_warned_no_locks.exchange(true))
        DYAD_WARN("dyadd",
                  "the producer directory's filesystem has no OFD locks (%s): serving without them",
                  std::strerror(err));
    return Status::ok();
}

Status ServedFile::take() {
    Status locked = try_shared_lock();
    // What the file is comes first: a directory is refused as such, locked or not.
    if (::fstat(fd_.get(), &sb_) != 0)
        return Status(DYAD_RC_BADFIO, "stat of '" + upath_ + "' failed", errno);
    if (Status kind = served_kind(upath_, sb_); !kind) return kind;
    return locked;
}

void ServedFile::make_blocking() {
    // Of the flags F_SETFL changes, the open set O_NONBLOCK alone: clearing
    // all of them needs no F_GETFL first (one syscall per served file less).
    ::fcntl(fd_.get(), F_SETFL, 0);
}

Status served_kind(const std::string& up, const struct stat& sb) {
    if (S_ISDIR(sb.st_mode))
        return Status(DYAD_RC_BADFIO, "'" + up + "' is a directory, not a file", EISDIR);
    if (!S_ISREG(sb.st_mode))
        return Status(DYAD_RC_BADFIO, "'" + up + "' is not a regular file", EINVAL);
    return Status::ok();
}

}  // namespace dyad::service
