// SPDX-License-Identifier: Apache-2.0
// libdyad_wrapper.so: LD_PRELOAD shim. Thin by design: resolves the
// originals once, keeps a per-thread reentrancy guard and a lock-free fd
// table, and leaves every decision to dyad::capi::InterceptPolicy and the
// client. Files outside the managed directories pass through without
// allocation or locking.
#include <atomic>
#include <cerrno>
#include <dirent.h>
#include <climits>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <memory>
#include <mutex>
#include <pthread.h>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

#include "client/client.hpp"
#include "capi/intercept.hpp"
#include "client/publish_queue.hpp"
#include "common/config.hpp"
#include "common/log.hpp"
#include "common/settings.hpp"
#include "writer_lock.hpp"

namespace {

using dyad::capi::InterceptPolicy;
using dyad::wrapper::WriterLock;

// ---- originals ----
using open_fn = int (*)(const char*, int, ...);
using openat_fn = int (*)(int, const char*, int, ...);
using creat_fn = int (*)(const char*, mode_t);
using open2_fn = int (*)(const char*, int);
using openat2_fn = int (*)(int, const char*, int);
using fopen_fn = FILE* (*)(const char*, const char*);
using freopen_fn = FILE* (*)(const char*, const char*, FILE*);
using close_fn = int (*)(int);
using fclose_fn = int (*)(FILE*);
using dup_fn = int (*)(int);
using dup2_fn = int (*)(int, int);
using dup3_fn = int (*)(int, int, int);
using fcntl_fn = int (*)(int, int, ...);
using rename_fn = int (*)(const char*, const char*);
using renameat_fn = int (*)(int, const char*, int, const char*);
using renameat2_fn = int (*)(int, const char*, int, const char*, unsigned);

template <typename F>
F resolve(F& slot, const char* name) {
    F f = __atomic_load_n(&slot, __ATOMIC_ACQUIRE);
    if (!f) {
        f = reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
        __atomic_store_n(&slot, f, __ATOMIC_RELEASE);
    }
    return f;
}

#define REAL(type, name)                    \
    static type real_##name = nullptr;      \
    inline type orig_##name() {             \
        return resolve(real_##name, #name); \
    }

REAL(open_fn, open)
REAL(open_fn, open64)
REAL(openat_fn, openat)
REAL(openat_fn, openat64)
REAL(creat_fn, creat)
REAL(creat_fn, creat64)
REAL(open2_fn, __open_2)
REAL(open2_fn, __open64_2)
REAL(openat2_fn, __openat_2)
REAL(openat2_fn, __openat64_2)
REAL(fopen_fn, fopen)
REAL(fopen_fn, fopen64)
REAL(freopen_fn, freopen)
REAL(freopen_fn, freopen64)
REAL(close_fn, close)
REAL(fclose_fn, fclose)
REAL(dup_fn, dup)
REAL(dup2_fn, dup2)
REAL(dup3_fn, dup3)
REAL(fcntl_fn, fcntl)
REAL(fcntl_fn, fcntl64)
REAL(rename_fn, rename)
REAL(renameat_fn, renameat)
REAL(renameat2_fn, renameat2)

// ---- state ----
__attribute__((tls_model("initial-exec"))) thread_local bool t_busy = false;

struct Busy {
    bool prev;
    Busy() : prev(t_busy) { t_busy = true; }
    ~Busy() { t_busy = prev; }
};

struct State {
    std::shared_ptr<dyad::client::Client> client;
    std::unique_ptr<InterceptPolicy> policy;
    // DYAD_ASYNC_PUBLISH: closes queue, its thread publishes (publish_queue.hpp).
    std::shared_ptr<dyad::client::PublishQueue> publisher;
    bool fsync_write = false;
    bool check = false;
    std::string writers_dir;  // PRODUCER_DIR/.dyad/writers (writer_lock.hpp)
};
std::atomic<State*> g_state{nullptr};

// A file open for writing under the producer directory (opened here, or
// inherited: writer_lock.hpp); shared by dups, published when the last
// writer is done with it.
struct WriteEntry {
    int refs = 1;     // guarded by g_table_mu
    pid_t owner = 0;  // without a lock, only the process that opened it publishes it
    std::string path;
    WriterLock lock;  // this process's hold on the file (its last holder publishes)
    unsigned fork_gen = 0;
};
// Guards reference counts and slot changes of managed entries. The
// pass-through path never takes it: it only sees an empty slot.
std::mutex g_table_mu;
constexpr int kMaxFd = 1 << 16;
std::atomic<WriteEntry*> g_fds[kMaxFd];
// Descriptors that are WriterLocks of entries (a program closing one under
// us, or dup2-ing onto it, makes the entry forget it).
std::atomic<bool> g_lock_fds[kMaxFd];
unsigned g_fork_gen = 0;  // guarded by g_table_mu

State* active() {
    if (t_busy) return nullptr;
    return g_state.load(std::memory_order_acquire);
}

void publish(State* st, const std::string& path) {
    Busy b;
    dyad::Status s = st->publisher ? st->publisher->enqueue(path) : st->client->produce(path);
    if (!s) {
        std::fprintf(stderr, "dyad: cannot publish '%s': %s\n", path.c_str(),
                     s.to_string().c_str());
        return;
    }
    if (st->check) setenv("DYAD_SYNC_HEALTH", "ok", 1);
}

void mark_lock_fd(const WriterLock& l, bool on) {
    if (l.fd() >= 0 && l.fd() < kMaxFd) g_lock_fds[l.fd()].store(on, std::memory_order_release);
}

// Drops one reference (the caller took it out of the table under the
// mutex); the last one in this process publishes if no other process
// still writes the file (writer_lock.hpp), or, without a lock, if this
// process opened it.
void release(WriteEntry* e) {
    if (!e) return;
    {
        std::lock_guard<std::mutex> lk(g_table_mu);
        if (--e->refs != 0) return;
        mark_lock_fd(e->lock, false);
    }
    int saved = errno;
    const bool last = e->lock.valid() ? e->lock.last() : e->owner == getpid();
    if (last) {
        if (State* st = g_state.load(std::memory_order_acquire)) {
            const char* slash = std::strrchr(e->path.c_str(), '/');
            if (dyad::capi::is_tool_temporary(slash ? slash + 1 : e->path.c_str()))
                DYAD_DEBUG("wrapper", "'%s' looks like a tool's temporary: published when renamed",
                           e->path.c_str());
            else
                publish(st, e->path);
        }
    }
    e->lock.end(last);
    errno = saved;
    delete e;
}

// The program closed (or dup2'd onto) descriptor `fd`: if it was an
// entry's WriterLock, that entry no longer holds one.
void lock_fd_gone(int fd) {
    if (fd < 0 || fd >= kMaxFd || !g_lock_fds[fd].load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lk(g_table_mu);
    g_lock_fds[fd].store(false, std::memory_order_release);
    for (int i = 0; i < kMaxFd; ++i) {
        WriteEntry* e = g_fds[i].load(std::memory_order_acquire);
        if (e && e->lock.fd() == fd) e->lock.lost();
    }
}

WriteEntry* take(int fd) {
    if (fd < 0 || fd >= kMaxFd) return nullptr;
    if (!g_fds[fd].load(std::memory_order_acquire)) return nullptr;  // pass-through: no lock
    std::lock_guard<std::mutex> lk(g_table_mu);
    return g_fds[fd].exchange(nullptr, std::memory_order_acq_rel);
}

// fd `to` now refers to what `from` does (dup & co.); what `to` referred to
// before was implicitly closed.
void share(int from, int to) {
    if (from < 0 || from >= kMaxFd || to < 0 || to >= kMaxFd) return;
    lock_fd_gone(to);
    if (!g_fds[from].load(std::memory_order_acquire) && !g_fds[to].load(std::memory_order_acquire))
        return;
    WriteEntry* old;
    {
        std::lock_guard<std::mutex> lk(g_table_mu);
        WriteEntry* e = g_fds[from].load(std::memory_order_acquire);
        if (e) ++e->refs;
        old = g_fds[to].exchange(e, std::memory_order_acq_rel);
    }
    release(old);
}

// Whether a process other than this one has `abs` (a regular file of the
// producer directory) open for writing: a read lease cannot be had then.
// Where leases cannot tell (another owner, a file system without them):
// no.
bool written_elsewhere(const char* abs) {
    int fd = orig_open()(abs, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0);
    if (fd < 0) return false;
    bool writing = false;
    // A writer opening the file while the lease is held breaks it and the
    // kernel signals this process: SIGURG (ignored by default), not SIGIO.
    if (orig_fcntl()(fd, F_SETSIG, SIGURG) != 0) {
        orig_close()(fd);
        return false;
    }
    if (orig_fcntl()(fd, F_SETLEASE, F_RDLCK) == 0) {
        orig_fcntl()(fd, F_SETLEASE, F_UNLCK);
    } else if (errno == EAGAIN) {
        // Ours (this process writes it too) counts for nothing.
        std::lock_guard<std::mutex> lk(g_table_mu);
        writing = true;
        for (int i = 0; i < kMaxFd && writing; ++i) {
            WriteEntry* e = g_fds[i].load(std::memory_order_acquire);
            if (e && e->path == abs) writing = false;
        }
    }
    orig_close()(fd);
    return writing;
}

// What an open of a consumer path does first (intercept.hpp, consume_mode).
dyad::capi::ConsumeMode mode_of(State* st, int dirfd, const char* abs, int oflag) {
    dyad::capi::OpenFacts f;
    f.oflag = oflag;
    if (!InterceptPolicy::should_consume(oflag)) return dyad::capi::consume_mode(f);
    f.via_dirfd = dirfd != AT_FDCWD;
    const char* slash = std::strrchr(abs, '/');
    f.temporary = dyad::capi::is_tool_temporary(slash ? slash + 1 : abs);
    struct stat sb;
    if (::stat(abs, &sb) == 0) {
        f.exists = true;
        f.is_dir = S_ISDIR(sb.st_mode);
        // Being written here (the producer directory is this one): its
        // publish at the writer's close is waited for.
        f.being_written = S_ISREG(sb.st_mode) && (oflag & O_ACCMODE) == O_RDONLY &&
                          st->policy->under_producer(abs) && written_elsewhere(abs);
    }
    return dyad::capi::consume_mode(f);
}

// Consumes `abs` as `mode` says. False (errno set, a line on stderr) when
// that failed; a file looked up and not produced is no failure.
bool consume_for_open(State* st, const char* abs, dyad::capi::ConsumeMode mode) {
    Busy b;
    dyad::Status s;
    if (mode == dyad::capi::ConsumeMode::wait) {
        s = st->client->consume(abs);
    } else {
        auto rec = st->client->get_metadata(abs, false);
        if (!rec && rec.status().rc() == DYAD_RC_NOTFOUND) return true;
        s = rec ? st->client->consume_with(abs, rec.value()) : rec.status();
    }
    if (!s) {
        std::fprintf(stderr, "dyad: cannot open '%s': %s\n", abs, s.to_string().c_str());
        errno = dyad::capi::errno_for(s);
        return false;
    }
    if (st->check) setenv("DYAD_SYNC_HEALTH", "ok", 1);
    return true;
}

// Before the real open: consume if needed. Returns false (errno set) when
// the consume failed. Fills abs with the absolute path when managed.
bool before_open(State* st, int dirfd, const char* path, int oflag, char* abs,
                 bool* managed_write) {
    *managed_write = false;
    if (!InterceptPolicy::absolute(dirfd, path, abs, PATH_MAX)) return true;
    if (dyad::capi::intent_of_oflag(oflag).write && st->policy->under_producer(abs))
        *managed_write = true;
    if (!st->policy->under_consumer(abs)) return true;
    const auto mode = mode_of(st, dirfd, abs, oflag);
    if (mode == dyad::capi::ConsumeMode::none) return true;
    return consume_for_open(st, abs, mode);
}

void after_open(int fd, bool managed_write, const char* abs) {
    if (fd < 0 || !managed_write) return;
    if (fd >= kMaxFd) {
        std::fprintf(stderr, "dyad: fd %d beyond the wrapper's table: '%s' will not be published\n",
                     fd, abs);
        return;
    }
    auto* e = new WriteEntry();
    e->path = abs;
    e->owner = getpid();
    if (State* st = g_state.load(std::memory_order_acquire))
        e->lock = WriterLock::take(st->writers_dir, fd);
    WriteEntry* old;
    {
        std::lock_guard<std::mutex> lk(g_table_mu);
        mark_lock_fd(e->lock, true);
        old = g_fds[fd].exchange(e, std::memory_order_acq_rel);
    }
    release(old);
}

bool needs_mode(int oflag) {
    return (oflag & O_CREAT) || ((oflag & O_TMPFILE) == O_TMPFILE);
}

template <typename Call>
int do_open(int dirfd, const char* path, int oflag, Call call) {
    State* st = active();
    if (!st) return call();
    char abs[PATH_MAX];
    bool mw = false;
    if (!before_open(st, dirfd, path, oflag, abs, &mw)) return -1;
    int fd = call();
    if (mw) after_open(fd, mw, abs);
    return fd;
}

FILE* do_fopen(const char* path, const char* mode, FILE* (*call)(const char*, const char*)) {
    State* st = active();
    if (!st) return call(path, mode);
    char abs[PATH_MAX];
    bool mw = false;
    if (!before_open(st, AT_FDCWD, path, dyad::capi::oflag_of_fmode(mode), abs, &mw))
        return nullptr;
    FILE* f = call(path, mode);
    if (f && mw) after_open(fileno(f), mw, abs);
    return f;
}

int do_close(int fd) {
    State* st = active();
    if (st) lock_fd_gone(fd);
    WriteEntry* e = st ? take(fd) : nullptr;
    if (e && st->fsync_write) ::fsync(fd);
    int rc = orig_close()(fd);
    release(e);
    return rc;
}

// After a successful rename of `from` to `to` (both absolute): a file still
// open for writing under the old name is published under the new one when
// it is closed; a closed file renamed into (or inside) the producer
// directory is published now under its new name (mv, rsync, sed -i).
void after_rename(State* st, const char* from, const char* to) {
    bool open_for_writing = false;
    if (st->policy->under_producer(from)) {  // only such files have entries
        std::lock_guard<std::mutex> lk(g_table_mu);
        for (int fd = 0; fd < kMaxFd; ++fd) {
            WriteEntry* e = g_fds[fd].load(std::memory_order_acquire);
            if (e && e->path == from) {
                e->path = to;
                open_for_writing = true;
            }
        }
    }
    if (open_for_writing || !st->policy->under_producer(to)) return;
    struct stat sb;
    if (::lstat(to, &sb) != 0 || !S_ISREG(sb.st_mode)) return;
    const char* slash = std::strrchr(to, '/');
    if (dyad::capi::is_tool_temporary(slash ? slash + 1 : to)) return;
    int saved = errno;
    publish(st, to);
    errno = saved;
}

template <typename Call>
int do_rename(int fromfd, const char* from, int tofd, const char* to, Call call) {
    State* st = active();
    if (!st) return call();
    char from_abs[PATH_MAX], to_abs[PATH_MAX];
    const bool known = InterceptPolicy::absolute(fromfd, from, from_abs, PATH_MAX) &&
                       InterceptPolicy::absolute(tofd, to, to_abs, PATH_MAX);
    int rc = call();
    if (rc == 0 && known) after_rename(st, from_abs, to_abs);
    return rc;
}

// Warns once per process tree (the environment carries it to children)
// that the wrapper is loaded with no managed directory: it does nothing.
void warn_inert() {
    // A marker between processes, not a setting (so not a DYAD_* name).
    if (dyad::settings::foreign("LIBDYAD_WRAPPER_WARNED")) return;
    std::fprintf(stderr,
                 "dyad: libdyad_wrapper.so is loaded but neither DYAD_PATH_PRODUCER nor "
                 "DYAD_PATH_CONSUMER is set: this program's files are neither published nor "
                 "consumed (set them, or remove the wrapper from LD_PRELOAD)\n");
    setenv("LIBDYAD_WRAPPER_WARNED", "1", 1);
}

// fork: the table's mutex is held across it (no other thread of the
// parent may hold it in the child); the child takes a WriterLock of its own
// for every file it now writes too (the inherited lock descriptors share
// the parent's lock), so that the last of parent and child to be done
// publishes.
void before_fork() {
    g_table_mu.lock();
}
void after_fork_parent() {
    g_table_mu.unlock();
}
void after_fork_child() {
    State* st = g_state.load();
    ++g_fork_gen;
    for (int fd = 0; st && fd < kMaxFd; ++fd) {
        WriteEntry* e = g_fds[fd].load(std::memory_order_relaxed);
        if (!e || e->fork_gen == g_fork_gen) continue;
        e->fork_gen = g_fork_gen;
        const int inherited = e->lock.fd();
        if (inherited < 0) continue;  // none: the parent (its opener) publishes
        WriterLock mine = WriterLock::take(st->writers_dir, fd);
        // The parent's descriptor, not its lock (the parent holds that).
        if (inherited < kMaxFd) g_lock_fds[inherited].store(false);
        orig_close()(inherited);
        e->lock = mine;
        mark_lock_fd(e->lock, true);
        if (mine.valid()) e->owner = getpid();
    }
    g_table_mu.unlock();
    if (st) st->client->reset_after_fork();
}

// Descriptors this program inherited open for writing on files of the
// producer directory (`cmd > f`, `exec > f`, a parent's file): published
// when the last writer is done (writer_lock.hpp), as if opened here.
void adopt_inherited(State* st) {
    DIR* d = ::opendir("/proc/self/fd");
    if (!d) return;
    const int self = ::dirfd(d);
    while (struct dirent* de = ::readdir(d)) {
        char* end = nullptr;
        long fd = std::strtol(de->d_name, &end, 10);
        if (*end != '\0' || fd < 0 || fd >= kMaxFd || fd == self) continue;
        int fl = orig_fcntl()(static_cast<int>(fd), F_GETFL, nullptr);
        if (fl < 0 || !dyad::capi::intent_of_oflag(fl).write) continue;
        char link[64], target[PATH_MAX];
        std::snprintf(link, sizeof link, "/proc/self/fd/%ld", fd);
        ssize_t n = ::readlink(link, target, sizeof target - 1);
        if (n <= 0 || target[0] != '/') continue;  // pipes, sockets, ...
        target[n] = '\0';
        struct stat sb;
        if (!st->policy->under_producer(target) || ::fstat(static_cast<int>(fd), &sb) != 0 ||
            !S_ISREG(sb.st_mode) || sb.st_nlink == 0)  // removed: nothing to publish
            continue;
        DYAD_DEBUG("wrapper", "descriptor %ld writes '%s': published when its last writer is done",
                   fd, target);
        after_open(static_cast<int>(fd), true, target);
    }
    ::closedir(d);
}

// At exit (after the program's own exit handlers): the files still open for
// writing here are done being written by this process. Output buffers
// first; each descriptor is closed before its file is published (a file
// open for writing is not published: Client::produce).
void publish_at_exit() {
    State* st = g_state.load(std::memory_order_acquire);
    if (!st || t_busy) return;
    std::fflush(nullptr);
    for (int fd = 0; fd < kMaxFd; ++fd) {
        WriteEntry* e = take(fd);
        if (!e) continue;
        if (st->fsync_write) ::fsync(fd);
        orig_close()(fd);
        release(e);
    }
}

__attribute__((constructor)) void wrapper_init() {
    Busy b;
    auto cfg = dyad::Config::from_env();
    if (!cfg) {
        std::fprintf(stderr, "dyad: wrapper disabled: %s\n", cfg.status().to_string().c_str());
        return;
    }
    dyad::log::set_level(cfg->log_level);
    if (cfg->prod_path.empty() && cfg->cons_path.empty()) return warn_inert();
    auto c = dyad::client::Client::create(cfg.value());
    if (!c) {
        std::fprintf(stderr, "dyad: wrapper disabled: %s\n", c.status().to_string().c_str());
        return;
    }
    auto* st = new State();
    st->client = std::move(c.value());
    st->policy = std::make_unique<InterceptPolicy>(*st->client);
    st->fsync_write = cfg->fsync_write;
    st->check = cfg->check;
    if (cfg->async_publish && !cfg->prod_path.empty()) {
        auto o = dyad::client::PublishQueue::Options::from_settings();
        if (!o) {
            std::fprintf(stderr, "dyad: wrapper disabled: %s\n", o.status().to_string().c_str());
            delete st;
            return;
        }
        o->thread_init = [] { t_busy = true; };  // its own file accesses pass through
        st->publisher = dyad::client::PublishQueue::create(st->client, std::move(o.value()));
    }
    if (!st->client->producer_dir().empty())
        st->writers_dir = st->client->producer_dir().path() + "/.dyad/writers";
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    g_state.store(st, std::memory_order_release);
    if (!st->writers_dir.empty()) {
        adopt_inherited(st);
        std::atexit(publish_at_exit);
    }
}

// DYAD_ASYNC_PUBLISH: the queue drains before the library goes (its exit
// handler usually did already); what was not published is said.
__attribute__((destructor)) void wrapper_fini() {
    State* st = g_state.load(std::memory_order_acquire);
    if (!st || !st->publisher) return;
    Busy b;
    dyad::Status s = st->publisher->finish();
    if (!s) std::fprintf(stderr, "dyad: at exit: %s\n", s.message().c_str());
}

}  // namespace

extern "C" {

#define VA_MODE(oflag, mode)                         \
    mode_t mode = 0;                                 \
    if (needs_mode(oflag)) {                         \
        va_list ap;                                  \
        va_start(ap, oflag);                         \
        mode = static_cast<mode_t>(va_arg(ap, int)); \
        va_end(ap);                                  \
    }

__attribute__((visibility("default"))) int open(const char* path, int oflag, ...) {
    VA_MODE(oflag, mode);
    return do_open(AT_FDCWD, path, oflag, [&] { return orig_open()(path, oflag, mode); });
}
__attribute__((visibility("default"))) int open64(const char* path, int oflag, ...) {
    VA_MODE(oflag, mode);
    return do_open(AT_FDCWD, path, oflag, [&] { return orig_open64()(path, oflag, mode); });
}
__attribute__((visibility("default"))) int openat(int dirfd, const char* path, int oflag, ...) {
    VA_MODE(oflag, mode);
    return do_open(dirfd, path, oflag, [&] { return orig_openat()(dirfd, path, oflag, mode); });
}
__attribute__((visibility("default"))) int openat64(int dirfd, const char* path, int oflag, ...) {
    VA_MODE(oflag, mode);
    return do_open(dirfd, path, oflag, [&] { return orig_openat64()(dirfd, path, oflag, mode); });
}
__attribute__((visibility("default"))) int creat(const char* path, mode_t mode) {
    return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC,
                   [&] { return orig_creat()(path, mode); });
}
__attribute__((visibility("default"))) int creat64(const char* path, mode_t mode) {
    return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC,
                   [&] { return orig_creat64()(path, mode); });
}
__attribute__((visibility("default"))) int __open_2(const char* path, int oflag) {
    return do_open(AT_FDCWD, path, oflag, [&] { return orig___open_2()(path, oflag); });
}
__attribute__((visibility("default"))) int __open64_2(const char* path, int oflag) {
    return do_open(AT_FDCWD, path, oflag, [&] { return orig___open64_2()(path, oflag); });
}
__attribute__((visibility("default"))) int __openat_2(int dirfd, const char* path, int oflag) {
    return do_open(dirfd, path, oflag, [&] { return orig___openat_2()(dirfd, path, oflag); });
}
__attribute__((visibility("default"))) int __openat64_2(int dirfd, const char* path, int oflag) {
    return do_open(dirfd, path, oflag, [&] { return orig___openat64_2()(dirfd, path, oflag); });
}
__attribute__((visibility("default"))) FILE* fopen(const char* path, const char* mode) {
    return do_fopen(path, mode, orig_fopen());
}
__attribute__((visibility("default"))) FILE* fopen64(const char* path, const char* mode) {
    return do_fopen(path, mode, orig_fopen64());
}

static FILE* do_freopen(const char* path, const char* mode, FILE* stream, freopen_fn call) {
    State* st = active();
    if (!st) return call(path, mode, stream);
    int old_fd = stream ? fileno(stream) : -1;
    if (!path) {
        // Same file, new mode: the entry (if any) follows the stream.
        WriteEntry* old = take(old_fd);
        FILE* f = call(path, mode, stream);
        if (old) {
            if (f && dyad::capi::intent_of_fmode(mode).write && fileno(f) >= 0 &&
                fileno(f) < kMaxFd) {
                WriteEntry* displaced;
                {
                    std::lock_guard<std::mutex> lk(g_table_mu);
                    displaced = g_fds[fileno(f)].exchange(old);
                }
                release(displaced);
            } else {
                release(old);  // reopened read-only (or failed): its writing ended
            }
        }
        return f;
    }
    char abs[PATH_MAX];
    bool mw = false;
    if (!before_open(st, AT_FDCWD, path, dyad::capi::oflag_of_fmode(mode), abs, &mw))
        return nullptr;
    WriteEntry* old = take(old_fd);
    FILE* f = call(path, mode, stream);
    release(old);
    if (f && mw) after_open(fileno(f), mw, abs);
    return f;
}
__attribute__((visibility("default"))) FILE* freopen(const char* path, const char* mode,
                                                     FILE* stream) {
    return do_freopen(path, mode, stream, orig_freopen());
}
__attribute__((visibility("default"))) FILE* freopen64(const char* path, const char* mode,
                                                       FILE* stream) {
    return do_freopen(path, mode, stream, orig_freopen64());
}

__attribute__((visibility("default"))) int close(int fd) {
    return do_close(fd);
}

__attribute__((visibility("default"))) int fclose(FILE* f) {
    State* st = active();
    if (!st || !f) return orig_fclose()(f);
    WriteEntry* e = take(fileno(f));
    if (e && st->fsync_write) {
        fflush(f);
        ::fsync(fileno(f));
    }
    int rc = orig_fclose()(f);
    release(e);
    return rc;
}

__attribute__((visibility("default"))) int dup(int fd) {
    int r = orig_dup()(fd);
    if (r >= 0 && active()) share(fd, r);
    return r;
}
__attribute__((visibility("default"))) int dup2(int fd, int fd2) {
    int r = orig_dup2()(fd, fd2);
    if (r >= 0 && fd != fd2 && active()) share(fd, fd2);
    return r;
}
__attribute__((visibility("default"))) int dup3(int fd, int fd2, int flags) {
    int r = orig_dup3()(fd, fd2, flags);
    if (r >= 0 && active()) share(fd, fd2);
    return r;
}

static int do_fcntl(fcntl_fn call, int fd, int cmd, void* arg) {
    int r = call(fd, cmd, arg);
    if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && active()) share(fd, r);
    return r;
}
__attribute__((visibility("default"))) int fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void* arg = va_arg(ap, void*);
    va_end(ap);
    return do_fcntl(orig_fcntl(), fd, cmd, arg);
}
__attribute__((visibility("default"))) int fcntl64(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void* arg = va_arg(ap, void*);
    va_end(ap);
    return do_fcntl(orig_fcntl64(), fd, cmd, arg);
}

__attribute__((visibility("default"))) int rename(const char* from, const char* to) {
    return do_rename(AT_FDCWD, from, AT_FDCWD, to, [&] { return orig_rename()(from, to); });
}
__attribute__((visibility("default"))) int renameat(int fromfd, const char* from, int tofd,
                                                    const char* to) {
    return do_rename(fromfd, from, tofd, to,
                     [&] { return orig_renameat()(fromfd, from, tofd, to); });
}
__attribute__((visibility("default"))) int renameat2(int fromfd, const char* from, int tofd,
                                                     const char* to, unsigned flags) {
    auto real = orig_renameat2();
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    return do_rename(fromfd, from, tofd, to, [&] { return real(fromfd, from, tofd, to, flags); });
}

}  // extern "C"
