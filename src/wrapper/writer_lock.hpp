// SPDX-License-Identifier: Apache-2.0
// Which process publishes a file that several processes write through one
// open file (shell redirection, `exec >`, descriptors passed to children):
// the last one to stop writing it. Each process under the wrapper that
// holds the file open for writing holds a shared flock on a lock file of
// its own open (one per written file, named by its device and inode, in
// PRODUCER_DIR/.dyad/writers); a process that stops writing it trades its
// shared lock for an exclusive one without waiting: it gets it only when
// no other process holds one, and then publishes. Two that stop at once
// cannot both fail to get it (the trade first drops the shared lock); both
// may get it in turn, and then the file, whole, is published twice.
// Processes not under the wrapper are not counted. docs/user-guide.md,
// "Redirection publishes".
#pragma once

#include <string>

namespace dyad::wrapper {

class WriterLock {
  public:
    WriterLock() = default;
    // The lock of the file open as `fd` (a regular file), taken shared in
    // `dir` (made if absent). Invalid if it cannot be taken (then the
    // process that opened the file publishes it, as before).
    static WriterLock take(const std::string& dir, int fd);
    bool valid() const { return fd_ >= 0; }
    int fd() const { return fd_; }
    // Ends this process's hold: true if it was the last holder (the lock is
    // then held exclusively until end()).
    bool last();
    // Releases it (removing its file when it was the last holder).
    void end(bool was_last);
    // Forgets the descriptor (the program closed it under us).
    void lost() { fd_ = -1; }

  private:
    int fd_ = -1;
    std::string path_;
};

}  // namespace dyad::wrapper
