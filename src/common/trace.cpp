// SPDX-License-Identifier: Apache-2.0
#include "trace.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "config.hpp"
#include "fd.hpp"
#include "log.hpp"
#include "settings.hpp"

namespace dyad::trace {

namespace detail {
std::atomic<bool> g_on{false};
}

namespace {

constexpr const char* kSub = "trace";
constexpr size_t kFlushEvents = 32;  // buffered events written together
constexpr double kFlushAge = 0.1;    // seconds an event waits in the buffer at most
                                     // (checked when the next one comes)

using Clock = std::chrono::steady_clock;

int64_t os_tid() {
    return static_cast<int64_t>(::syscall(SYS_gettid));
}

// The process's one trace file. Never destroyed (events of static
// destructors still find it; closed at exit).
struct Writer {
    std::mutex mu;
    std::once_flag started;
    std::string dir, node, role;
    uint64_t max_bytes = 0;
    int fd = -1;
    bool reopen = false;  // a forked child opens its own file at its first event
    bool closed = false;
    std::string file;
    std::string buf;
    size_t buffered = 0;
    Clock::time_point oldest;
    uint64_t events = 0, dropped = 0, bytes = 0;
    bool warned_full = false;
    bool flush_outermost = false;  // a client: write when an outermost span ends
};

thread_local int t_open_spans = 0;  // spans open on this thread

Writer& writer() {
    static Writer* w = new Writer;
    return *w;
}

std::string program_name() {
    char comm[64] = {0};
    int fd = ::open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = ::read(fd, comm, sizeof comm - 1);
        ::close(fd);
        if (n > 0) {
            comm[n] = 0;
            if (comm[n - 1] == '\n') comm[n - 1] = 0;
        }
    }
    return comm[0] ? comm : "dyad";
}

// Every write of the file is of whole events.
bool write_all(int fd, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
        ssize_t n = ::write(fd, s.data() + off, s.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += static_cast<size_t>(n);
    }
    return true;
}

// Stops tracing after a failure (logged once, by the caller).
void give_up(Writer& w) {
    detail::g_on.store(false, std::memory_order_relaxed);
    w.closed = true;
    w.buf.clear();
    w.buffered = 0;
    if (w.fd >= 0) ::close(w.fd);
    w.fd = -1;
}

// Writes the buffer. Lock held.
void write_buffer(Writer& w) {
    if (w.buf.empty() || w.fd < 0) return;
    if (!write_all(w.fd, w.buf)) {
        int e = errno;
        DYAD_WARN(kSub, "cannot write the trace file %s (%s): tracing stops", w.file.c_str(),
                  std::strerror(e));
        give_up(w);
        return;
    }
    w.buf.clear();
    w.buffered = 0;
}

std::string metadata_event(const char* name, const std::string& value) {
    nlohmann::json j = {{"name", name},
                        {"ph", "M"},
                        {"pid", static_cast<int64_t>(::getpid())},
                        {"tid", os_tid()},
                        {"args", {{"name", value}}}};
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The directory DYAD_TRACE names, made if missing, opened without following
// a symbolic link (another user's link must not lead this process's trace
// into a directory of their choosing); -1 with a warning.
int open_trace_dir(const Writer& w) {
    const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int fd = ::open(w.dir.c_str(), flags);
    if (fd < 0 && errno == ENOENT) {
        std::error_code ec;
        std::filesystem::create_directories(w.dir, ec);
        fd = ::open(w.dir.c_str(), flags);
    }
    if (fd >= 0) return fd;
    const int e = errno;
    struct stat st {};
    if ((e == ELOOP || e == ENOTDIR) && ::lstat(w.dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
        DYAD_WARN(kSub,
                  "DYAD_TRACE=%s is a symbolic link: trace files are not written through links; "
                  "this process is not traced. Give the directory itself",
                  w.dir.c_str());
    else
        DYAD_WARN(kSub,
                  "DYAD_TRACE=%s: cannot create the trace file: the directory cannot be made "
                  "or opened (%s): this process is not traced. Give a directory this user can "
                  "write, or unset DYAD_TRACE",
                  w.dir.c_str(), std::strerror(e));
    return -1;
}

// Opens this process's file and writes its head. Lock held. False: tracing
// is off (warned).
bool open_file(Writer& w) {
    UniqueFd dir(open_trace_dir(w));
    if (!dir.valid()) {
        give_up(w);
        return false;
    }
    const std::string base = "dyad-" + w.node + "-" + std::to_string(::getpid());
    int fd = -1;
    std::string path;
    // Another node's process may have this pid (a pid namespace per node).
    for (int i = 1; i <= 16 && fd < 0; ++i) {
        const std::string name = base + (i == 1 ? "" : "." + std::to_string(i)) + ".json";
        path = w.dir + "/" + name;
        fd = ::openat(dir.get(), name.c_str(),
                      O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        int e = errno;
        DYAD_WARN(kSub,
                  "DYAD_TRACE=%s: cannot create the trace file %s (%s): this process is not "
                  "traced. Give a directory this user can write, or unset DYAD_TRACE",
                  w.dir.c_str(), path.c_str(), std::strerror(e));
        give_up(w);
        return false;
    }
    w.fd = fd;
    w.file = path;
    w.closed = false;
    w.reopen = false;
    w.events = w.dropped = w.bytes = 0;
    w.warned_full = false;
    std::string who = w.role.empty() ? program_name() : w.role;
    std::string head = "[\n" + metadata_event("process_name", who + " (" + w.node + ")");
    if (!write_all(fd, head)) {
        int e = errno;
        DYAD_WARN(kSub, "cannot write the trace file %s (%s): this process is not traced",
                  path.c_str(), std::strerror(e));
        give_up(w);
        return false;
    }
    return true;
}

// The last event and the closing bracket. Lock held.
void close_file(Writer& w) {
    if (w.closed || w.fd < 0) return;
    nlohmann::json end = {
        {"name", "trace_end"}, {"cat", "dyad"},
        {"ph", "i"},           {"s", "p"},
        {"ts", now_us()},      {"pid", static_cast<int64_t>(::getpid())},
        {"tid", os_tid()},     {"args", {{"events", w.events}, {"dropped", w.dropped}}}};
    w.buf += ",\n" + end.dump() + "\n]\n";
    write_buffer(w);
    if (w.dropped)
        DYAD_WARN(kSub, "trace %s: %llu events dropped over DYAD_TRACE_MAX_SIZE (%llu bytes)",
                  w.file.c_str(), static_cast<unsigned long long>(w.dropped),
                  static_cast<unsigned long long>(w.max_bytes));
    if (w.fd >= 0) ::close(w.fd);
    w.fd = -1;
    w.closed = true;
    detail::g_on.store(false, std::memory_order_relaxed);
}

void at_exit() {
    Writer& w = writer();
    std::lock_guard<std::mutex> lk(w.mu);
    close_file(w);
}

// fork: the parent writes what it buffered first (the child would write it
// again); the child keeps nothing of the parent's file and opens its own
// at its first event.
void before_fork() {
    Writer& w = writer();
    w.mu.lock();
    write_buffer(w);
}
void after_fork_parent() {
    writer().mu.unlock();
}
void after_fork_child() {
    Writer& w = writer();
    if (w.fd >= 0) ::close(w.fd);
    w.fd = -1;
    w.buf.clear();
    w.buffered = 0;
    w.reopen = !w.closed;
    w.mu.unlock();
}

void emit(std::string event, bool outermost) {
    Writer& w = writer();
    std::lock_guard<std::mutex> lk(w.mu);
    if (w.closed) return;
    if (w.reopen && !open_file(w)) return;
    if (w.bytes + event.size() + 2 > w.max_bytes) {
        if (w.dropped++ == 0 && !w.warned_full) {
            w.warned_full = true;
            DYAD_WARN(kSub,
                      "trace file %s reached DYAD_TRACE_MAX_SIZE (%llu bytes): later events are "
                      "dropped (counted in its last event, trace_end)",
                      w.file.c_str(), static_cast<unsigned long long>(w.max_bytes));
        }
        return;
    }
    auto now = Clock::now();
    if (w.buffered == 0) w.oldest = now;
    w.buf += ",\n";
    w.buf += event;
    w.bytes += event.size() + 2;
    w.events++;
    w.buffered++;
    if (w.buffered >= kFlushEvents || (outermost && w.flush_outermost) ||
        std::chrono::duration<double>(now - w.oldest).count() >= kFlushAge)
        write_buffer(w);
}

std::string event_text(const char* name, const char* cat, int64_t ts_us, double dur_us,
                       const nlohmann::json& args) {
    char head[320];
    std::snprintf(head, sizeof head,
                  "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%lld,\"dur\":%.3f,"
                  "\"pid\":%d,\"tid\":%lld,\"args\":",
                  name, cat, static_cast<long long>(ts_us), dur_us < 0 ? 0.0 : dur_us,
                  static_cast<int>(::getpid()), static_cast<long long>(os_tid()));
    // Paths are bytes: what is not UTF-8 is replaced, never thrown.
    return head +
           (args.is_object() ? args : nlohmann::json::object())
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
           "}";
}

}  // namespace

int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

void start_from_settings(const std::string& role) {
    Writer& w = writer();
    std::call_once(w.started, [&] {
        std::string dir = settings::text("DYAD_TRACE");
        if (dir.empty()) return;
        auto cap = settings::size("DYAD_TRACE_MAX_SIZE");
        if (!cap) {
            DYAD_WARN(kSub, "%s: this process is not traced", cap.status().message().c_str());
            return;
        }
        std::string node = settings::text("DYAD_NODE_ID");
        if (node.empty()) {
            char host[256] = {0};
            if (::gethostname(host, sizeof host - 1) == 0) node = host;
        }
        // A file name part: no separators.
        for (char& c : node)
            if (c == '/' || c == '\0') c = '_';
        std::lock_guard<std::mutex> lk(w.mu);
        w.dir = dir;
        w.node = node.empty() ? "node" : node;
        w.role = role;
        w.flush_outermost = role.empty();
        w.max_bytes = cap.value();
        if (!open_file(w)) return;
        std::atexit(at_exit);
        pthread_atfork(before_fork, after_fork_parent, after_fork_child);
        detail::g_on.store(true, std::memory_order_relaxed);
        DYAD_DEBUG(kSub, "tracing to %s", w.file.c_str());
    });
}

void flush() {
    Writer& w = writer();
    std::lock_guard<std::mutex> lk(w.mu);
    write_buffer(w);
}

Stats stats() {
    Writer& w = writer();
    std::lock_guard<std::mutex> lk(w.mu);
    return Stats{w.closed ? "" : w.file, w.events, w.dropped, w.bytes, w.max_bytes};
}

nlohmann::json stats_json() {
    Stats s = stats();
    return {{"file", s.file},
            {"events", s.events},
            {"dropped", s.dropped},
            {"bytes", s.bytes},
            {"max_bytes", s.max_bytes}};
}

void complete(const char* name, const char* cat, int64_t ts_us, double dur_us,
              const nlohmann::json& args) {
    if (!on()) return;
    try {
        emit(event_text(name, cat, ts_us, dur_us, args), false);
    } catch (...) {  // no memory for the event: it is not written
    }
}

void Span::begin() {
    outermost_ = t_open_spans++ == 0;
    ts_us_ = now_us();
    t0_ = Clock::now();
}

void Span::end() {
    double dur = std::chrono::duration<double, std::micro>(Clock::now() - t0_).count();
    --t_open_spans;
    if (!on()) return;
    try {
        emit(event_text(name_, cat_, ts_us_, dur, args_), outermost_);
    } catch (...) {  // no memory for the event: it is not written
    }
}

}  // namespace dyad::trace
