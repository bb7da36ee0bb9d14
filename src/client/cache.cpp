// SPDX-License-Identifier: Apache-2.0
#include "cache.hpp"
#include "consumer_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <sstream>
#include <vector>

#include "common/log.hpp"
#include "common/paths.hpp"

namespace dyad::client {
namespace {

constexpr const char* kSub = "cache";
constexpr const char* kStampAttr = "user.dyad";  // ConsumerStore's install stamp
// The journal is folded into the index when it grows past this, even when
// nothing is to be evicted (a long run of hits).
constexpr off_t kJournalFold = 1 << 20;

int64_t now_ns() {
    struct timespec ts;
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// The whole of a small file of the cache directory ("" if missing).
std::string read_small(int dirfd, const char* name) {
    UniqueFd fd(::openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.valid()) return "";
    std::string out;
    char buf[65536];
    for (;;) {
        ssize_t n = ::read(fd.get(), buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        out.append(buf, static_cast<size_t>(n));
    }
    return out;
}

Status write_all_fd(int fd, const std::string& text, const std::string& shown) {
    size_t off = 0;
    while (off < text.size()) {
        ssize_t n = ::write(fd, text.data() + off, text.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Status(DYAD_RC_BADFIO, "cannot write '" + shown + "'", errno);
        off += static_cast<size_t>(n);
    }
    return Status::ok();
}

// Replaces `name` whole: a temporary file, renamed over it.
Status replace_file(int dirfd, const char* name, const std::string& text,
                    const std::string& shown) {
    std::string tmp = std::string(name) + ".tmp-" + std::to_string(::getpid());
    UniqueFd fd(
        ::openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid()) return Status(DYAD_RC_BADFIO, "cannot create '" + shown + ".tmp'", errno);
    Status s = write_all_fd(fd.get(), text, shown);
    if (s && ::renameat(dirfd, tmp.c_str(), dirfd, name) != 0)
        s = Status(DYAD_RC_BADFIO, "cannot rename into '" + shown + "'", errno);
    if (!s) ::unlinkat(dirfd, tmp.c_str(), 0);
    return s;
}

struct State {
    uint64_t bytes = 0, files = 0, hits = 0, misses = 0, evictions = 0, evicted_bytes = 0;
    static State parse(const std::string& text) {
        State s;
        unsigned long long v[6] = {0, 0, 0, 0, 0, 0};
        if (std::sscanf(text.c_str(), "dyad-cache 1 %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
                        &v[2], &v[3], &v[4], &v[5]) == 6) {
            s.bytes = v[0];
            s.files = v[1];
            s.hits = v[2];
            s.misses = v[3];
            s.evictions = v[4];
            s.evicted_bytes = v[5];
        }
        return s;
    }
    std::string text() const {
        char b[256];
        std::snprintf(b, sizeof b, "dyad-cache 1 %llu %llu %llu %llu %llu %llu\n",
                      static_cast<unsigned long long>(bytes),
                      static_cast<unsigned long long>(files), static_cast<unsigned long long>(hits),
                      static_cast<unsigned long long>(misses),
                      static_cast<unsigned long long>(evictions),
                      static_cast<unsigned long long>(evicted_bytes));
        return b;
    }
};

struct Entry {
    uint64_t size = 0;
    int64_t inserted = 0;
    int64_t accessed = 0;
};

// "A B C REST": three numbers and the rest of the line (a path may hold
// spaces, never a newline).
bool split3(const std::string& line, long long* a, long long* b, long long* c, std::string* rest) {
    int used = 0;
    if (std::sscanf(line.c_str(), "%lld %lld %lld %n", a, b, c, &used) != 3 || used <= 0 ||
        static_cast<size_t>(used) >= line.size())
        return false;
    *rest = line.substr(static_cast<size_t>(used));
    return true;
}

// The index (size inserted accessed path) with the journal applied.
std::map<std::string, Entry> fold(const std::string& index, const std::string& journal) {
    std::map<std::string, Entry> m;
    std::istringstream in(index);
    std::string line;
    while (std::getline(in, line)) {
        long long size, ins, acc;
        std::string up;
        if (!split3(line, &size, &ins, &acc, &up) || size < 0) continue;
        m[up] = Entry{static_cast<uint64_t>(size), ins, acc};
    }
    std::istringstream j(journal);
    while (std::getline(j, line)) {
        if (line.size() < 3 || line[1] != ' ') continue;
        const char kind = line[0];
        const std::string body = line.substr(2);
        if (kind == 'I') {  // I NS SIZE PATH
            long long ns, size, unused = 0;
            std::string up;
            if (!split3("0 " + body, &unused, &ns, &size, &up) || size < 0) continue;
            m[up] = Entry{static_cast<uint64_t>(size), ns, ns};
        } else if (kind == 'A') {  // A NS PATH
            long long ns, u1 = 0, u2 = 0;
            std::string up;
            if (!split3("0 0 " + body, &u1, &u2, &ns, &up)) continue;
            auto it = m.find(up);
            if (it != m.end())
                it->second.accessed = std::max<int64_t>(it->second.accessed, ns);
            else  // a present copy installed before the cache knew of it
                m[up] = Entry{0, ns, ns};
        } else if (kind == 'F') {  // F PATH
            m.erase(body);
        }
    }
    return m;
}

enum class Outcome { evicted, kept, dropped };

std::atomic<bool> g_over_warned{false};

}  // namespace

nlohmann::json CacheStats::to_json() const {
    return {{"bytes", bytes},   {"files", files},         {"hits", hits},
            {"misses", misses}, {"evictions", evictions}, {"evicted_bytes", evicted_bytes}};
}

Cache::Cache(const Config& cfg, std::string consumer_dir, std::string producer_dir,
             TryLock try_lock)
    : capacity_(cfg.cache_capacity),
      policy_(cfg.cache_policy == "FIFO"   ? Policy::fifo
              : cfg.cache_policy == "NONE" ? Policy::none
                                           : Policy::lru),
      low_(cfg.cache_low_watermark),
      grace_s_(cfg.cache_grace_period),
      dir_(std::move(consumer_dir)),
      producer_dir_(std::move(producer_dir)),
      try_lock_(std::move(try_lock)) {}

Result<UniqueFd> Cache::cache_dir() {
    UniqueFd root(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root.valid())
        return Status(DYAD_RC_BADFIO, "cannot open consumer directory '" + dir_ + "'", errno);
    const std::string dot = dir_ + "/" + kReservedDir;
    auto d = own_dir(root.get(), kReservedDir, dot);
    if (!d) return d.status();
    return own_dir(d->get(), "cache", dot + "/cache");
}

void Cache::hit(const std::string& upath) {
    if (enabled()) note(Note::hit, upath, 0);
}
void Cache::installed(const std::string& upath, uint64_t size) {
    if (enabled()) note(Note::installed, upath, size);
}
void Cache::forget(const std::string& upath) {
    if (enabled()) note(Note::forget, upath, 0);
}

void Cache::note(Note what, const std::string& upath, uint64_t size) {
    if (upath.find('\n') != std::string::npos) return;  // never recorded, never evicted
    Status s = note_locked(what, upath, size);
    static std::atomic<bool> warned{false};
    if (!s && !warned.exchange(true)) {
        DYAD_WARN(kSub,
                  "the cache record of %s could not be updated (%s): the consume is not "
                  "affected (said once)",
                  dir_.c_str(), s.to_string().c_str());
    }
}

// Everything done under the cache's lock: the record read, changed, folded
// and pruned when over capacity, written back.
struct CacheFold {
    Cache& c;
    int dirfd;
    State st;
    std::string shown;

    // Folds the journal into the index, checks every copy against the
    // directory and, with `evict`, removes copies until the bytes are at
    // the low watermark.
    Status run(bool evict) {
        auto m = fold(read_small(dirfd, "index"), read_small(dirfd, "journal"));
        UniqueFd root(::open(c.dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!root.valid())
            return Status(DYAD_RC_BADFIO, "cannot open consumer directory '" + c.dir_ + "'", errno);
        const bool other_producer = !c.producer_dir_.empty() && c.producer_dir_ != c.dir_;
        uint64_t bytes = 0;
        for (auto it = m.begin(); it != m.end();) {
            struct stat sb;
            const std::string full = c.dir_ + "/" + it->first;
            if (::fstatat(root.get(), it->first.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
                !S_ISREG(sb.st_mode) ||
                (other_producer && full.rfind(c.producer_dir_ + "/", 0) == 0)) {
                it = m.erase(it);
                continue;
            }
            it->second.size = static_cast<uint64_t>(sb.st_size);
            bytes += it->second.size;
            ++it;
        }
        if (evict && bytes > c.capacity_ && c.policy_ != Cache::Policy::none) {
            const uint64_t target =
                static_cast<uint64_t>(static_cast<double>(c.capacity_) * c.low_);
            std::vector<std::pair<int64_t, std::string>> order;
            order.reserve(m.size());
            for (const auto& [up, e] : m)
                order.emplace_back(c.policy_ == Cache::Policy::fifo ? e.inserted : e.accessed, up);
            std::sort(order.begin(), order.end());
            const int64_t now = now_ns();
            const int64_t grace = static_cast<int64_t>(c.grace_s_ * 1e9);
            for (const auto& [key, up] : order) {
                if (bytes <= target) break;
                auto it = m.find(up);
                const Entry e = it->second;
                if (now - std::max(e.accessed, e.inserted) < grace) continue;
                switch (remove(root.get(), up, e)) {
                    case Outcome::evicted:
                        bytes -= e.size;
                        ++st.evictions;
                        st.evicted_bytes += e.size;
                        m.erase(it);
                        DYAD_DEBUG(kSub, "evicted %s (%llu bytes)", up.c_str(),
                                   static_cast<unsigned long long>(e.size));
                        break;
                    case Outcome::dropped:
                        bytes -= e.size;
                        m.erase(it);
                        break;
                    case Outcome::kept:
                        break;
                }
            }
            if (bytes > c.capacity_ && !g_over_warned.exchange(true))
                DYAD_WARN(kSub,
                          "the consumer directory %s holds %llu bytes of copies, over "
                          "DYAD_CACHE_CAPACITY (%llu): the others were consumed within "
                          "DYAD_CACHE_GRACE_PERIOD, are in use or being moved; they are kept "
                          "(said once)",
                          c.dir_.c_str(), static_cast<unsigned long long>(bytes),
                          static_cast<unsigned long long>(c.capacity_));
        }
        std::string index;
        for (const auto& [up, e] : m)
            index += std::to_string(e.size) + " " + std::to_string(e.inserted) + " " +
                     std::to_string(e.accessed) + " " + up + "\n";
        Status s = replace_file(dirfd, "index", index, shown + "/index");
        if (!s) return s;
        UniqueFd j(::openat(dirfd, "journal", O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC));
        st.bytes = bytes;
        st.files = m.size();
        return Status::ok();
    }

    // Removes one copy if nothing holds it (see cache.hpp).
    Outcome remove(int root, const std::string& up, const Entry& e) {
        (void)e;
        auto lk = c.try_lock_(up);
        if (!lk) return Outcome::kept;  // being consumed
        auto f =
            open_beneath(root, up, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0, Links::none);
        if (!f) return f.status().err() == ENOENT ? Outcome::dropped : Outcome::kept;
        const int fd = f->get();
        struct stat sb;
        if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) return Outcome::dropped;
        // Still the copy DYAD installed: its stamp ("OWNER GEN MTIME SIZE")
        // names its mtime and size.
        char buf[512];
        ssize_t n = ::fgetxattr(fd, kStampAttr, buf, sizeof buf - 1);
        if (n >= 0) {
            buf[n] = '\0';
            std::string t(buf);
            size_t last = t.rfind(' ');
            size_t prev =
                last == std::string::npos || last == 0 ? std::string::npos : t.rfind(' ', last - 1);
            const int64_t mtime =
                static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000LL + sb.st_mtim.tv_nsec;
            if (prev == std::string::npos ||
                t.substr(last + 1) != std::to_string(static_cast<uint64_t>(sb.st_size)) ||
                t.substr(prev + 1, last - prev - 1) != std::to_string(mtime))
                return Outcome::dropped;  // rewritten since: the user's file now
        } else if (errno != ENOTSUP && errno != EOPNOTSUPP) {
            return Outcome::dropped;  // no stamp: not a copy DYAD installed
        }
        // Open elsewhere (a reader, the wrapper's descriptor, a mapping): a
        // write lease is refused. A break of it (an open in the instant it
        // is held) signals SIGURG, ignored by default, not SIGIO.
        bool leased = false;
        if (::fcntl(fd, F_SETSIG, SIGURG) == 0 && ::fcntl(fd, F_SETLEASE, F_WRLCK) == 0) {
            leased = true;
        } else if (errno == EAGAIN || errno == EBUSY || errno == EACCES) {
            return Outcome::kept;
        } else {
            DYAD_DEBUG(kSub, "%s: no lease here (%s): removed without the open-file check",
                       up.c_str(), std::strerror(errno));
        }
        Outcome out = Outcome::kept;
        auto parent = dir_beneath(root, dir_part(up), false, 0);
        struct stat now;
        const std::string base = base_part(up);
        if (parent && ::fstatat(parent->get(), base.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 &&
            now.st_dev == sb.st_dev && now.st_ino == sb.st_ino) {
            if (::unlinkat(parent->get(), base.c_str(), 0) == 0)
                out = Outcome::evicted;
            else
                DYAD_DEBUG(kSub, "cannot remove %s/%s: %s", c.dir_.c_str(), up.c_str(),
                           std::strerror(errno));
        }
        if (leased) ::fcntl(fd, F_SETLEASE, F_UNLCK);
        return out;
    }
};

namespace {

// The record's lock (`shown`/lock), held exclusively: one process at a time
// reads and rewrites the record.
Result<UniqueFd> lock_record(int dirfd, const std::string& shown) {
    UniqueFd lock(::openat(dirfd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!lock.valid()) return Status(DYAD_RC_BADFIO, "cannot open '" + shown + "/lock'", errno);
    while (::flock(lock.get(), LOCK_EX) != 0)
        if (errno != EINTR)
            return Status(DYAD_RC_BADFIO, "cannot lock '" + shown + "/lock'", errno);
    return lock;
}

}  // namespace

Status Cache::with_record(const std::function<Status(CacheFold&)>& work) {
    auto d = cache_dir();
    if (!d) return d.status();
    const int dirfd = d->get();
    const std::string shown = dir_ + "/" + kReservedDir + "/cache";
    auto lock = lock_record(dirfd, shown);
    if (!lock) return lock.status();
    CacheFold f{*this, dirfd, State::parse(read_small(dirfd, "state")), shown};
    return work(f);
}

Status Cache::note_locked(Note what, const std::string& upath, uint64_t size) {
    return with_record([&](CacheFold& f) { return note_in(f, what, upath, size); });
}

Status Cache::note_in(CacheFold& f, Note what, const std::string& upath, uint64_t size) {
    const int dirfd = f.dirfd;
    const std::string& shown = f.shown;
    const int64_t now = now_ns();
    std::string line;
    switch (what) {
        case Note::hit:
            ++f.st.hits;
            line = "A " + std::to_string(now) + " " + upath + "\n";
            break;
        case Note::installed:
            ++f.st.misses;
            f.st.bytes += size;
            ++f.st.files;
            line = "I " + std::to_string(now) + " " + std::to_string(size) + " " + upath + "\n";
            break;
        case Note::forget:
            line = "F " + upath + "\n";
            break;
    }
    UniqueFd j(
        ::openat(dirfd, "journal", O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!j.valid()) return Status(DYAD_RC_BADFIO, "cannot open '" + shown + "/journal'", errno);
    Status s = write_all_fd(j.get(), line, shown + "/journal");
    if (!s) return s;
    struct stat js;
    const bool long_journal = ::fstat(j.get(), &js) == 0 && js.st_size > kJournalFold;
    // The state's bytes are an upper bound (a copy installed again over an
    // older one counts twice until the next fold): folding when it passes
    // the capacity finds the true figure, then evicts if it is over.
    if ((f.st.bytes > capacity_ && policy_ != Policy::none) || long_journal) {
        s = f.run(true);
        if (!s) return s;
    }
    return replace_file(dirfd, "state", f.st.text(), shown + "/state");
}

Result<CacheStats> Cache::stats() {
    CacheStats out;
    if (dir_.empty()) return out;
    Status s = with_record([&out](CacheFold& f) {
        Status r = f.run(false);
        if (!r) return r;
        r = replace_file(f.dirfd, "state", f.st.text(), f.shown + "/state");
        if (!r) return r;
        out.bytes = f.st.bytes;
        out.files = f.st.files;
        out.hits = f.st.hits;
        out.misses = f.st.misses;
        out.evictions = f.st.evictions;
        out.evicted_bytes = f.st.evicted_bytes;
        return Status::ok();
    });
    if (!s) return s;
    return out;
}

}  // namespace dyad::client
