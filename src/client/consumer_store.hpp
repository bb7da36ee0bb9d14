// SPDX-License-Identifier: Apache-2.0
// The consumer store: how fetched files land in the consumer directory.
// Bytes go into a temporary file beside the target, are checked against the
// END trailer (size and end-to-end checksum), get the producer's mode and
// mtime and a stamp naming the produce they are, then are renamed into
// place: a partial or corrupt file is never visible, and a failed transfer
// leaves nothing behind. One consumer per file per node moves it (striped
// OFD locks under .dyad/locks); the others find it present. (Files of a
// dyad.fetch_many batch take no lock: install_whole writes each into an
// unnamed file and links it into place; a racing lone fetch may move such a
// small file too, and install the same bytes again.) The file system calls
// that tests fault go through the FileSystem seam.
//
// Nothing here follows a symbolic link beneath the consumer directory (the
// directory itself may be one): every file is made and opened relative to a
// descriptor of its directory, reached with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS) (or one O_NOFOLLOW component at a time). A symlinked
// component is refused with an error naming it. `.dyad/` and `.dyad/locks/`
// must be real directories owned by this process's euid (made 0700, and
// tightened to it); lock files are 0600, with one name, owned by it. Another
// user who can write the consumer directory (a sticky /tmp, a group's
// project directory) therefore cannot make a consumer write, truncate or
// lock a file of its choosing, nor hold its locks.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/checksum.hpp"
#include "common/deadline.hpp"
#include "common/fd.hpp"
#include "common/fs.hpp"
#include "common/status.hpp"
#include "dtl/dtl.hpp"
#include "fetch_channel.hpp"
#include "record.hpp"

namespace dyad::client {

// Bytes per write(2) into a file the consumer makes. The size of a write
// sets the size of the page-cache folio the kernel allocates for it (Linux
// 6.x with large folios, e.g. ext4: a 1 MiB write takes an order-8 folio, an
// 8 KiB one order 1). High-order blocks are the ones a VM's free page
// reporting has handed back to the host, so large writes land on memory the
// host must fault in again: measured here (docs/design.md, "The 512 MiB
// tail"), 512 MiB in 1 MiB writes took 0.10-0.78 s of system time, in
// 128 KiB writes 0.11-0.15 s. Receive buffers stay 1 MiB (or larger); only
// the write(2) calls are cut.
constexpr size_t kWritePiece = size_t{128} << 10;

// Writes n bytes at p to fd in pieces of at most kWritePiece bytes.
[[nodiscard]] Status write_in_pieces(FileSystem& fs, int fd, const void* p, size_t n,
                                     const std::string& what);

// Receives file bytes into the temporary file, hashing as they pass.
class FileSink : public dtl::Sink {
  public:
    FileSink(FileSystem& fs, int fd, std::string what) : fs_(fs), fd_(fd), what_(std::move(what)) {}
    Status write(const void* p, size_t n) override;
    int fd() const override { return fd_; }
    void copied(uint64_t n) override;
    bool can_place() const override { return true; }
    Status placed(const void* p, size_t n) override;
    // Calls cb(bytes received so far) on the first bytes, then at most every
    // interval_s seconds while bytes arrive.
    void on_progress(std::function<void(uint64_t)> cb, double interval_s);
    uint64_t bytes() const { return bytes_; }
    bool kernel_copied() const { return kernel_; }
    std::string hex() const { return hash_.hex(); }

  private:
    FileSystem& fs_;
    int fd_;
    std::string what_;
    Xxh3 hash_;
    uint64_t bytes_ = 0;
    bool kernel_ = false;
    void tick();
    std::function<void(uint64_t)> progress_;
    std::chrono::steady_clock::duration interval_{};
    std::chrono::steady_clock::time_point next_{};
};

// A directory of DYAD's own (`name` under `at`: .dyad, .dyad/locks,
// .dyad/cache): made 0700 if missing; refused if it is a symbolic link, not
// a directory, or another user's; tightened to 0700 if ours but looser.
// `path` is how messages name it.
Result<UniqueFd> own_dir(int at, const char* name, const std::string& path);

class ConsumerStore {
  public:
    // `dir`: the consumer directory (canonical).
    ConsumerStore(std::string dir, FileSystem& fs, bool fsync_write)
        : dir_(std::move(dir)), fs_(fs), fsync_(fsync_write) {}
    ConsumerStore(const ConsumerStore&) = delete;
    ConsumerStore& operator=(const ConsumerStore&) = delete;

    std::string target(const std::string& upath) const { return dir_ + "/" + upath; }
    // Is the copy at upath's target this record's produce? (Its stamp, or
    // without one, size and mtime as rsync's quick check.)
    bool present(const std::string& upath, const Record& rec);
    // The copy at upath's target, open read-only, if it is this record's
    // produce (as present() checks, on the open file); else an invalid fd.
    // A copy is replaced by rename, never rewritten: the open file keeps
    // this produce's bytes whatever happens to the name meanwhile.
    UniqueFd open_present(const std::string& upath, const Record& rec);
    // upath's target, open read-only beneath the directory (no symbolic
    // link followed, nothing created), or an invalid fd (errno set).
    UniqueFd open_target(const std::string& upath);
    // The per-file lock (exclusive; released when the fd closes). While a
    // holder writes a file, its lock file names the temporary file (see
    // stage()); a holder that dies (kill -9) leaves that name behind, and
    // the next holder of the lock, who knows the writer is gone, removes the
    // temporary file.
    // Held by another process past `deadline`: DYAD_RC_TIMEOUT naming the
    // lock file, unless the holder is visibly moving the file (its
    // temporary file grew within the last `holder_idle_s` seconds).
    [[nodiscard]] Result<UniqueFd> lock(const std::string& upath,
                                        Deadline deadline = Deadline::never(),
                                        double holder_idle_s = 0);

    // The per-file lock if no one holds it now (nullopt if held, or on
    // any error): the cache's evictor, which never waits for a file in
    // flight (src/client/cache.hpp).
    std::optional<UniqueFd> try_lock(const std::string& upath);

    // One incoming file: a temporary file, removed unless committed.
    class Staging {
      public:
        ~Staging();
        FileSink& sink() { return *sink_; }
        const std::string& temp_path() const { return tmp_; }
        // Checks the trailer, then gives the file the record's mode, mtime
        // and stamp and renames it into place.
        [[nodiscard]] Status commit(const nlohmann::json& trailer, const Record& rec);

      private:
        friend class ConsumerStore;
        Staging(ConsumerStore& s, std::string upath) : store_(s), upath_(std::move(upath)) {}
        void forget();  // empties the lock file's record
        ConsumerStore& store_;
        std::string upath_;
        std::string tmp_;   // the temporary file's path (for messages)
        UniqueFd dir_fd_;   // the target's directory
        std::string name_;  // the temporary file's name in it
        UniqueFd fd_;
        int lock_fd_ = -1;  // the per-file lock's fd, whose record names tmp_
        std::unique_ptr<FileSink> sink_;
        bool committed_ = false;
    };
    // Creates the target's directories and the temporary file
    // (".NAME.dyad-PID-XXXXXX" beside the target). With the fd of the
    // file's lock (lock()), held until the staging ends, the lock file names
    // the temporary file meanwhile.
    [[nodiscard]] Result<std::unique_ptr<Staging>> stage(const std::string& upath,
                                                         int lock_fd = -1);

    // A small file whose bytes are all here (a dyad.fetch_many answer),
    // installed without a lock or a temporary name: written into an
    // unnamed file of the target's directory (O_TMPFILE), checked against
    // what the owner sent and the record, given mode, mtime and stamp, then linked
    // into place (over an older copy: linked to a temporary name and
    // renamed). A consumer killed on the way leaves nothing behind. False
    // (and nothing done) where the file system cannot make unnamed files or
    // /proc is missing: then lock() and stage().
    [[nodiscard]] Result<bool> install_whole(const std::string& upath, const Record& rec,
                                             const Sent& sent, const void* p, size_t n);

  private:
    // install_whole's last step: the written unnamed file `fd` linked into
    // place as `base` in the directory `dfd` (over an older copy); false:
    // unnamed files cannot be linked here (no /proc), use lock() and stage().
    Result<bool> link_unnamed(int fd, int dfd, const std::string& upath, const std::string& base,
                              const std::string& t);
    // Removes the temporary file a dead holder of this lock left (its lock
    // file's record), and empties the record.
    void reclaim(int lock_fd);
    // The consumer directory's descriptor (made if missing), kept open;
    // forget_root() when a create in it says ENOENT (it was removed).
    Result<std::shared_ptr<const UniqueFd>> root();
    void forget_root();
    // The directory of upath's target, beneath the consumer directory,
    // following no symlink; with `create`, made as needed.
    Result<UniqueFd> parent(const std::string& upath, bool create);
    // .dyad/locks, checked (real directories of this euid, 0700).
    Result<std::shared_ptr<const UniqueFd>> locks_dir();
    Result<UniqueFd> open_lock_file(const std::string& name);
    // Is the lock's holder moving its file (its temporary file, named in
    // the lock file, changed size since the last look)?
    bool holder_progress(int lock_fd, int64_t* last_size);

    std::string dir_;
    FileSystem& fs_;
    bool fsync_;
    std::mutex fds_mu_;
    std::shared_ptr<const UniqueFd> root_, locks_;
    std::atomic<bool> tmpfile_ok_{true};  // O_TMPFILE and /proc work here (install_whole)
    // linkat(fd, "", AT_EMPTY_PATH) links an unnamed file: with
    // CAP_DAC_READ_SEARCH, or on kernels that let its opener (6.10 on).
    // Cleared at its first refusal: then by its /proc name.
    std::atomic<bool> flink_ok_{true};
};

// Identity of an installed copy: which produce (owner, generation, mtime)
// and how many bytes were installed (the user.dyad extended attribute).
std::string install_stamp(const Record& rec, uint64_t installed_size);

// The produce a file installed by DYAD came from (its stamp), if it has one.
struct InstalledFrom {
    std::string owner;
    uint64_t generation = 0;
};
std::optional<InstalledFrom> installed_from(const std::string& path);

}  // namespace dyad::client
