// SPDX-License-Identifier: Apache-2.0
#include "consumer_store.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "common/paths.hpp"
#include "fetch_channel.hpp"

namespace dyad::client {
namespace {

// A write the file system refused for want of space says how much the copy
// needed and how much is free where it goes (what to clear or where else to
// consume).
Status no_space(Status s, int fd, uint64_t needed, bool at_least) {
    if (s || s.err() != ENOSPC) return s;
    std::string free_text = "unknown";
    struct statvfs vs;
    if (::fstatvfs(fd, &vs) == 0)
        free_text = std::to_string(static_cast<uint64_t>(vs.f_bavail) * vs.f_frsize);
    return Status(s.rc(),
                  s.message() + " (it needs " + (at_least ? "more than " : "") +
                      std::to_string(needed) + " bytes; " + free_text +
                      " bytes free on its file system: free some space or use another consumer "
                      "directory)",
                  ENOSPC);
}

constexpr const char* kSub = "client";
constexpr uint64_t kLockStripes = 256;  // lock files per consumer directory
constexpr const char* kStampAttr = "user.dyad";

std::string uid_text(uid_t uid) {
    std::string s = "uid " + std::to_string(uid);
    struct passwd pw, *found = nullptr;
    char buf[1024];
    if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found)
        s += " (" + std::string(pw.pw_name) + ")";
    return s;
}

}  // namespace

// A directory of DYAD's own (.dyad, .dyad/locks) under `at`: made 0700 if
// missing; refused if it is a symbolic link, not a directory, or owned by
// another user (who could plant links or hold locks in it); tightened to
// 0700 if it is ours but looser (made by an older version).
Result<UniqueFd> own_dir(int at, const char* name, const std::string& path) {
    constexpr int kFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    UniqueFd fd(::openat(at, name, kFlags));
    if (!fd.valid() && errno == ENOENT) {
        if (::mkdirat(at, name, 0700) != 0 && errno != EEXIST)
            return Status(DYAD_RC_BADFIO, "cannot create directory '" + path + "'", errno);
        fd.reset(::openat(at, name, kFlags));
    }
    struct stat st;
    if (!fd.valid()) {
        const int e = errno;
        if (::fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode))
            return Status(DYAD_RC_BADFIO,
                          "'" + path + "' is " +
                              (S_ISLNK(st.st_mode) ? "a symbolic link" : "not a directory") +
                              ", not DYAD's directory: refused (another user may have planted it; "
                              "remove it, or use a consumer directory of your own)",
                          ELOOP);
        return Status(DYAD_RC_BADFIO, "cannot open directory '" + path + "'", e);
    }
    if (::fstat(fd.get(), &st) != 0)
        return Status(DYAD_RC_BADFIO, "cannot stat '" + path + "'", errno);
    const uid_t me = ::geteuid();
    if (st.st_uid != me)
        return Status(DYAD_RC_BADFIO,
                      "'" + path + "' belongs to " + uid_text(st.st_uid) +
                          ", not to this consumer (" + uid_text(me) +
                          "): refused, as its owner could plant links to other files in it. "
                          "Remove it (its owner, or root) or use a consumer directory of your own",
                      EPERM);
    if ((st.st_mode & 07777) != 0700 && ::fchmod(fd.get(), 0700) != 0)
        return Status(DYAD_RC_BADFIO, "cannot make '" + path + "' private (chmod 700)", errno);
    return fd;
}

std::string install_stamp(const Record& rec, uint64_t installed_size) {
    return rec.owner + " " + std::to_string(rec.generation) + " " + std::to_string(rec.mtime_ns) +
           " " + std::to_string(installed_size);
}

std::optional<InstalledFrom> installed_from(const std::string& path) {
    char buf[512];
    ssize_t n = ::getxattr(path.c_str(), kStampAttr, buf, sizeof buf - 1);
    if (n <= 0) return std::nullopt;
    buf[n] = '\0';
    std::string text(buf);
    size_t sp = text.find(' ');
    if (sp == std::string::npos || sp == 0) return std::nullopt;
    char* end = nullptr;
    unsigned long long g = std::strtoull(text.c_str() + sp + 1, &end, 10);
    if (end == text.c_str() + sp + 1 || *end != ' ') return std::nullopt;
    return InstalledFrom{text.substr(0, sp), g};
}

Status write_in_pieces(FileSystem& fs, int fd, const void* p, size_t n, const std::string& what) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        size_t k = std::min(n, kWritePiece);
        Status s = fs.write_all(fd, c, k, what);
        if (!s) return s;
        c += k;
        n -= k;
    }
    return Status::ok();
}

// ---- FileSink ----

void FileSink::on_progress(std::function<void(uint64_t)> cb, double interval_s) {
    progress_ = std::move(cb);
    interval_ = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(interval_s > 0 ? interval_s : 0));
    next_ = {};
}

void FileSink::tick() {
    if (!progress_) return;
    auto now = std::chrono::steady_clock::now();  // vDSO: no system call
    if (now < next_) return;
    next_ = now + interval_;
    progress_(bytes_);
}

Status FileSink::write(const void* p, size_t n) {
    hash_.update(p, n);
    bytes_ += n;
    Status s = no_space(write_in_pieces(fs_, fd_, p, n, what_), fd_, bytes_ - n, true);
    tick();
    return s;
}

void FileSink::copied(uint64_t n) {
    bytes_ += n;
    kernel_ = true;
    if (n) tick();
}

Status FileSink::placed(const void* p, size_t n) {
    hash_.update(p, n);
    bytes_ += n;
    tick();
    return Status::ok();
}

// ---- ConsumerStore ----

// The directories DYAD makes for the consumer (the consumer directory if it
// is missing, the directories of an upath beneath it): private. A consumer
// cannot know the modes of the producer's directories, which may be all
// that kept a 0644 file from other users there; so what it makes is never
// wider than they could be. Directories that exist are used as they are
// (docs/security.md, "The consumer's directories").
constexpr mode_t kConsumerDirMode = 0700;

Result<std::shared_ptr<const UniqueFd>> ConsumerStore::root() {
    std::lock_guard<std::mutex> lk(fds_mu_);
    if (root_) return root_;
    Status s = mkdir_p(dir_, kConsumerDirMode);
    if (!s) return s;
    UniqueFd fd(::open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return Status(DYAD_RC_BADFIO, "cannot open consumer directory " + dir_, errno);
    root_ = std::make_shared<const UniqueFd>(std::move(fd));
    return root_;
}

void ConsumerStore::forget_root() {
    std::lock_guard<std::mutex> lk(fds_mu_);
    root_.reset();
    locks_.reset();
}

Result<UniqueFd> ConsumerStore::parent(const std::string& upath, bool create) {
    const std::string rel = dir_part(upath);
    for (int attempt = 0;; ++attempt) {
        auto r = root();
        if (!r) return r.status();
        auto fd = dir_beneath(r.value()->get(), rel, create, kConsumerDirMode);
        if (fd) return fd;
        Status e = fd.status();
        // The consumer directory went away meanwhile: made again, once.
        if (e.err() == ENOENT && create && attempt == 0) {
            forget_root();
            continue;
        }
        if (e.err() == ELOOP)
            return Status(DYAD_RC_BADFIO,
                          "cannot install '" + upath + "' in consumer directory " + dir_ + ": " +
                              e.message() +
                              "; DYAD follows no symbolic link beneath the consumer directory (it "
                              "could lead the file elsewhere): make it a directory",
                          ELOOP);
        if (e.rc() == DYAD_RC_SYSFAIL)
            return Status(DYAD_RC_BADFIO,
                          "cannot open directory '" + rel + "' in consumer directory " + dir_,
                          e.err());
        return e.wrap("consumer directory " + dir_);
    }
}

bool ConsumerStore::present(const std::string& upath, const Record& rec) {
    auto dir = parent(upath, false);
    if (!dir) return false;
    const std::string base = base_part(upath);
    UniqueFd fd(::openat(dir->get(), base.c_str(),
                         O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    struct stat st;
    // A copy this user may not read (the producer's mode): its size and
    // mtime only.
    const bool unreadable = !fd.valid() && errno == EACCES;
    if (unreadable ? ::fstatat(dir->get(), base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0
                   : !fd.valid() || ::fstat(fd.get(), &st) != 0)
        return false;
    if (!S_ISREG(st.st_mode)) return false;
    char buf[512];
    ssize_t n = unreadable ? -1 : ::fgetxattr(fd.get(), kStampAttr, buf, sizeof buf - 1);
    if (n >= 0)
        return std::string(buf, static_cast<size_t>(n)) ==
               install_stamp(rec, static_cast<uint64_t>(st.st_size));
    // No stamp (file system without user xattrs, or a file DYAD did not
    // install): size and mtime, as rsync's quick check.
    return static_cast<uint64_t>(st.st_size) == rec.size &&
           static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec ==
               rec.mtime_ns;
}

UniqueFd ConsumerStore::open_target(const std::string& upath) {
    auto dir = parent(upath, false);
    if (!dir) {
        errno = dir.status().err() ? dir.status().err() : ENOENT;
        return UniqueFd();
    }
    UniqueFd fd(::openat(dir->get(), base_part(upath).c_str(),
                         O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    if (fd.valid()) ::fcntl(fd.get(), F_SETFL, 0);  // reads block (O_NONBLOCK guarded the open)
    return fd;
}

UniqueFd ConsumerStore::open_present(const std::string& upath, const Record& rec) {
    UniqueFd fd = open_target(upath);
    struct stat st;
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return UniqueFd();
    char buf[512];
    ssize_t n = ::fgetxattr(fd.get(), kStampAttr, buf, sizeof buf - 1);
    const bool same =
        n >= 0 ? std::string(buf, static_cast<size_t>(n)) ==
                     install_stamp(rec, static_cast<uint64_t>(st.st_size))
               : static_cast<uint64_t>(st.st_size) == rec.size &&
                     static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec ==
                         rec.mtime_ns;
    if (!same) return UniqueFd();
    return fd;
}

Result<std::shared_ptr<const UniqueFd>> ConsumerStore::locks_dir() {
    {
        std::lock_guard<std::mutex> lk(fds_mu_);
        if (locks_) return locks_;
    }
    auto r = root();
    if (!r) return r.status();
    const std::string reserved = dir_ + "/" + kReservedDir;
    auto top = own_dir(r.value()->get(), kReservedDir, reserved);
    if (!top) return top.status();
    auto locks = own_dir(top->get(), "locks", reserved + "/locks");
    if (!locks) return locks.status();
    std::lock_guard<std::mutex> lk(fds_mu_);
    locks_ = std::make_shared<const UniqueFd>(std::move(locks.value()));
    return locks_;
}

Result<UniqueFd> ConsumerStore::open_lock_file(const std::string& name) {
    const std::string path = dir_ + "/" + kReservedDir + "/locks/" + name;
    for (int attempt = 0;; ++attempt) {
        auto locks = locks_dir();
        if (!locks) return locks.status();
        UniqueFd fd(::openat(locks.value()->get(), name.c_str(),
                             O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
                             0600));
        if (!fd.valid() && errno == ENOENT && attempt == 0) {  // removed meanwhile
            forget_root();
            continue;
        }
        if (!fd.valid() && errno == ELOOP)
            return Status(DYAD_RC_BADFIO,
                          "lock file '" + path +
                              "' is a symbolic link, which DYAD never follows: refused (remove it)",
                          ELOOP);
        if (!fd.valid())
            return Status(DYAD_RC_BADFIO, "cannot open lock file '" + path + "'", errno);
        struct stat st;
        if (::fstat(fd.get(), &st) != 0)
            return Status(DYAD_RC_BADFIO, "cannot stat lock file '" + path + "'", errno);
        if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_nlink != 1)
            return Status(DYAD_RC_BADFIO,
                          "lock file '" + path +
                              "' is not a file of this consumer's own (another owner, another "
                              "kind of file, or more than one name): refused; remove it",
                          EPERM);
        if ((st.st_mode & 0777) != 0600) ::fchmod(fd.get(), 0600);  // made by an older version
        return fd;
    }
}

std::optional<UniqueFd> ConsumerStore::try_lock(const std::string& upath) {
    Xxh3 kh;  // the stripe lock() takes
    kh.update(upath.data(), upath.size());
    char stripe[32];
    std::snprintf(stripe, sizeof stripe, "%02x.lock",
                  static_cast<unsigned>(kh.digest() % kLockStripes));
    auto fd = open_lock_file(stripe);
    if (!fd) return std::nullopt;
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (::fcntl(fd->get(), F_OFD_SETLK, &fl) != 0) return std::nullopt;
    return std::move(fd.value());
}

Result<UniqueFd> ConsumerStore::lock(const std::string& upath, Deadline deadline,
                                     double holder_idle_s) {
    // Striped over a fixed set of files so the lock directory does not grow
    // with the number of files.
    Xxh3 kh;
    kh.update(upath.data(), upath.size());
    char stripe[32];
    std::snprintf(stripe, sizeof stripe, "%02x.lock",
                  static_cast<unsigned>(kh.digest() % kLockStripes));
    auto fd = open_lock_file(stripe);
    if (!fd) return fd;
    const int lfd = fd->get();
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    // Without a deadline, the kernel's wait; with one, tries until it
    // passes (1 ms, doubling to 50 ms), as long past it as the holder is
    // seen moving its file (holder_idle_s).
    const auto path = [&] { return dir_ + "/" + kReservedDir + "/locks/" + stripe; };
    auto pause = std::chrono::milliseconds(1);
    std::optional<std::chrono::steady_clock::time_point> last_move;  // past the deadline
    int64_t last_size = -1;
    for (;;) {
        int cmd = deadline.infinite() ? F_OFD_SETLKW : F_OFD_SETLK;
        if (::fcntl(lfd, cmd, &fl) == 0) break;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EACCES)
            return Status(DYAD_RC_BADFIO, "cannot lock '" + path() + "'", errno);
        if (deadline.expired()) {
            auto now = std::chrono::steady_clock::now();
            if (holder_progress(lfd, &last_size))
                last_move = now;
            else if (!last_move || now - *last_move >= std::chrono::duration<double>(holder_idle_s))
                return Status(DYAD_RC_TIMEOUT,
                              "'" + upath + "' was not installed: its lock file '" + path() +
                                  "' is held by another process (a consumer of the same file "
                                  "that is not moving it, or any process holding a lock on "
                                  "that file) and was still held at the call's deadline "
                                  "(DYAD_WAIT_TIMEOUT / --timeout); lslocks shows the holder",
                              ETIMEDOUT);
        }
        double left = deadline.expired() ? 0.05 : deadline.remaining();
        std::this_thread::sleep_for(
            std::min<std::chrono::duration<double>>(pause, std::chrono::duration<double>(left)));
        pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
    reclaim(lfd);
    return fd;
}

namespace {

// A record's path: relative, inside the directory, and named like a
// temporary file of the store (nothing else is ever removed).
bool temp_name(const std::string& rel) {
    if (rel.empty() || rel[0] == '/') return false;
    size_t start = 0;
    std::string base;
    for (;;) {
        size_t slash = rel.find('/', start);
        std::string part = rel.substr(start, slash == std::string::npos ? slash : slash - start);
        if (part.empty() || part == "." || part == "..") return false;
        if (slash == std::string::npos) {
            base = part;
            break;
        }
        start = slash + 1;
    }
    return base.size() > 7 && base[0] == '.' && base.find(".dyad-") != std::string::npos;
}

}  // namespace

namespace {
// A lock file's record: "PID PATH\n".
bool parse_record(int lock_fd, std::string* pid, std::string* rel) {
    char buf[4608];
    ssize_t n = ::pread(lock_fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    std::string rec(buf, static_cast<size_t>(n));
    size_t sp = rec.find(' ');
    size_t nl = rec.find('\n');
    if (sp == std::string::npos || nl == std::string::npos || sp >= nl) return false;
    *pid = rec.substr(0, sp);
    *rel = rec.substr(sp + 1, nl - sp - 1);
    return true;
}
}  // namespace

void ConsumerStore::reclaim(int lock_fd) {
    std::string pid, rel;
    struct stat st;
    if (::fstat(lock_fd, &st) != 0 || st.st_size == 0) return;  // nobody died writing (usual)
    if (parse_record(lock_fd, &pid, &rel)) {
        std::string path = dir_ + "/" + rel;
        if (!temp_name(rel)) {
            DYAD_WARN(kSub, "lock file record '%s %s' does not name a temporary file: ignored",
                      pid.c_str(), rel.c_str());
        } else if (auto dir = parent(rel, false); !dir) {
            if (dir.status().err() != ENOENT)
                DYAD_WARN(kSub, "cannot remove %s (left by consumer pid %s, which died): %s",
                          path.c_str(), pid.c_str(), dir.status().to_string().c_str());
        } else if (fs_.unlinkat(dir->get(), base_part(rel).c_str(), 0) == 0) {
            DYAD_INFO(kSub, "removed %s: consumer pid %s died while writing it", path.c_str(),
                      pid.c_str());
        } else if (errno != ENOENT) {
            DYAD_WARN(kSub, "cannot remove %s (left by consumer pid %s, which died): %s",
                      path.c_str(), pid.c_str(), std::strerror(errno));
        }
    }
    if (::ftruncate(lock_fd, 0) != 0)
        DYAD_DEBUG(kSub, "cannot empty a lock file: %s", std::strerror(errno));
}

bool ConsumerStore::holder_progress(int lock_fd, int64_t* last_size) {
    std::string pid, rel;
    if (!parse_record(lock_fd, &pid, &rel) || !temp_name(rel)) return false;
    auto dir = parent(rel, false);
    struct stat st;
    if (!dir || ::fstatat(dir->get(), base_part(rel).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode))
        return false;
    if (static_cast<int64_t>(st.st_size) == *last_size) return false;
    *last_size = static_cast<int64_t>(st.st_size);
    return true;
}

Result<std::unique_ptr<ConsumerStore::Staging>> ConsumerStore::stage(const std::string& upath,
                                                                     int lock_fd) {
    auto dir = parent(upath, true);
    if (!dir) return dir.status();
    const std::string pid = std::to_string(process_id());
    const std::string base = base_part(upath);
    const std::string sub = dir_part(upath);
    const std::string shown_dir = sub.empty() ? dir_ : dir_ + "/" + sub;
    std::string tmpl = "." + base + ".dyad-" + pid + "-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    std::unique_ptr<Staging> st(new Staging(*this, upath));
    st->fd_ = UniqueFd(fs_.mkostempat(dir->get(), buf.data(), O_CLOEXEC));
    if (!st->fd_.valid() && errno == ENOENT) {  // the directory went away meanwhile
        forget_root();
        dir = parent(upath, true);
        if (!dir) return dir.status();
        std::copy(tmpl.begin(), tmpl.end(), buf.begin());
        st->fd_ = UniqueFd(fs_.mkostempat(dir->get(), buf.data(), O_CLOEXEC));
    }
    if (!st->fd_.valid())
        return Status(DYAD_RC_BADFIO, "cannot create a temporary file in " + shown_dir, errno);
    st->dir_fd_ = std::move(dir.value());
    st->name_ = buf.data();
    const std::string rel = sub.empty() ? st->name_ : sub + "/" + st->name_;
    st->tmp_ = dir_ + "/" + rel;
    st->sink_ = std::make_unique<FileSink>(fs_, st->fd_.get(), "'" + st->tmp_ + "'");
    if (lock_fd >= 0) {
        // "PID PATH\n", PATH relative to the consumer directory.
        // What follows the line (a longer earlier one's end) is never read.
        std::string line = pid + " " + rel + "\n";
        if (::pwrite(lock_fd, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size()))
            st->lock_fd_ = lock_fd;
        else
            DYAD_DEBUG(kSub, "cannot note %s in its lock file: %s", st->tmp_.c_str(),
                       std::strerror(errno));
    }
    return st;
}

void ConsumerStore::Staging::forget() {
    if (lock_fd_ < 0) return;
    if (::ftruncate(lock_fd_, 0) != 0)
        DYAD_DEBUG(kSub, "cannot empty a lock file: %s", std::strerror(errno));
    lock_fd_ = -1;
}

Result<bool> ConsumerStore::install_whole(const std::string& upath, const Record& rec,
                                          const Sent& sent, const void* p, size_t n) {
    if (!tmpfile_ok_.load(std::memory_order_relaxed)) return false;
    Status s = verify_sent(sent, p, n, upath);
    if (!s) return s;
    if (n != rec.size)
        return Status(DYAD_RC_BADFETCH,
                      "'" + upath + "' arrived with " + std::to_string(n) +
                          " bytes but was published with " + std::to_string(rec.size) +
                          ": not installed",
                      ESTALE);
    std::string t = target(upath);
    const std::string base = base_part(upath);
    const std::string sub = dir_part(upath);
    const std::string shown_dir = sub.empty() ? dir_ : dir_ + "/" + sub;
    auto dir = parent(upath, true);
    if (!dir) return dir.status();
    UniqueFd fd(::openat(dir->get(), ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600));
    if (!fd.valid() && errno == ENOENT) {  // the directory went away meanwhile
        forget_root();
        dir = parent(upath, true);
        if (!dir) return dir.status();
        fd = UniqueFd(::openat(dir->get(), ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600));
    }
    const int dfd = dir->get();
    if (!fd.valid()) {
        if (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL) {
            DYAD_DEBUG(kSub, "%s cannot make unnamed files (%s): temporary files instead",
                       shown_dir.c_str(), std::strerror(errno));
            tmpfile_ok_ = false;
            return false;
        }
        return Status(DYAD_RC_BADFIO, "cannot create a file in " + shown_dir, errno);
    }
    s = no_space(write_in_pieces(fs_, fd.get(), p, n, "'" + t + "'"), fd.get(), n, false);
    if (!s) return s;
    if (fsync_ && fs_.fsync(fd.get()) != 0)
        return Status(DYAD_RC_BADFIO, "fsync of the copy of '" + upath + "' failed", errno);
    ::fchmod(fd.get(), rec.mode & 0777);
    if (rec.mtime_ns > 0) {
        struct timespec ts[2];
        ts[0].tv_sec = ts[1].tv_sec = rec.mtime_ns / 1000000000LL;
        ts[0].tv_nsec = ts[1].tv_nsec = rec.mtime_ns % 1000000000LL;
        ::futimens(fd.get(), ts);
    }
    std::string stamp = install_stamp(rec, n);
    if (::fsetxattr(fd.get(), kStampAttr, stamp.data(), stamp.size(), 0) != 0 && errno != ENOTSUP &&
        errno != EOPNOTSUPP)
        DYAD_DEBUG(kSub, "cannot stamp '%s': %s", t.c_str(), std::strerror(errno));
    return link_unnamed(fd.get(), dfd, upath, base, t);
}

Result<bool> ConsumerStore::link_unnamed(int fd, int dfd, const std::string& upath,
                                         const std::string& base, const std::string& t) {
    // Linked by its descriptor where the kernel lets this process
    // (flink_ok_), else by its /proc name, which costs a walk through
    // /proc (on 10,000 x 4 KiB in tmpfs, ~1.5 of the ~17 us an install
    // takes). Into the directory's descriptor: a name is never followed.
    if (flink_ok_.load(std::memory_order_relaxed)) {
        if (fs_.linkat(fd, "", dfd, base.c_str(), AT_EMPTY_PATH) == 0) return true;
        // Refused (ENOENT without the capability), or the target's own
        // error (EEXIST, a directory gone): the /proc name below says which.
    }
    char self[64];
    std::snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    if (fs_.linkat(AT_FDCWD, self, dfd, base.c_str(), AT_SYMLINK_FOLLOW) == 0) {
        if (flink_ok_.exchange(false))
            DYAD_DEBUG(kSub, "linkat(AT_EMPTY_PATH) refused here: unnamed files linked by /proc");
        return true;
    }
    if (errno == ENOENT && ::access("/proc/self/fd", F_OK) != 0) {
        DYAD_DEBUG(kSub, "no /proc: temporary files instead of unnamed ones");
        tmpfile_ok_ = false;
        return false;
    }
    if (errno != EEXIST)
        return Status(DYAD_RC_BADFIO, "cannot put '" + upath + "' in place at " + t, errno);
    // An older copy is there: a temporary name, then over it.
    std::string tmp =
        "." + base + ".dyad-" + std::to_string(process_id()) + "-" + std::to_string(fd);
    fs_.unlinkat(dfd, tmp.c_str(),
                 0);  // a name of this process's, left by a crash of an earlier one
    if (::linkat(AT_FDCWD, self, dfd, tmp.c_str(), AT_SYMLINK_FOLLOW) != 0)
        return Status(DYAD_RC_BADFIO, "cannot put '" + upath + "' in place at " + t, errno);
    if (fs_.renameat(dfd, tmp.c_str(), dfd, base.c_str()) != 0) {
        int e = errno;
        fs_.unlinkat(dfd, tmp.c_str(), 0);
        return Status(DYAD_RC_BADFIO, "cannot move '" + upath + "' into place at " + t, e);
    }
    return true;
}

ConsumerStore::Staging::~Staging() {
    if (!committed_ && dir_fd_.valid()) store_.fs_.unlinkat(dir_fd_.get(), name_.c_str(), 0);
    forget();
}

Status ConsumerStore::Staging::commit(const nlohmann::json& trailer, const Record& rec) {
    FileSink& sink = *sink_;
    Status s = verify_trailer(trailer, {sink.bytes(), sink.hex(), sink.kernel_copied()}, upath_);
    if (!s) return s;
    // The owner serves only the file as published; anything else is not
    // the produced file and is not installed.
    if (sink.bytes() != rec.size)
        return Status(DYAD_RC_BADFETCH,
                      "'" + upath_ + "' arrived with " + std::to_string(sink.bytes()) +
                          " bytes but was published with " + std::to_string(rec.size) +
                          ": not installed",
                      ESTALE);
    int fd = fd_.get();
    if (store_.fsync_ && store_.fs_.fsync(fd) != 0)
        return Status(DYAD_RC_BADFIO, "fsync of '" + tmp_ + "' failed", errno);
    ::fchmod(fd, rec.mode & 0777);
    if (rec.mtime_ns > 0) {
        struct timespec ts[2];
        ts[0].tv_sec = ts[1].tv_sec = rec.mtime_ns / 1000000000LL;
        ts[0].tv_nsec = ts[1].tv_nsec = rec.mtime_ns % 1000000000LL;
        ::futimens(fd, ts);
    }
    // The stamp says which produce this copy is; set before the rename so
    // the file and its stamp appear together.
    std::string stamp = install_stamp(rec, sink.bytes());
    if (::fsetxattr(fd, kStampAttr, stamp.data(), stamp.size(), 0) != 0 && errno != ENOTSUP &&
        errno != EOPNOTSUPP)
        DYAD_DEBUG(kSub, "cannot stamp '%s': %s", tmp_.c_str(), std::strerror(errno));
    std::string t = store_.target(upath_);
    if (store_.fs_.renameat(dir_fd_.get(), name_.c_str(), dir_fd_.get(),
                            base_part(upath_).c_str()) != 0)
        return Status(DYAD_RC_BADFIO, "cannot move '" + upath_ + "' into place at " + t, errno);
    committed_ = true;
    forget();
    return Status::ok();
}

}  // namespace dyad::client
