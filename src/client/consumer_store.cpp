// SPDX-License-Identifier: Apache-2.0
#include "consumer_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/log.hpp"
#include "common/paths.hpp"
#include "fetch_channel.hpp"

namespace dyad::client {
namespace {

constexpr const char* kSub = "client";
constexpr uint64_t kLockStripes = 256;  // lock files per consumer directory
constexpr const char* kStampAttr = "user.dyad";

std::string dirname_of(const std::string& p) {
    size_t slash = p.rfind('/');
    return slash == 0 ? "/" : p.substr(0, slash);
}

// Exclusive OFD lock on a lock file: released when the fd closes, and not
// dropped when another fd of this process to the same file closes.
Result<UniqueFd> lock_file(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0664));
    if (!fd.valid()) return Status(DYAD_RC_BADFIO, "cannot open lock file '" + path + "'", errno);
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    while (::fcntl(fd.get(), F_OFD_SETLKW, &fl) != 0) {
        if (errno == EINTR) continue;
        return Status(DYAD_RC_BADFIO, "cannot lock '" + path + "'", errno);
    }
    return fd;
}

}  // namespace

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
    Status s = fs_.write_all(fd_, p, n, what_);
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

bool ConsumerStore::present(const std::string& upath, const Record& rec) const {
    std::string t = target(upath);
    struct stat st;
    if (::stat(t.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    char buf[512];
    ssize_t n = ::getxattr(t.c_str(), kStampAttr, buf, sizeof buf - 1);
    if (n >= 0)
        return std::string(buf, static_cast<size_t>(n)) ==
               install_stamp(rec, static_cast<uint64_t>(st.st_size));
    // No stamp (file system without user xattrs, or a file DYAD did not
    // install): size and mtime, as rsync's quick check.
    return static_cast<uint64_t>(st.st_size) == rec.size &&
           static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec ==
               rec.mtime_ns;
}

Status ConsumerStore::ensure_dir(const std::string& dir) {
    constexpr size_t kMaxDirs = 4096;
    {
        std::lock_guard<std::mutex> lk(dirs_mu_);
        if (dirs_.count(dir)) return Status::ok();
    }
    Status s = mkdir_p(dir, 02775);
    if (!s) return s;
    std::lock_guard<std::mutex> lk(dirs_mu_);
    if (dirs_.size() >= kMaxDirs) dirs_.clear();
    dirs_.insert(dir);
    return s;
}

void ConsumerStore::forget_dir(const std::string& dir) {
    std::lock_guard<std::mutex> lk(dirs_mu_);
    dirs_.erase(dir);
}

Result<UniqueFd> ConsumerStore::lock(const std::string& upath) {
    // Striped over a fixed set of files so the lock directory does not grow
    // with the number of files.
    std::string locks = dir_ + "/" + kReservedDir + "/locks";
    Status s = ensure_dir(locks);
    if (!s) return s;
    Xxh3 kh;
    kh.update(upath.data(), upath.size());
    char stripe[32];
    std::snprintf(stripe, sizeof stripe, "/%02x.lock",
                  static_cast<unsigned>(kh.digest() % kLockStripes));
    auto fd = lock_file(locks + stripe);
    if (!fd && fd.status().err() == ENOENT) {  // the directory went away meanwhile
        forget_dir(locks);
        s = ensure_dir(locks);
        if (!s) return s;
        fd = lock_file(locks + stripe);
    }
    if (fd) reclaim(fd.value().get());
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

void ConsumerStore::reclaim(int lock_fd) {
    char buf[4608];
    ssize_t n = ::pread(lock_fd, buf, sizeof buf, 0);
    if (n <= 0) return;  // nobody died writing (the usual case)
    std::string rec(buf, static_cast<size_t>(n));
    size_t sp = rec.find(' ');
    size_t nl = rec.find('\n');
    if (sp != std::string::npos && nl != std::string::npos && sp < nl) {
        std::string pid = rec.substr(0, sp);
        std::string rel = rec.substr(sp + 1, nl - sp - 1);
        std::string path = dir_ + "/" + rel;
        if (!temp_name(rel))
            DYAD_WARN(kSub, "lock file record '%s' does not name a temporary file: ignored",
                      rec.substr(0, nl).c_str());
        else if (fs_.unlink(path.c_str()) == 0)
            DYAD_INFO(kSub, "removed %s: consumer pid %s died while writing it", path.c_str(),
                      pid.c_str());
        else if (errno != ENOENT)
            DYAD_WARN(kSub, "cannot remove %s (left by consumer pid %s, which died): %s",
                      path.c_str(), pid.c_str(), std::strerror(errno));
    }
    if (::ftruncate(lock_fd, 0) != 0)
        DYAD_DEBUG(kSub, "cannot empty a lock file: %s", std::strerror(errno));
}

Result<std::unique_ptr<ConsumerStore::Staging>> ConsumerStore::stage(const std::string& upath,
                                                                     int lock_fd) {
    std::string t = target(upath);
    std::string dir = dirname_of(t);
    Status s = ensure_dir(dir);
    if (!s) return s.wrap("consumer directory for '" + upath + "'");
    const std::string pid = std::to_string(process_id());
    std::string tmpl = dir + "/." + t.substr(dir.size() + 1) + ".dyad-" + pid + "-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    std::unique_ptr<Staging> st(new Staging(*this, upath));
    st->fd_ = UniqueFd(fs_.mkostemp(buf.data(), O_CLOEXEC));
    if (!st->fd_.valid() && errno == ENOENT) {  // the directory went away meanwhile
        forget_dir(dir);
        s = ensure_dir(dir);
        if (!s) return s.wrap("consumer directory for '" + upath + "'");
        std::copy(tmpl.begin(), tmpl.end(), buf.begin());
        st->fd_ = UniqueFd(fs_.mkostemp(buf.data(), O_CLOEXEC));
    }
    if (!st->fd_.valid())
        return Status(DYAD_RC_BADFIO, "cannot create a temporary file in " + dir, errno);
    st->tmp_ = buf.data();
    st->sink_ = std::make_unique<FileSink>(fs_, st->fd_.get(), "'" + st->tmp_ + "'");
    if (lock_fd >= 0 && st->tmp_.size() > dir_.size() + 1) {
        // "PID PATH\n", PATH relative to the consumer directory.
        // What follows the line (a longer earlier one's end) is never read.
        std::string line = pid + " " + st->tmp_.substr(dir_.size() + 1) + "\n";
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
    std::string dir = dirname_of(t);
    s = ensure_dir(dir);
    if (!s) return s.wrap("consumer directory for '" + upath + "'");
    UniqueFd fd(::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600));
    if (!fd.valid() && errno == ENOENT) {  // the directory went away meanwhile
        forget_dir(dir);
        s = ensure_dir(dir);
        if (!s) return s.wrap("consumer directory for '" + upath + "'");
        fd = UniqueFd(::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600));
    }
    if (!fd.valid()) {
        if (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL) {
            DYAD_DEBUG(kSub, "%s cannot make unnamed files (%s): temporary files instead",
                       dir.c_str(), std::strerror(errno));
            tmpfile_ok_ = false;
            return false;
        }
        return Status(DYAD_RC_BADFIO, "cannot create a file in " + dir, errno);
    }
    s = fs_.write_all(fd.get(), p, n, "'" + t + "'");
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
    // Linked by its descriptor where the kernel lets this process
    // (flink_ok_), else by its /proc name, which costs a walk through
    // /proc (on 10,000 x 4 KiB in tmpfs, ~1.5 of the ~17 us an install
    // takes).
    if (flink_ok_.load(std::memory_order_relaxed)) {
        if (fs_.linkat(fd.get(), "", AT_FDCWD, t.c_str(), AT_EMPTY_PATH) == 0) return true;
        // Refused (ENOENT without the capability), or the target's own
        // error (EEXIST, a directory gone): the /proc name below says which.
    }
    char self[64];
    std::snprintf(self, sizeof self, "/proc/self/fd/%d", fd.get());
    if (fs_.linkat(AT_FDCWD, self, AT_FDCWD, t.c_str(), AT_SYMLINK_FOLLOW) == 0) {
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
    std::string tmp = dir + "/." + t.substr(dir.size() + 1) + ".dyad-" +
                      std::to_string(process_id()) + "-" + std::to_string(fd.get());
    ::unlink(tmp.c_str());  // a name of this process's, left by a crash of an earlier one
    if (::linkat(AT_FDCWD, self, AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) != 0)
        return Status(DYAD_RC_BADFIO, "cannot put '" + upath + "' in place at " + t, errno);
    if (fs_.rename(tmp.c_str(), t.c_str()) != 0) {
        int e = errno;
        ::unlink(tmp.c_str());
        return Status(DYAD_RC_BADFIO, "cannot move '" + upath + "' into place at " + t, e);
    }
    return true;
}

ConsumerStore::Staging::~Staging() {
    if (!committed_ && !tmp_.empty()) store_.fs_.unlink(tmp_.c_str());
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
    if (store_.fs_.rename(tmp_.c_str(), t.c_str()) != 0)
        return Status(DYAD_RC_BADFIO, "cannot move '" + upath_ + "' into place at " + t, errno);
    committed_ = true;
    forget();
    return Status::ok();
}

}  // namespace dyad::client
