// SPDX-License-Identifier: Apache-2.0
// Byte ranges of origin files kept per block (origin_blocks.hpp says how).
#include "origin_blocks.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "common/checksum.hpp"
#include "common/fd.hpp"
#include "common/log.hpp"
#include "common/paths.hpp"

namespace dyad::client {
namespace {

constexpr const char* kSub = "client";
constexpr const char* kBlocksDir = ".dyad/origin-blocks";
constexpr char kMagic[8] = {'D', 'Y', 'A', 'D', 'B', 'L', 'K', '3'};
// Each block's bytes are checked per chunk: a range of a block held reads
// and hashes the chunks it covers, not the whole block. A page: a range
// hashes at most 8 KiB more than it asks for (64 KiB chunks made a 64 KiB
// range hash 128 KiB, a quarter of its time); the sidecar holds 2 KiB of
// entries per MiB.
constexpr uint64_t kChunk = 4 << 10;
constexpr uint64_t kChunksPerBlock = kOriginBlock / kChunk;
// The sidecar's header: fixed fields, then the origin path; the block
// entries start at kHeader.
constexpr uint64_t kHeader = 4096;
struct Fixed {
    char magic[8];
    uint64_t block, size, generation, ino, path_len;
    int64_t mtime_ns;
};
constexpr size_t kMaxPath = kHeader - sizeof(Fixed);

std::string changed_text(const std::string& upath) {
    return "the origin's '" + upath + "' changed while its blocks were read: nothing returned";
}

// pread of exactly n bytes (fewer only at the end of the file).
ssize_t read_full(int fd, char* p, size_t n, uint64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = ::pread(fd, p + got, n - got, static_cast<off_t>(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += static_cast<size_t>(r);
    }
    return static_cast<ssize_t>(got);
}

bool write_full(int fd, const char* p, size_t n, uint64_t off) {
    size_t put = 0;
    while (put < n) {
        ssize_t r = ::pwrite(fd, p + put, n - put, static_cast<off_t>(off + put));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        put += static_cast<size_t>(r);
    }
    return true;
}

uint64_t hash_of(const char* p, size_t n) {
    const uint64_t h = Xxh3::of(p, n);
    return h == 0 ? 1 : h;  // 0 marks a block not held
}

// The sidecar and the data file of one origin file.
struct Files {
    UniqueFd held, data;
};

std::string hashed_name(const std::string& upath) {
    return Xxh3::to_hex(Xxh3::of(upath.data(), upath.size()));
}

Result<Files> open_files(const std::string& dir, const std::string& upath, bool create) {
    UniqueFd root(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root.valid()) return Status::sys("open the consumer directory " + dir);
    const std::string name = hashed_name(upath);
    auto sub =
        dir_beneath(root.get(), std::string(kBlocksDir) + "/" + name.substr(0, 2), create, 0700);
    if (!sub) return sub.status();
    const int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0);
    Files f;
    f.held.reset(::openat(sub->get(), (name + ".held").c_str(), flags, 0600));
    if (!f.held.valid()) return Status::sys("open the block sidecar of '" + upath + "'");
    f.data.reset(::openat(sub->get(), (name + ".data").c_str(), flags, 0600));
    if (!f.data.valid()) return Status::sys("open the blocks of '" + upath + "'");
    return f;
}

uint64_t chunk_count(uint64_t size) {
    return (size + kChunk - 1) / kChunk;
}

// Whether the sidecar describes the origin file `rec` at `upath`.
bool header_matches(int held, const std::string& upath, const Record& rec) {
    char buf[kHeader];
    const size_t used = sizeof(Fixed) + upath.size();  // <= kHeader: upath.size() <= kMaxPath
    if (read_full(held, buf, used, 0) != static_cast<ssize_t>(used)) return false;
    Fixed h;
    std::memcpy(&h, buf, sizeof h);
    return std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.block == kOriginBlock &&
           h.size == rec.size && h.generation == rec.generation && h.ino == rec.ino &&
           h.mtime_ns == rec.mtime_ns && h.path_len == upath.size() &&
           std::memcmp(buf + sizeof h, upath.data(), upath.size()) == 0;
}

// Starts over for the origin file `rec`: no block held.
Status reset(const Files& f, const std::string& upath, const Record& rec) {
    char buf[kHeader] = {};
    Fixed h;
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.block = kOriginBlock;
    h.size = rec.size;
    h.generation = rec.generation;
    h.ino = rec.ino;
    h.path_len = upath.size();
    h.mtime_ns = rec.mtime_ns;
    std::memcpy(buf, &h, sizeof h);
    std::memcpy(buf + sizeof h, upath.data(), upath.size());
    if (::ftruncate(f.data.get(), 0) != 0 || ::ftruncate(f.held.get(), 0) != 0 ||
        !write_full(f.held.get(), buf, kHeader, 0) ||
        ::ftruncate(f.held.get(), static_cast<off_t>(kHeader + 8 * chunk_count(rec.size))) != 0)
        return Status::sys("reset the block sidecar of '" + upath + "'");
    return Status::ok();
}

// The checksums of chunks [c, c + n) into `out` (0: not held); false if
// the sidecar is shorter.
bool entries(int held, uint64_t c, uint64_t n, uint64_t* out) {
    const size_t len = static_cast<size_t>(8 * n);
    return read_full(held, reinterpret_cast<char*>(out), len, kHeader + 8 * c) ==
           static_cast<ssize_t>(len);
}

size_t piece_len(const Record& rec, uint64_t start, uint64_t unit) {
    return static_cast<size_t>(std::min<uint64_t>(unit, rec.size - start));
}

// The part of [start, start + len) (its bytes at p) inside [offset,
// offset + length), into dst.
void copy_part(const char* p, uint64_t start, size_t len, uint64_t offset, uint64_t length,
               char* dst) {
    const uint64_t lo = std::max(offset, start);
    const uint64_t hi = std::min(offset + length, start + len);
    if (hi > lo) std::memcpy(dst + (lo - offset), p + (lo - start), static_cast<size_t>(hi - lo));
}

// The held chunks of [from, to) (chunk indices) into buf, each checked:
// false when one is missing or not what its entry says.
bool held_chunks(const Files& f, const Record& rec, uint64_t from, uint64_t to, char* buf) {
    const uint64_t start = from * kChunk;
    const size_t len = piece_len(rec, start, (to - from) * kChunk);
    if (read_full(f.data.get(), buf, len, start) != static_cast<ssize_t>(len)) return false;
    uint64_t want[kChunksPerBlock];  // to - from <= kChunksPerBlock
    if (!entries(f.held.get(), from, to - from, want)) return false;
    for (uint64_t c = from; c < to; ++c) {
        const size_t off = static_cast<size_t>((c - from) * kChunk);
        if (want[c - from] == 0 ||
            hash_of(buf + off, piece_len(rec, c * kChunk, kChunk)) != want[c - from])
            return false;
    }
    return true;
}

}  // namespace

struct OriginBlocks::Open {
    Files f;
    pid_t pid = 0;
    std::mutex mu;  // one range at a time: one flock per open sidecar
    const char* map = nullptr;
    size_t map_len = 0;
    ~Open() {
        if (map) ::munmap(const_cast<char*>(map), map_len);
    }
};

namespace {

// The data file mapped, as long as the origin file `rec`.
bool map_of(OriginBlocks::Open& o, const Record& rec) {
    if (o.map_len == rec.size) return true;
    if (o.map) ::munmap(const_cast<char*>(o.map), o.map_len);
    o.map = nullptr;
    o.map_len = 0;
    void* m = ::mmap(nullptr, rec.size, PROT_READ, MAP_SHARED, o.f.data.get(), 0);
    if (m == MAP_FAILED) return false;
    o.map = static_cast<const char*>(m);
    o.map_len = rec.size;
    return true;
}

// Every chunk of the range held (checked in the mapping of the data file,
// under the shared lock), then its bytes into dst: false if one is missing
// or bad.
bool mapped_held(OriginBlocks::Open& o, const Record& rec, uint64_t offset, uint64_t length,
                 char* dst) {
    const uint64_t c0 = offset / kChunk, c1 = (offset + length - 1) / kChunk + 1;
    const uint64_t end = std::min(rec.size, c1 * kChunk);
    struct stat sb;  // never a page past the end of the file: SIGBUS
    if (::fstat(o.f.data.get(), &sb) != 0 || static_cast<uint64_t>(sb.st_size) < end) return false;
    if (!map_of(o, rec)) return false;
    constexpr uint64_t kBatch = 256;  // entries read at once
    uint64_t sums[kBatch];
    for (uint64_t c = c0; c < c1; c += kBatch) {
        const uint64_t n = std::min(kBatch, c1 - c);
        if (!entries(o.f.held.get(), c, n, sums)) return false;
        for (uint64_t i = 0; i < n; ++i) {
            const uint64_t start = (c + i) * kChunk;
            if (sums[i] == 0 || hash_of(o.map + start, piece_len(rec, start, kChunk)) != sums[i])
                return false;
        }
    }
    std::memcpy(dst, o.map + offset, static_cast<size_t>(length));
    return true;
}

// The range straight from the origin, keeping nothing.
Status direct(const Origin& origin, const std::string& upath, const Record& rec, uint64_t offset,
              uint64_t length, char* dst) {
    auto o = origin.open_file(upath, rec);
    if (!o) return o.status();
    if (read_full(o->get(), dst, static_cast<size_t>(length), offset) !=
        static_cast<ssize_t>(length))
        return Status(DYAD_RC_BADFIO, "cannot read '" + upath + "' in the origin directory",
                      errno ? errno : EIO);
    if (!Origin::unchanged(o->get(), rec))
        return Status(DYAD_RC_BADFETCH, changed_text(upath), ESTALE);
    return Status::ok();
}

}  // namespace

OriginBlocks::~OriginBlocks() = default;

std::shared_ptr<OriginBlocks::Open> OriginBlocks::opened(const std::string& upath) const {
    std::lock_guard<std::mutex> lk(mu_);
    const pid_t pid = ::getpid();
    // A forked child shares the parent's descriptors, and with them its
    // locks: its own are opened.
    if (!open_.empty() && open_.begin()->second->pid != pid) open_.clear();
    if (auto it = open_.find(upath); it != open_.end()) return it->second;
    auto f = open_files(dir_, upath, false);
    if (!f) return nullptr;
    if (open_.size() >= kKeptOpen) open_.erase(open_.begin());
    auto o = std::make_shared<Open>();
    o->f = std::move(f.value());
    o->pid = pid;
    open_.emplace(upath, o);
    return o;
}

void OriginBlocks::prefault(const std::string& upath, const Record& rec, uint64_t offset,
                            uint64_t length) const {
    auto o = opened(upath);
    if (!o) return;
    std::lock_guard<std::mutex> lk(o->mu);
    if (!map_of(*o, rec)) return;
    const uint64_t from = offset / kOriginBlock * kOriginBlock;
    const uint64_t to =
        std::min(rec.size, ((offset + length - 1) / kOriginBlock + 1) * kOriginBlock);
    // The page tables of these blocks filled now (a fault per 16 pages at
    // a later range's first touch took half its time). Pages past the end
    // of the file (truncated meanwhile) fail here without a signal.
#ifdef MADV_POPULATE_READ  // Linux 5.14; an older kernel says EINVAL: faults as before
    ::madvise(const_cast<char*>(o->map) + from, static_cast<size_t>(to - from), MADV_POPULATE_READ);
#else
    (void)from;
    (void)to;
#endif
}

void OriginBlocks::close(const std::string& upath) const {
    std::lock_guard<std::mutex> lk(mu_);
    open_.erase(upath);
}

bool OriginBlocks::held(const std::string& upath, const Record& rec, uint64_t offset,
                        uint64_t length, char* dst) const {
    if (dir_.empty() || length == 0 || upath.size() > kMaxPath) return false;
    auto o = opened(upath);
    if (!o) return false;
    bool ok = false;
    {
        std::lock_guard<std::mutex> lk(o->mu);
        const int held = o->f.held.get();
        if (::flock(held, LOCK_SH) == 0) {
            ok = header_matches(held, upath, rec) && mapped_held(*o, rec, offset, length, dst);
            ::flock(held, LOCK_UN);
        }
    }
    // Removed (`.dyad/origin-blocks` emptied): opened again at the next range.
    struct stat sb;
    if (!ok && (::fstat(o->f.held.get(), &sb) != 0 || sb.st_nlink == 0)) close(upath);
    return ok;
}

Status OriginBlocks::read(const Origin& origin, const std::string& upath, const Record& rec,
                          uint64_t offset, uint64_t length, char* dst,
                          uint64_t* from_origin) const {
    *from_origin = 0;
    if (length == 0) return Status::ok();
    if (dir_.empty() || upath.size() > kMaxPath) {
        *from_origin = 1;
        return direct(origin, upath, rec, offset, length, dst);
    }
    // One block's room per thread, kept: neither allocated nor zeroed per
    // range (a fresh 1 MiB was most of a range's cost).
    thread_local std::unique_ptr<char[]> room;
    if (!room) room.reset(new char[kOriginBlock]);
    char* const buf = room.get();
    // The blocks held, under a shared lock: nothing of the origin touched.
    if (held(upath, rec, offset, length, dst)) return Status::ok();
    auto f = open_files(dir_, upath, true);
    if (!f || ::flock(f->held.get(), LOCK_EX) != 0) {
        DYAD_DEBUG(kSub, "origin blocks of '%s' not kept: %s", upath.c_str(),
                   f ? std::strerror(errno) : f.status().message().c_str());
        *from_origin = 1;
        return direct(origin, upath, rec, offset, length, dst);
    }
    if (!header_matches(f->held.get(), upath, rec)) {
        Status r = reset(f.value(), upath, rec);
        if (!r) {
            ::ftruncate(f->held.get(), 0);
            *from_origin = 1;
            return direct(origin, upath, rec, offset, length, dst);
        }
    }
    UniqueFd src;  // the origin file, opened at the first block missing
    for (uint64_t b = offset / kOriginBlock; b <= (offset + length - 1) / kOriginBlock; ++b) {
        const uint64_t start = b * kOriginBlock;
        const size_t len = piece_len(rec, start, kOriginBlock);
        const uint64_t c0 = start / kChunk, c1 = (start + len + kChunk - 1) / kChunk;
        if (held_chunks(f.value(), rec, c0, c1, buf)) {
            copy_part(buf, start, len, offset, length, dst);
            continue;
        }
        if (!src.valid()) {
            auto o = origin.open_file(upath, rec);
            if (!o) return o.status();
            src = std::move(o.value());
        }
        if (read_full(src.get(), buf, len, start) != static_cast<ssize_t>(len)) {
            ::ftruncate(f->held.get(), 0);
            return Status(DYAD_RC_BADFETCH, changed_text(upath), ESTALE);
        }
        ++*from_origin;
        // Kept: the bytes first, then the entries that vouch for them.
        uint64_t sums[kChunksPerBlock];
        for (uint64_t c = c0; c < c1; ++c)
            sums[c - c0] = hash_of(buf + (c - c0) * kChunk, piece_len(rec, c * kChunk, kChunk));
        if (write_full(f->data.get(), buf, len, start))
            write_full(f->held.get(), reinterpret_cast<const char*>(sums),
                       static_cast<size_t>(8 * (c1 - c0)), kHeader + 8 * c0);
        copy_part(buf, start, len, offset, length, dst);
    }
    if (src.valid() && !Origin::unchanged(src.get(), rec)) {
        ::ftruncate(f->held.get(), 0);  // what was read may mix two versions: all goes
        return Status(DYAD_RC_BADFETCH, changed_text(upath), ESTALE);
    }
    // Unlocked first: a thread of this process may wait for it in held(),
    // holding the open files prefault() takes.
    ::flock(f->held.get(), LOCK_UN);
    prefault(upath, rec, offset, length);
    return Status::ok();
}

}  // namespace dyad::client
