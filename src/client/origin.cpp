// SPDX-License-Identifier: Apache-2.0
// Read-through from DYAD_PATH_ORIGIN (origin.hpp says the rules) and the
// client's two steps that use it: the lookup that falls back to the origin,
// and the fetch of an origin file.
#include "origin.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include "client.hpp"
#include "common/checksum.hpp"
#include "common/log.hpp"
#include "proto/fetch.hpp"

namespace dyad::client {
namespace {

constexpr const char* kSub = "client";
constexpr const char* kOriginAttr = "user.dyad.origin";
constexpr size_t kChunk = 1 << 20;
constexpr int kReadAttempts = 3;  // a file changing while read is read again

int64_t ns_of(const struct timespec& t) {
    return static_cast<int64_t>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

std::string where(const std::string& dir, const std::string& upath) {
    return "'" + upath + "' in the origin directory " + dir + " (DYAD_PATH_ORIGIN)";
}

bool same_file(const Record& rec, const struct stat& sb) {
    return static_cast<uint64_t>(sb.st_size) == rec.size && ns_of(sb.st_mtim) == rec.mtime_ns &&
           static_cast<uint64_t>(ns_of(sb.st_ctim)) == rec.generation &&
           static_cast<uint64_t>(sb.st_ino) == rec.ino;
}

}  // namespace

std::string Origin::identity(const Record& rec) {
    return std::to_string(rec.generation) + " " + std::to_string(rec.mtime_ns) + " " +
           std::to_string(rec.size);
}

Result<UniqueFd> Origin::open_root() const {
    // O_PATH: a directory on a network file system is not opened there
    // (GlusterFS answers an OPENDIR per open: milliseconds of a range read).
    UniqueFd fd(::open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid())
        return Status(DYAD_RC_BADFIO,
                      "cannot open the origin directory " + dir_ +
                          " (DYAD_PATH_ORIGIN): " + std::strerror(errno) +
                          "; mount it, correct DYAD_PATH_ORIGIN, or unset it to wait for "
                          "produces only",
                      errno);
    return fd;
}

Result<Record> Origin::stat(const std::string& upath) const {
    auto root = open_root();
    if (!root) return root.status();
    // O_PATH: a stat, not an open of the file (no read of it, no open
    // counted by the file system, no inotify IN_OPEN).
    auto f = open_beneath(root->get(), upath, O_PATH | O_CLOEXEC);
    if (!f) {
        const int e = f.status().err();
        if (e == ENOENT || e == ENOTDIR)
            return Status(DYAD_RC_NOTFOUND, "no " + where(dir_, upath), ENOENT);
        return Status(DYAD_RC_BADFIO,
                      "cannot read " + where(dir_, upath) + ": " + f.status().message(), e);
    }
    struct stat sb;
    if (::fstat(f->get(), &sb) != 0)
        return Status(DYAD_RC_BADFIO, "cannot stat " + where(dir_, upath), errno);
    if (S_ISDIR(sb.st_mode))
        return Status(DYAD_RC_NOTFOUND, "no file " + where(dir_, upath), EISDIR);
    if (!S_ISREG(sb.st_mode))
        return Status(DYAD_RC_BADFIO, where(dir_, upath) + " is not a regular file", EINVAL);
    Record r;
    r.upath = upath;
    r.owner = kOriginOwner;
    r.producer_dir = dir_;
    r.size = static_cast<uint64_t>(sb.st_size);
    r.mtime_ns = ns_of(sb.st_mtim);
    r.mode = sb.st_mode & 0777;
    r.ino = static_cast<uint64_t>(sb.st_ino);
    r.generation = static_cast<uint64_t>(ns_of(sb.st_ctim));
    return r;
}

Result<UniqueFd> Origin::open_file(const std::string& upath, const Record& rec) const {
    auto root = open_root();
    if (!root) return root.status();
    auto f = open_beneath(root->get(), upath, O_RDONLY | O_NOCTTY | O_CLOEXEC);
    if (!f)
        return Status(DYAD_RC_BADFIO,
                      "cannot read " + where(dir_, upath) + ": " + f.status().message(),
                      f.status().err());
    if (!unchanged(f->get(), rec))
        return Status(DYAD_RC_BADFETCH, where(dir_, upath) + " changed since it was looked at",
                      ESTALE);
    return f;
}

bool Origin::unchanged(int fd, const Record& rec) {
    struct stat sb;
    return ::fstat(fd, &sb) == 0 && same_file(rec, sb);
}

Result<nlohmann::json> Origin::copy(const std::string& upath, const Record& rec,
                                    FileSink& sink) const {
    auto f = open_file(upath, rec);
    if (!f) return f.status();
    const int fd = f->get();
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    std::vector<char> buf(kChunk);
    Xxh3 hash;
    uint64_t total = 0;
    for (;;) {
        ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Status(DYAD_RC_BADFIO, "cannot read " + where(dir_, upath), errno);
        if (n == 0) break;
        total += static_cast<uint64_t>(n);
        if (total > rec.size) break;  // grew while read: refused below
        hash.update(buf.data(), static_cast<size_t>(n));
        Status w = sink.write(buf.data(), static_cast<size_t>(n));
        if (!w) return w;
    }
    if (!unchanged(fd, rec) || total != rec.size)
        return Status(DYAD_RC_BADFETCH, where(dir_, upath) + " changed while it was read", ESTALE);
    return proto::FetchEnd::of(total, hash.digest()).build();
}

Status Origin::copy_to(const std::string& upath, const Record& rec, const ManagedDir& prod) const {
    UniqueFd proot(::open(prod.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!proot.valid())
        return Status(DYAD_RC_BADFIO,
                      "cannot open the producer directory " + prod.path() + " (DYAD_PATH_PRODUCER)",
                      errno);
    const std::string sub = dir_part(upath);
    const std::string base = base_part(upath);
    auto dir = dir_beneath(proot.get(), sub, true, 0775);
    if (!dir) return dir.status();
    std::random_device rd;
    const std::string tmp =
        "." + base + ".dyad-origin-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
    UniqueFd out(::openat(dir->get(), tmp.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    const std::string shown = prod.join(upath);
    if (!out.valid())
        return Status(DYAD_RC_BADFIO, "cannot create a temporary file beside " + shown, errno);
    FileSink sink(FileSystem::real(), out.get(), "'" + shown + "'");
    auto trailer = copy(upath, rec, sink);
    Status s = trailer.status();
    if (s) {
        ::fchmod(out.get(), rec.mode & 0777);
        struct timespec ts[2];
        ts[0].tv_sec = ts[1].tv_sec = rec.mtime_ns / 1000000000LL;
        ts[0].tv_nsec = ts[1].tv_nsec = rec.mtime_ns % 1000000000LL;
        ::futimens(out.get(), ts);
        const std::string id = identity(rec);
        if (::fsetxattr(out.get(), kOriginAttr, id.data(), id.size(), 0) != 0)
            DYAD_DEBUG(kSub, "cannot mark %s as an origin copy: %s", shown.c_str(),
                       std::strerror(errno));
        if (::renameat(dir->get(), tmp.c_str(), dir->get(), base.c_str()) != 0)
            s = Status(DYAD_RC_BADFIO, "cannot move the copy of the origin's file into " + shown,
                       errno);
    }
    if (!s) ::unlinkat(dir->get(), tmp.c_str(), 0);
    return s;
}

std::optional<std::string> Origin::published_from(const std::string& full) {
    char buf[128];
    ssize_t n = ::lgetxattr(full.c_str(), kOriginAttr, buf, sizeof buf);
    if (n <= 0) return std::nullopt;
    return std::string(buf, static_cast<size_t>(n));
}

// ---- Client ----

Result<Record> Client::lookup_with_origin(const std::string& upath, Deadline deadline) {
    // A record wins: looked for first, without waiting.
    auto r = lookup_upath(upath, false, Deadline::after(30.0));
    if (r) {
        // This node's own publish of an origin copy: read again (and
        // published again) once the origin's file changed.
        if (!cfg_.origin_publish || prod_.empty()) return r;
        auto svc = service();
        if (!svc || r->owner != svc->id) return r;
        auto from = Origin::published_from(prod_.join(upath));
        if (!from) return r;
        auto o = origin_.stat(upath);
        if (o && Origin::identity(o.value()) != *from) return o;
        return r;
    }
    if (r.status().rc() != DYAD_RC_NOTFOUND) return r.status();
    auto o = origin_.stat(upath);
    if (o || o.status().rc() != DYAD_RC_NOTFOUND) return o;
    // Neither produced nor in the origin: wait for a produce.
    return lookup_upath(upath, true, deadline);
}

Status Client::read_through(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                            ConsumeReport* rep, int lock_fd) {
    // Published: claimed first, so that of the nodes that want the file
    // one reads the origin and the others fetch from it (origin_claim.cpp).
    bool held = false;
    if (cfg_.origin_publish) {
        bool done = false;
        Status c = claim_or_wait(upath, rec, svc, rep, lock_fd, &done, &held);
        if (done || !c) {
            if (held) release_claim(upath, svc);
            return c;
        }
    }
    Status s = read_origin(upath, rec, svc, rep, lock_fd);
    if (held) release_claim(upath, svc);
    return s;
}

Status Client::read_origin(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                           ConsumeReport* rep, int lock_fd) {
    Record cur = rec;
    Status s;
    for (int attempt = 0; attempt < kReadAttempts; ++attempt) {
        if (attempt > 0) {  // changed while read: its new state
            auto o = origin_.stat(upath);
            if (!o) return o.status();
            cur = std::move(o.value());
        }
        if (cfg_.origin_publish) {
            s = origin_.copy_to(upath, cur, prod_);
            if (s) s = produce(prod_.join(upath));
            if (s) {
                auto fresh = lookup_upath(upath, false, Deadline::after(30.0));
                if (!fresh) return fresh.status();
                s = consume_published(upath, fresh.value(), svc, rep, lock_fd);
                if (s) rep->action = "origin";
                return s;
            }
            if (s.err() == ESTALE) continue;
            static std::atomic<bool> warned{false};
            if (!warned.exchange(true))
                DYAD_WARN(kSub,
                          "cannot publish the origin's copy of '%s' (DYAD_ORIGIN_PUBLISH): %s; "
                          "read through without publishing (said once)",
                          upath.c_str(), s.to_string().c_str());
        }
        rep->transport = "origin";
        rep->endpoint = origin_.dir() + "/" + upath;
        s = stage_commit(upath, cur, lock_fd, rep,
                         [&](FileSink& sink) { return origin_.copy(upath, cur, sink); });
        if (s) {
            rep->action = "origin";
            return s;
        }
        if (s.err() != ESTALE) return s;
    }
    return Status(s.rc(),
                  s.message() + " (" + std::to_string(kReadAttempts) +
                      " times): it keeps changing; consume it once it is written",
                  s.err());
}

Result<CacheStats> Client::cache_stats() {
    return cache_.stats();
}

}  // namespace dyad::client
