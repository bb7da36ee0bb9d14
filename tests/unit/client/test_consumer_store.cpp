// SPDX-License-Identifier: Apache-2.0
// The consumer store on a real directory, with faults injected through the
// file-system seam: whole files appear atomically, nothing partial or
// corrupt is ever visible, and failures leave no temporary file behind.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "client/consumer_store.hpp"
#include "dtl/fetch_many.hpp"
#include "common/checksum.hpp"

using namespace dyad;
using client::ConsumerStore;
using client::Record;

namespace {

// Real calls, with faults on demand.
class FaultyFs : public FileSystem {
  public:
    size_t fail_write_after = SIZE_MAX;  // bytes accepted before ENOSPC
    size_t short_writes = 0;             // cap each write at this many bytes (0: no cap)
    int fail_fsync = 0;                  // errno for fsync
    int fail_rename = 0;                 // errno for rename
    int fail_mkostemp = 0;
    size_t written = 0;
    size_t largest_write = 0;  // the largest n write() was called with

    int mkostempat(int dirfd, char* tmpl, int flags) override {
        if (fail_mkostemp) {
            errno = fail_mkostemp;
            return -1;
        }
        return FileSystem::mkostempat(dirfd, tmpl, flags);
    }
    ssize_t write(int fd, const void* p, size_t n) override {
        if (written >= fail_write_after) {
            errno = ENOSPC;
            return -1;
        }
        largest_write = std::max(largest_write, n);
        n = std::min(n, fail_write_after - written);
        if (short_writes) n = std::min(n, short_writes);
        ssize_t w = FileSystem::write(fd, p, n);
        if (w > 0) written += static_cast<size_t>(w);
        return w;
    }
    int fsync(int fd) override {
        if (fail_fsync) {
            errno = fail_fsync;
            return -1;
        }
        return FileSystem::fsync(fd);
    }
    int renameat(int from_dir, const char* from, int to_dir, const char* to) override {
        if (fail_rename) {
            errno = fail_rename;
            return -1;
        }
        return FileSystem::renameat(from_dir, from, to_dir, to);
    }
    bool refuse_flink = false;  // linkat(AT_EMPTY_PATH) refused, as without the capability
    int flinks = 0, proc_links = 0;
    int linkat(int from_dir, const char* from, int to_dir, const char* to, int flags) override {
        if (flags & AT_EMPTY_PATH) {
            ++flinks;
            if (refuse_flink) {
                errno = ENOENT;
                return -1;
            }
        } else {
            ++proc_links;
        }
        return FileSystem::linkat(from_dir, from, to_dir, to, flags);
    }
};

struct Dir {
    std::string path;
    Dir() {
        char t[] = "/tmp/dyad-store-XXXXXX";
        path = mkdtemp(t);
    }
    ~Dir() { std::system(("rm -rf '" + path + "'").c_str()); }
    // Every entry under the directory except .dyad (the lock stripes).
    std::vector<std::string> entries(const std::string& sub = "") const {
        std::vector<std::string> out;
        DIR* d = opendir((path + "/" + sub).c_str());
        if (!d) return out;
        while (auto* e = readdir(d)) {
            std::string n = e->d_name;
            if (n == "." || n == ".." || (sub.empty() && n == ".dyad")) continue;
            out.push_back(n);
        }
        closedir(d);
        return out;
    }
};

std::string slurp(const std::string& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

Record record_of(const std::string& upath, const std::string& content, uint64_t gen = 1) {
    Record r;
    r.upath = upath;
    r.owner = "svc";
    r.node = "n";
    r.size = content.size();
    r.mtime_ns = 1700000000123456789LL;
    r.mode = 0640;
    r.generation = gen;
    return r;
}

nlohmann::json trailer_of(const std::string& content) {
    Xxh3 h;
    h.update(content.data(), content.size());
    return {{"size", content.size()}, {"xxh3", h.hex()}};
}

// The same, as install_whole takes it.
dyad::client::Sent sent_of(const std::string& content) {
    return dyad::client::sent_of(trailer_of(content), "t").value();
}

// Stages, writes `content` in chunks of `chunk` bytes, commits.
Status install(ConsumerStore& store, const std::string& upath, const std::string& content,
               const nlohmann::json& trailer, const Record& rec, size_t chunk = 1000) {
    auto st = store.stage(upath);
    if (!st) return st.status();
    for (size_t off = 0; off < content.size(); off += chunk) {
        Status w =
            st.value()->sink().write(content.data() + off, std::min(chunk, content.size() - off));
        if (!w) return w;
    }
    return st.value()->commit(trailer, rec);
}

}  // namespace

TEST(ConsumerStore, InstallsAWholeFileWithTheProducersModeAndMtime) {
    Dir d;
    ConsumerStore store(d.path, FileSystem::real(), true);
    std::string content(10000, 'x');
    Record rec = record_of("a/b/c.bin", content);
    ASSERT_FALSE(store.present("a/b/c.bin", rec));
    ASSERT_TRUE(install(store, "a/b/c.bin", content, trailer_of(content), rec).is_ok());
    EXPECT_EQ(slurp(d.path + "/a/b/c.bin"), content);
    struct stat sb;
    ASSERT_EQ(stat((d.path + "/a/b/c.bin").c_str(), &sb), 0);
    EXPECT_EQ(sb.st_mode & 0777, 0640u);
    EXPECT_EQ(sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec, rec.mtime_ns);
    EXPECT_TRUE(store.present("a/b/c.bin", rec));
    // Another generation of the same path is not this copy.
    EXPECT_FALSE(store.present("a/b/c.bin", record_of("a/b/c.bin", content, 2)));
    EXPECT_EQ(d.entries("a/b"), std::vector<std::string>{"c.bin"});  // no temporary left
}

TEST(ConsumerStore, EmptyFilesAreFiles) {
    Dir d;
    ConsumerStore store(d.path, FileSystem::real(), false);
    Record rec = record_of("empty", "");
    ASSERT_TRUE(install(store, "empty", "", trailer_of(""), rec).is_ok());
    EXPECT_TRUE(store.present("empty", rec));
}

TEST(ConsumerStore, ACorruptTransferLeavesNothing) {
    Dir d;
    ConsumerStore store(d.path, FileSystem::real(), false);
    std::string content(5000, 'y');
    Record rec = record_of("f", content);
    auto wrong = trailer_of(content);
    wrong["xxh3"] = "0000000000000000";
    Status s = install(store, "f", content, wrong, rec);
    EXPECT_EQ(s.rc(), DYAD_RC_BADCHECKSUM);
    EXPECT_NE(s.message().find("'f' arrived corrupted"), std::string::npos);
    auto shorter = trailer_of(content + "z");
    EXPECT_EQ(install(store, "f", content, shorter, rec).rc(), DYAD_RC_BADCHECKSUM);
    EXPECT_TRUE(d.entries().empty());
}

TEST(ConsumerStore, AStagingDroppedUncommittedIsRemoved) {
    Dir d;
    ConsumerStore store(d.path, FileSystem::real(), false);
    {
        auto st = store.stage("g");
        ASSERT_TRUE(st.is_ok());
        ASSERT_TRUE(st.value()->sink().write("abc", 3).is_ok());
        EXPECT_EQ(d.entries().size(), 1u);  // the hidden temporary
        EXPECT_EQ(d.entries()[0].rfind(".g.dyad-", 0), 0u);
    }
    EXPECT_TRUE(d.entries().empty());
}

TEST(ConsumerStore, ShortWritesStillGiveTheWholeFile) {
    Dir d;
    FaultyFs fs;
    fs.short_writes = 7;
    ConsumerStore store(d.path, fs, false);
    std::string content;
    for (int i = 0; i < 3000; ++i) content += static_cast<char>('a' + i % 26);
    Record rec = record_of("s", content);
    ASSERT_TRUE(install(store, "s", content, trailer_of(content), rec).is_ok());
    EXPECT_EQ(slurp(d.path + "/s"), content);
}

TEST(ConsumerStore, DiskFullIsAClearErrorAndLeavesNothing) {
    Dir d;
    FaultyFs fs;
    fs.fail_write_after = 2500;
    ConsumerStore store(d.path, fs, false);
    std::string content(10000, 'q');
    Status s = install(store, "full", content, trailer_of(content), record_of("full", content));
    EXPECT_EQ(s.rc(), DYAD_RC_BADFIO);
    EXPECT_EQ(s.err(), ENOSPC);
    EXPECT_NE(s.message().find(".full.dyad-"), std::string::npos);  // names the file
    EXPECT_TRUE(d.entries().empty());
}

TEST(ConsumerStore, FsyncAndRenameFailuresLeaveNothing) {
    for (int which : {0, 1}) {
        Dir d;
        FaultyFs fs;
        (which == 0 ? fs.fail_fsync : fs.fail_rename) = EIO;
        ConsumerStore store(d.path, fs, true);
        std::string content(100, 'r');
        Status s = install(store, "h", content, trailer_of(content), record_of("h", content));
        EXPECT_EQ(s.rc(), DYAD_RC_BADFIO) << which;
        EXPECT_EQ(s.err(), EIO);
        EXPECT_NE(s.message().find(which == 0 ? "fsync" : "cannot move 'h' into place"),
                  std::string::npos)
            << s.message();
        EXPECT_TRUE(d.entries().empty()) << which;
    }
}

TEST(ConsumerStore, NoRoomForATemporaryFileNamesTheDirectory) {
    Dir d;
    FaultyFs fs;
    fs.fail_mkostemp = EACCES;
    ConsumerStore store(d.path, fs, false);
    auto st = store.stage("sub/x");
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.status().err(), EACCES);
    EXPECT_NE(st.status().message().find(d.path + "/sub"), std::string::npos);
}

TEST(ConsumerStore, TwoConsumersOfOneFileMoveItOnce) {
    Dir d;
    ConsumerStore store(d.path, FileSystem::real(), false);
    std::string content(4096, 'w');
    Record rec = record_of("shared", content);
    std::atomic<int> moved{0}, present{0};
    std::atomic<bool> first_holds{false};
    auto consumer = [&] {
        ConsumerStore mine(d.path, FileSystem::real(), false);  // its own open file descriptions
        if (mine.present("shared", rec)) {
            ++present;
            return;
        }
        auto lk = mine.lock("shared");
        ASSERT_TRUE(lk.is_ok());
        if (mine.present("shared", rec)) {
            ++present;
            return;
        }
        first_holds = true;
        // Hold the lock while the other consumer arrives.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        ASSERT_TRUE(install(mine, "shared", content, trailer_of(content), rec).is_ok());
        ++moved;
    };
    std::thread a(consumer);
    while (!first_holds) std::this_thread::yield();
    std::thread b(consumer);  // arrives while a holds the lock
    a.join();
    b.join();
    EXPECT_EQ(moved.load(), 1);
    EXPECT_EQ(present.load(), 1);
    EXPECT_TRUE(store.present("shared", rec));
}

// The lock file of the stripe a file's lock is in (the only one made here).
std::string only_lock_file(const Dir& d) {
    auto locks = d.entries(".dyad/locks");
    EXPECT_EQ(locks.size(), 1u);
    return locks.empty() ? "" : d.path + "/.dyad/locks/" + locks[0];
}

TEST(ConsumerStore, ATemporaryFileOfADeadWriterGoesWithTheNextLock) {
    Dir d;
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // A consumer that dies (no destructor runs) while writing.
        ConsumerStore mine(d.path, FileSystem::real(), false);
        auto lk = mine.lock("sub/f");
        auto st = mine.stage("sub/f", lk.is_ok() ? lk.value().get() : -1);
        bool ok = lk.is_ok() && st.is_ok() && st.value()->sink().write("partial", 7).is_ok();
        std::_Exit(ok ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    auto left = d.entries("sub");
    ASSERT_EQ(left.size(), 1u);
    EXPECT_EQ(left[0].rfind(".f.dyad-" + std::to_string(child) + "-", 0), 0u) << left[0];
    EXPECT_NE(slurp(only_lock_file(d)).find("sub/" + left[0]), std::string::npos);

    ConsumerStore store(d.path, FileSystem::real(), false);
    {
        auto lk = store.lock("sub/f");
        ASSERT_TRUE(lk.is_ok());
        EXPECT_TRUE(d.entries("sub").empty());
        EXPECT_EQ(slurp(only_lock_file(d)), "");
        // A writer that lives notes its temporary file, then forgets it.
        std::string content(100, 'z');
        auto st = store.stage("sub/f", lk.value().get());
        ASSERT_TRUE(st.is_ok());
        EXPECT_NE(slurp(only_lock_file(d)).find(std::to_string(getpid()) + " sub/.f.dyad-"),
                  std::string::npos);
        ASSERT_TRUE(st.value()->sink().write(content.data(), content.size()).is_ok());
        ASSERT_TRUE(st.value()->commit(trailer_of(content), record_of("sub/f", content)).is_ok());
        EXPECT_EQ(slurp(only_lock_file(d)), "");
    }
    EXPECT_EQ(d.entries("sub"), std::vector<std::string>{"f"});
}

TEST(ConsumerStore, ALockFileRecordRemovesOnlyTemporaryFiles) {
    Dir d;
    ConsumerStore store(d.path, FileSystem::real(), false);
    { ASSERT_TRUE(store.lock("x").is_ok()); }
    std::string lock = only_lock_file(d);
    std::ofstream(d.path + "/victim") << "keep";
    for (const char* rec :
         {"1 victim\n", "1 ../victim\n", "1 /etc/passwd\n", "1 a/../victim\n", "garbage"}) {
        std::ofstream(lock, std::ios::trunc) << rec;
        {
            auto lk = store.lock("x");
            ASSERT_TRUE(lk.is_ok());
        }
        EXPECT_EQ(slurp(d.path + "/victim"), "keep") << rec;
        EXPECT_EQ(slurp(lock), "") << rec;
    }
}

// ---- a consumer directory other users can write (issue 31) ----

mode_t mode_of(const std::string& p) {
    struct stat st;
    return ::lstat(p.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0;
}

TEST(ConsumerStoreTrust, DyadAndItsLockFilesArePrivate) {
    Dir d;
    ::mkdir((d.path + "/.dyad").c_str(), 02775);  // as an older version made it
    ConsumerStore store(d.path, FileSystem::real(), false);
    ASSERT_TRUE(store.lock("x").is_ok());
    EXPECT_EQ(mode_of(d.path + "/.dyad"), 0700u);
    EXPECT_EQ(mode_of(d.path + "/.dyad/locks"), 0700u);
    EXPECT_EQ(mode_of(only_lock_file(d)), 0600u);
}

TEST(ConsumerStoreTrust, LinksInDyadAreNeverFollowed) {
    Dir d, elsewhere;
    std::string victim = elsewhere.path + "/victim";
    std::ofstream(victim) << "precious";
    // .dyad a link to another directory.
    ASSERT_EQ(::symlink(elsewhere.path.c_str(), (d.path + "/.dyad").c_str()), 0);
    {
        ConsumerStore store(d.path, FileSystem::real(), false);
        auto lk = store.lock("x");
        ASSERT_FALSE(lk.is_ok());
        EXPECT_NE(lk.status().message().find(d.path + "/.dyad' is a symbolic link"),
                  std::string::npos)
            << lk.status().to_string();
    }
    EXPECT_TRUE(elsewhere.entries().size() == 1);
    // Every lock file a link to the victim.
    ::unlink((d.path + "/.dyad").c_str());
    ASSERT_EQ(::mkdir((d.path + "/.dyad").c_str(), 0700), 0);
    ASSERT_EQ(::mkdir((d.path + "/.dyad/locks").c_str(), 0700), 0);
    for (int i = 0; i < 256; ++i) {
        char name[32];
        std::snprintf(name, sizeof name, "/.dyad/locks/%02x.lock", i);
        ASSERT_EQ(::symlink(victim.c_str(), (d.path + name).c_str()), 0);
    }
    ConsumerStore store(d.path, FileSystem::real(), false);
    auto lk = store.lock("x");
    ASSERT_FALSE(lk.is_ok());
    EXPECT_EQ(lk.status().err(), ELOOP) << lk.status().to_string();
    EXPECT_NE(lk.status().message().find("lock file '" + d.path + "/.dyad/locks/"),
              std::string::npos)
        << lk.status().to_string();
    EXPECT_NE(lk.status().message().find("' is a symbolic link"), std::string::npos)
        << lk.status().to_string();
    EXPECT_EQ(slurp(victim), "precious");
}

TEST(ConsumerStoreTrust, DyadOfAnotherUserIsRefused) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (to give .dyad to another user)";
    Dir d;
    ASSERT_EQ(::mkdir((d.path + "/.dyad").c_str(), 0777), 0);
    ASSERT_EQ(::chown((d.path + "/.dyad").c_str(), 65534, 65534), 0);
    ConsumerStore store(d.path, FileSystem::real(), false);
    auto lk = store.lock("x");
    ASSERT_FALSE(lk.is_ok());
    EXPECT_EQ(lk.status().err(), EPERM);
    EXPECT_NE(lk.status().message().find("'" + d.path + "/.dyad' belongs to uid 65534"),
              std::string::npos)
        << lk.status().to_string();
    EXPECT_NE(lk.status().message().find("Remove it"), std::string::npos);
}

TEST(ConsumerStoreTrust, ASymlinkedDirectoryIsRefusedAndNothingLandsBehindIt) {
    Dir d, elsewhere;
    ASSERT_EQ(::mkdir((d.path + "/run1").c_str(), 0755), 0);
    ASSERT_EQ(::symlink(elsewhere.path.c_str(), (d.path + "/run1/x").c_str()), 0);
    std::ofstream(elsewhere.path + "/passwd") << "root";
    ConsumerStore store(d.path, FileSystem::real(), false);
    std::string content = "toor";
    Record rec = record_of("run1/x/passwd", content);
    EXPECT_FALSE(store.present("run1/x/passwd", rec));
    auto st = store.stage("run1/x/passwd");
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.status().err(), ELOOP);
    EXPECT_NE(st.status().message().find("'run1/x' is a symbolic link (-> '" + elsewhere.path),
              std::string::npos)
        << st.status().to_string();
    EXPECT_NE(st.status().message().find(d.path), std::string::npos);
    auto whole =
        store.install_whole("run1/x/passwd", rec, sent_of(content), content.data(), content.size());
    ASSERT_FALSE(whole.is_ok());
    EXPECT_EQ(whole.status().err(), ELOOP);
    // A link as the last component is replaced, not followed.
    std::ofstream(elsewhere.path + "/last") << "root";
    ASSERT_EQ(::symlink((elsewhere.path + "/last").c_str(), (d.path + "/last").c_str()), 0);
    ASSERT_TRUE(
        install(store, "last", content, trailer_of(content), record_of("last", content)).is_ok());
    EXPECT_EQ(slurp(elsewhere.path + "/passwd"), "root");
    EXPECT_EQ(slurp(elsewhere.path + "/last"), "root");
    EXPECT_EQ(slurp(d.path + "/last"), content);
    EXPECT_EQ(elsewhere.entries().size(), 2u);
}

TEST(ConsumerStoreTrust, ALockHeldPastTheDeadlineIsATimeoutNamingItsFile) {
    Dir d;
    ConsumerStore holder(d.path, FileSystem::real(), false),
        waiter(d.path, FileSystem::real(), false);
    auto held = holder.lock("x");
    ASSERT_TRUE(held.is_ok());
    auto t0 = std::chrono::steady_clock::now();
    auto lk = waiter.lock("x", Deadline::after(0.3), 60);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(lk.is_ok());
    EXPECT_EQ(lk.status().rc(), DYAD_RC_TIMEOUT);
    EXPECT_GE(took, 0.29);
    EXPECT_LT(took, 2.0);  // the holder moves nothing: no grace
    EXPECT_NE(lk.status().message().find(only_lock_file(d) + "' is held by another process"),
              std::string::npos)
        << lk.status().to_string();
}

TEST(ConsumerStoreTrust, AHolderMovingItsFileIsWaitedForPastTheDeadline) {
    Dir d;
    ConsumerStore holder(d.path, FileSystem::real(), false),
        waiter(d.path, FileSystem::real(), false);
    std::string content(20, 'm');
    std::atomic<bool> staged{false};
    std::thread a([&] {
        auto lk = holder.lock("f");
        ASSERT_TRUE(lk.is_ok());
        auto st = holder.stage("f", lk.value().get());
        ASSERT_TRUE(st.is_ok());
        staged = true;
        for (char c : content) {  // a byte every 40 ms: 0.8 s, past the waiter's deadline
            ASSERT_TRUE(st.value()->sink().write(&c, 1).is_ok());
            std::this_thread::sleep_for(std::chrono::milliseconds(40));
        }
        ASSERT_TRUE(st.value()->commit(trailer_of(content), record_of("f", content)).is_ok());
    });
    while (!staged) std::this_thread::yield();
    auto lk = waiter.lock("f", Deadline::after(0.2), 0.5);
    a.join();
    ASSERT_TRUE(lk.is_ok()) << lk.status().to_string();
    EXPECT_TRUE(waiter.present("f", record_of("f", content)));
}

TEST(ConsumerStore, ProgressIsReportedOnTheFirstBytesThenAtMostPerInterval) {
    Dir d;
    ConsumerStore store(d.path, FileSystem::real(), false);
    auto st = store.stage("p");
    ASSERT_TRUE(st.is_ok());
    std::vector<uint64_t> seen;
    st.value()->sink().on_progress([&](uint64_t b) { seen.push_back(b); }, 3600);
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(st.value()->sink().write("abcd", 4).is_ok());
    EXPECT_EQ(seen, std::vector<uint64_t>{4});
    st.value()->sink().on_progress([&](uint64_t b) { seen.push_back(b); }, 0);
    ASSERT_TRUE(st.value()->sink().write("ef", 2).is_ok());
    ASSERT_TRUE(st.value()->sink().write("gh", 2).is_ok());
    EXPECT_EQ(seen, (std::vector<uint64_t>{4, 22, 24}));
}

// ---- the size of each write(2) (docs/design.md, "The 512 MiB tail") ----

namespace {

std::string pattern(size_t n) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7919 + i / 4096) & 0xff);
    return s;
}

// The largest page-cache folio (in bytes) holding the first `n` bytes of the
// file at `path`, read from /proc/self/pagemap and /proc/kpageflags (a head
// page and its tail pages); 0 where the kernel does not tell (not root, no
// /proc/kpageflags).
size_t largest_folio(const std::string& path, size_t n) {
    constexpr uint64_t kTail = 1ull << 16, kPresent = 1ull << 63;  // KPF_COMPOUND_TAIL
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    int pm = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    int kf = ::open("/proc/kpageflags", O_RDONLY | O_CLOEXEC);
    size_t largest = 0, run = 0;
    void* m = fd >= 0 ? ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (m != MAP_FAILED && pm >= 0 && kf >= 0) {
        const auto* c = static_cast<const volatile char*>(m);
        for (size_t off = 0; off < n; off += page) {
            (void)c[off];  // maps the page
            uint64_t e = 0, flags = 0;
            auto at = static_cast<off_t>((reinterpret_cast<uintptr_t>(m) + off) / page * 8);
            if (::pread(pm, &e, 8, at) != 8 || !(e & kPresent)) break;
            uint64_t pfn = e & ((1ull << 55) - 1);
            if (pfn == 0) break;  // PFNs hidden: not root
            if (::pread(kf, &flags, 8, static_cast<off_t>(pfn * 8)) != 8) break;
            run = (flags & kTail) ? run + page : page;  // a head or a page of its own starts one
            largest = std::max(largest, run);
        }
    }
    if (m != MAP_FAILED) ::munmap(m, n);
    for (int f : {fd, pm, kf})
        if (f >= 0) ::close(f);
    return largest;
}

}  // namespace

TEST(ConsumerStore, ChunksAreWrittenInPiecesOfAtMostTheWritePiece) {
    Dir d;
    FaultyFs fs;
    ConsumerStore store(d.path, fs, false);
    const std::string content = pattern((4u << 20) + 12345);
    Record rec = record_of("big", content);
    // Chunks of 1 MiB as the stream and UCX receivers hand them over.
    ASSERT_TRUE(install(store, "big", content, trailer_of(content), rec, 1u << 20).is_ok());
    EXPECT_EQ(slurp(d.path + "/big"), content);
    EXPECT_LE(fs.largest_write, client::kWritePiece);
    // A whole file of a fetch_many batch, the same.
    fs.largest_write = 0;
    const std::string small = pattern(1u << 20);
    auto r =
        store.install_whole("w", record_of("w", small), sent_of(small), small.data(), small.size());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    if (r.value()) {
        EXPECT_EQ(slurp(d.path + "/w"), small);
        EXPECT_LE(fs.largest_write, client::kWritePiece);
    }
}

// The point of the pieces, on the real kernel: where one large write(2)
// takes a large page-cache folio (ext4 with large folios, Linux >= 6.x), the
// copy written through the sink has none larger than kWritePiece. Skipped
// where the kernel does not show folios (not root) or the file system makes
// no large folios.
TEST(ConsumerStore, ACopyHasNoPageCacheFolioLargerThanTheWritePiece) {
    Dir d;
    const size_t n = 8u << 20;
    const std::string content = pattern(n);
    const std::string control = d.path + "/control";
    {
        int fd = ::open(control.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        ASSERT_GE(fd, 0);
        for (size_t off = 0; off < n; off += 1u << 20)
            ASSERT_EQ(::write(fd, content.data() + off, 1u << 20), 1 << 20);
        ::close(fd);
    }
    size_t big = largest_folio(control, n);
    if (big == 0) GTEST_SKIP() << "/proc/kpageflags does not show page-cache folios here (root?)";
    if (big <= client::kWritePiece)
        GTEST_SKIP() << "1 MiB writes make no folio above " << client::kWritePiece
                     << " bytes on this file system (largest " << big << ")";
    ConsumerStore store(d.path, FileSystem::real(), false);
    Record rec = record_of("copy", content);
    ASSERT_TRUE(install(store, "copy", content, trailer_of(content), rec, 1u << 20).is_ok());
    size_t got = largest_folio(d.path + "/copy", n);
    EXPECT_GT(got, 0u);
    EXPECT_LE(got, client::kWritePiece) << "1 MiB writes made folios of " << big << " bytes";
}

// ---- whole small files (dyad.fetch_many): unnamed file, linked into place ----

TEST(ConsumerStoreWhole, InstallsWithModeMtimeAndStampAndNoOtherName) {
    Dir d;
    FaultyFs fs;
    ConsumerStore store(d.path, fs, false);
    std::string content = "sample bytes";
    Record rec = record_of("a/b/s.bin", content);
    auto r =
        store.install_whole("a/b/s.bin", rec, sent_of(content), content.data(), content.size());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_TRUE(r.value()) << "this file system cannot make unnamed files";
    EXPECT_EQ(slurp(d.path + "/a/b/s.bin"), content);
    struct stat st;
    ASSERT_EQ(::stat((d.path + "/a/b/s.bin").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0640u);
    EXPECT_EQ(st.st_mtim.tv_nsec, 123456789);
    EXPECT_EQ(st.st_nlink, 1u);
    EXPECT_TRUE(store.present("a/b/s.bin", rec));
    EXPECT_EQ(d.entries("a/b"), std::vector<std::string>{"s.bin"});
    EXPECT_EQ(d.entries(), std::vector<std::string>{"a"});  // no lock stripes either
}

TEST(ConsumerStoreWhole, WhatTheOwnerSentIsReadFromEitherForm) {
    // The JSON trailer: size and 1-16 hex digits, nothing else.
    auto ok = dyad::client::sent_of({{"size", 5}, {"xxh3", "00ab"}}, "f");
    ASSERT_TRUE(ok.is_ok());
    EXPECT_EQ(ok->size, 5u);
    EXPECT_EQ(ok->xxh3, 0xabu);
    for (const nlohmann::json& bad :
         std::vector<nlohmann::json>{{{"size", 5}},
                                     {{"xxh3", "ab"}},
                                     {{"size", 5}, {"xxh3", ""}},
                                     {{"size", 5}, {"xxh3", "xyz"}},
                                     {{"size", 5}, {"xxh3", "ab "}},
                                     {{"size", 5}, {"xxh3", "-1"}},
                                     {{"size", 5}, {"xxh3", "+1"}},
                                     {{"size", 5}, {"xxh3", "00000000000000001"}},
                                     {{"size", 5}, {"xxh3", 7}},
                                     {{"size", -5}, {"xxh3", "ab"}}}) {
        auto r = dyad::client::sent_of(bad, "f");
        ASSERT_FALSE(r.is_ok()) << bad.dump();
        EXPECT_EQ(r.status().rc(), DYAD_RC_BADRPC);
        EXPECT_NE(r.status().message().find("'f'"), std::string::npos);
    }
    // The compact header: index and digest, little-endian, written and read.
    char h[dyad::dtl::kRawFileHeader];
    dyad::dtl::put_raw_file_header(h, 0x01020304, 0x8899aabbccddeeffull);
    EXPECT_EQ(static_cast<unsigned char>(h[0]), 0x04);
    EXPECT_EQ(static_cast<unsigned char>(h[4]), 0xff);
    EXPECT_EQ(static_cast<unsigned char>(h[11]), 0x88);
    auto back = dyad::dtl::get_raw_file_header(h);
    EXPECT_EQ(back.index, 0x01020304u);
    EXPECT_EQ(back.digest, 0x8899aabbccddeeffull);
    // A digest that is not the bytes': refused, naming the file.
    std::string content = "abc";
    auto sent = sent_of(content);
    EXPECT_TRUE(dyad::client::verify_sent(sent, content.data(), content.size(), "f").is_ok());
    sent.xxh3 ^= 1;
    Status wrong = dyad::client::verify_sent(sent, content.data(), content.size(), "f");
    EXPECT_EQ(wrong.rc(), DYAD_RC_BADCHECKSUM);
    EXPECT_NE(wrong.message().find("'f' arrived corrupted"), std::string::npos);
}

TEST(ConsumerStoreWhole, LinksByDescriptorOrElseByProcName) {
    for (bool refused : {false, true}) {
        SCOPED_TRACE(refused ? "linkat(AT_EMPTY_PATH) refused" : "linkat(AT_EMPTY_PATH) allowed");
        Dir d;
        FaultyFs fs;
        fs.refuse_flink = refused;
        ConsumerStore store(d.path, fs, false);
        for (const char* name : {"a/one.bin", "a/two.bin", "b/three.bin"}) {
            std::string content = std::string(name) + " bytes";
            Record rec = record_of(name, content);
            auto r =
                store.install_whole(name, rec, sent_of(content), content.data(), content.size());
            ASSERT_TRUE(r.is_ok()) << r.status().to_string();
            ASSERT_TRUE(r.value());
            EXPECT_EQ(slurp(d.path + "/" + name), content);
            EXPECT_TRUE(store.present(name, rec));
        }
        // Refused once, never asked again: the /proc name from then on.
        EXPECT_EQ(fs.flinks, refused ? 1 : 3);
        EXPECT_EQ(fs.proc_links, refused ? 3 : 0);
        auto names = d.entries("a");
        std::sort(names.begin(), names.end());
        EXPECT_EQ(names, (std::vector<std::string>{"one.bin", "two.bin"}));
    }
}

TEST(ConsumerStoreWhole, ReplacesAnOlderCopyAndLeavesNoTemporaryName) {
    Dir d;
    FaultyFs fs;
    ConsumerStore store(d.path, fs, false);
    std::string old = "generation one", now = "generation two!";
    ASSERT_TRUE(store
                    .install_whole("s.bin", record_of("s.bin", old, 1), sent_of(old), old.data(),
                                   old.size())
                    .is_ok());
    Record rec = record_of("s.bin", now, 2);
    auto r = store.install_whole("s.bin", rec, sent_of(now), now.data(), now.size());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(slurp(d.path + "/s.bin"), now);
    EXPECT_TRUE(store.present("s.bin", rec));
    EXPECT_EQ(d.entries(), std::vector<std::string>{"s.bin"});
}

TEST(ConsumerStoreWhole, BadBytesOrAFailedWriteLeaveNothing) {
    Dir d;
    FaultyFs fs;
    ConsumerStore store(d.path, fs, false);
    std::string content = "0123456789abcdef";
    Record rec = record_of("x/f.bin", content);
    // Checksum of other bytes.
    auto r = store.install_whole("x/f.bin", rec, sent_of("something else entirely"), content.data(),
                                 content.size());
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().rc(), DYAD_RC_BADCHECKSUM) << r.status().to_string();
    // Fewer bytes than published.
    r = store.install_whole("x/f.bin", rec, sent_of("short"), "short", 5);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().err(), ESTALE);
    // The disk fills after 4 bytes.
    fs.fail_write_after = 4;
    r = store.install_whole("x/f.bin", rec, sent_of(content), content.data(), content.size());
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().err(), ENOSPC);
    EXPECT_NE(r.status().to_string().find("f.bin"), std::string::npos) << r.status().to_string();
    EXPECT_TRUE(d.entries("x").empty());
    EXPECT_FALSE(store.present("x/f.bin", rec));
}
