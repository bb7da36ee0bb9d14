// SPDX-License-Identifier: Apache-2.0
// One file of the producer directory as dyad.fetch and dyad.fetch_many
// serve it (docs/security.md, "What is protected, and how"): opened beneath the
// producer directory (never out of it, never into .dyad/), locked shared
// against its producer, a regular file. Both requests take the same steps
// in the same order, on a file thread:
//
//   ServedFile::open      the name, beneath the directory (O_NONBLOCK: a
//                         FIFO does not hold the thread); for a keyless
//                         peer other than dyadd's uid and root, open_as:
//                         with that user's credentials (access.hpp)
//   ServedFile::take      a shared OFD lock without waiting, then one fstat
//                         under it: what the file is now (a regular file)
//   FileServer::take_served  take(), then what this service published,
//                         unchanged (and readable by the peer where it
//                         could not be opened as the peer): its
//                         Snapshot (service.hpp)
//
// A file its producer holds locked is EAGAIN from take(): dyad.fetch waits
// and takes it again (fetch.cpp), dyad.fetch_many answers EBUSY for it
// (fetch_many.cpp; the consumer then fetches it alone, the way that waits).
#pragma once

#include <sys/stat.h>

#include <string>

#include "common/fd.hpp"
#include "access.hpp"
#include "common/status.hpp"

namespace dyad::service {

class ServedFile {
  public:
    // `upath` (normalized) beneath the producer directory `dir` (open as
    // `dirfd`); errors say why not (no such file, outside the directory,
    // not readable by the service).
    static Result<ServedFile> open(int dirfd, const std::string& dir, const std::string& upath);
    // The same, opened as the user `as` would open it (access.hpp): the
    // directory `dir` by its path (every directory from / down), then
    // `upath` beneath it, with that user's credentials; the directory must
    // still be the one open as `dirfd`. EACCES: the kernel refuses it to
    // that user.
    static Result<ServedFile> open_as(int dirfd, const std::string& dir, const std::string& upath,
                                      const FsCreds& as);

    // A shared lock, not waiting, then the file's stat under it. OK: stat()
    // is the file as it is now, a regular file. EAGAIN: its producer holds
    // the lock (take again later, or refuse). Otherwise the error that
    // refuses the file (not a regular file, the stat or the lock failed).
    // Filesystems without OFD locks are served without them (warned once).
    Status take();

    const std::string& upath() const { return upath_; }
    int fd() const { return fd_.get(); }
    // After a take() that succeeded.
    const struct stat& stat() const { return sb_; }
    // Reads block from now on (O_NONBLOCK only kept the open from waiting
    // on a FIFO).
    void make_blocking();
    // The descriptor, for the transfer (the lock goes with it).
    UniqueFd release() { return std::move(fd_); }

  private:
    ServedFile(UniqueFd fd, std::string upath) : fd_(std::move(fd)), upath_(std::move(upath)) {}
    // The file of an open beneath `dir`, or why not.
    static Result<ServedFile> opened(Result<UniqueFd> fd, const std::string& dir,
                                     const std::string& upath);
    Status try_shared_lock();
    UniqueFd fd_;
    std::string upath_;
    struct stat sb_ {};
};

// Whether `sb` is a file a fetch serves: a regular file (EISDIR for a
// directory, EINVAL for anything else).
Status served_kind(const std::string& upath, const struct stat& sb);

}  // namespace dyad::service
