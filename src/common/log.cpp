// SPDX-License-Identifier: Apache-2.0
// The logging backend, over spdlog (header-only, with fmt header-only: see
// docs/design.md, "Logging"). Only this file includes spdlog: its code is
// compiled into libdyad.so here and stays local to it (src/libdyad.map), so a
// host program with its own spdlog or fmt, of any version, neither binds to
// ours nor shares our loggers. We never use spdlog's global registry or its
// default logger: a host's spdlog::set_level or set_pattern cannot touch DYAD's
// lines, and ours cannot touch the host's.
#include "log.hpp"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace dyad::log {
namespace {

std::atomic<Level> g_level{Level::warn};
// Where the crash handler writes: the error log file, or stderr.
std::atomic<int> g_crash_fd{2};
long g_utc_offset_s = 0;  // local time's, taken when the handler is installed

// One line: "12:34:56.123456 dyad[PID] LEVEL SUBSYS: MESSAGE", local time, as
// the hand-written backend wrote it (scripts and tests read it). The level
// and subsystem are part of the message: spdlog's own level names differ
// ("warning", "critical").
constexpr const char* kPattern = "%H:%M:%S.%f dyad[%P] %v";

std::shared_ptr<spdlog::logger> make_logger(spdlog::sink_ptr sink) {
    auto l = std::make_shared<spdlog::logger>("dyad", std::move(sink));
    l->set_pattern(kPattern, spdlog::pattern_time_type::local);
    l->set_level(spdlog::level::trace);  // filtered before formatting (enabled())
    l->flush_on(spdlog::level::trace);   // every line reaches the file at once
    return l;
}

// Lines below warn go to `info`, the others to `error`; both write to stderr
// until dyadd's -i / -e give them a file. Swapped under `mu`; a writer takes
// its own reference, so a swap never frees a logger in use.
struct Backend {
    std::mutex mu;
    spdlog::sink_ptr stderr_sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    std::shared_ptr<spdlog::logger> info = make_logger(stderr_sink);
    std::shared_ptr<spdlog::logger> error = make_logger(stderr_sink);
};

// Never destroyed: lines logged from static destructors and atexit handlers
// (of the library or of the host program) still have somewhere to go.
Backend& backend() {
    static Backend* b = new Backend();
    return *b;
}

spdlog::level::level_enum to_spdlog(Level l) {
    switch (l) {
        case Level::trace:
            return spdlog::level::trace;
        case Level::debug:
            return spdlog::level::debug;
        case Level::info:
            return spdlog::level::info;
        case Level::warn:
            return spdlog::level::warn;
        case Level::error:
            return spdlog::level::err;
        case Level::off:
            break;
    }
    return spdlog::level::off;
}

bool open_into(bool errors, const std::string& path) {
    Backend& b = backend();
    spdlog::sink_ptr sink = b.stderr_sink;
    if (!path.empty()) {
        try {
            // Appends (truncate=false); the descriptor is close-on-exec
            // (SPDLOG_PREVENT_CHILD_FD, set for this file by CMake).
            sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, false);
        } catch (const spdlog::spdlog_ex&) {
            return false;
        }
    }
    auto l = make_logger(std::move(sink));
    if (errors) {
        int fd = path.empty() ? 2 : ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
        int old = g_crash_fd.exchange(fd < 0 ? 2 : fd);
        if (old > 2) ::close(old);
    }
    std::lock_guard<std::mutex> lk(b.mu);
    (errors ? b.error : b.info) = std::move(l);
    return true;
}

// Appends the decimal digits of v (zero-padded to `width`) at *p.
void put_num(char** p, char* end, unsigned long v, int width) {
    char d[24];
    int n = 0;
    do {
        d[n++] = static_cast<char>('0' + v % 10);
        v /= 10;
    } while (v && n < 24);
    while (n < width && n < 24) d[n++] = '0';
    while (n > 0 && *p < end) *(*p)++ = d[--n];
}
void put_str(char** p, char* end, const char* s) {
    while (*s && *p < end) *(*p)++ = *s++;
}

void on_crash(int sig) {
    int fd = g_crash_fd.load();
    char line[256];
    char* p = line;
    char* end = line + sizeof line - 1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long day = (static_cast<long>(ts.tv_sec) + g_utc_offset_s) % 86400;
    if (day < 0) day += 86400;
    put_num(&p, end, static_cast<unsigned long>(day / 3600), 2);
    put_str(&p, end, ":");
    put_num(&p, end, static_cast<unsigned long>(day / 60 % 60), 2);
    put_str(&p, end, ":");
    put_num(&p, end, static_cast<unsigned long>(day % 60), 2);
    put_str(&p, end, ".");
    put_num(&p, end, static_cast<unsigned long>(ts.tv_nsec / 1000), 6);
    put_str(&p, end, " dyad[");
    put_num(&p, end, static_cast<unsigned long>(::getpid()), 0);
    put_str(&p, end, "] error crash: fatal signal ");
    put_num(&p, end, static_cast<unsigned long>(sig), 0);
    put_str(&p, end,
            sig == SIGSEGV   ? " (SIGSEGV)"
            : sig == SIGBUS  ? " (SIGBUS)"
            : sig == SIGILL  ? " (SIGILL)"
            : sig == SIGFPE  ? " (SIGFPE)"
            : sig == SIGABRT ? " (SIGABRT)"
                             : "");
    put_str(&p, end,
            "; backtrace follows; please report it with this log "
            "(docs/user-guide.md, Troubleshooting)\n");
    ssize_t ignored = ::write(fd, line, static_cast<size_t>(p - line));
    void* frames[64];
    int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, fd);
    (void)ignored;
    signal(sig, SIG_DFL);
    raise(sig);
}

}  // namespace

namespace {
std::atomic<const Host*> g_host{nullptr};  // use_host()
}  // namespace

Level level() {
    if (const Host* h = g_host.load(std::memory_order_acquire)) return h->level();
    return g_level.load(std::memory_order_relaxed);
}
void set_level(Level l) {
    g_level.store(l, std::memory_order_relaxed);
}

bool parse_level(const std::string& s, Level* out) {
    static const struct {
        const char* n;
        Level l;
    } names[] = {{"trace", Level::trace}, {"debug", Level::debug},  {"info", Level::info},
                 {"warn", Level::warn},   {"warning", Level::warn}, {"error", Level::error},
                 {"off", Level::off},     {"none", Level::off}};
    for (const auto& n : names) {
        if (strcasecmp(s.c_str(), n.n) == 0) {
            *out = n.l;
            return true;
        }
    }
    return false;
}

const char* level_name(Level l) {
    switch (l) {
        case Level::trace:
            return "trace";
        case Level::debug:
            return "debug";
        case Level::info:
            return "info";
        case Level::warn:
            return "warn";
        case Level::error:
            return "error";
        case Level::off:
            return "off";
    }
    return "?";
}

void install_crash_handler() {
    time_t now = ::time(nullptr);
    struct tm lt;
    if (localtime_r(&now, &lt)) g_utc_offset_s = lt.tm_gmtoff;
    // backtrace() loads libgcc on first use: not in the handler.
    void* warm[1];
    backtrace(warm, 1);
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_crash;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) sigaction(sig, &sa, nullptr);
}

bool set_info_file(const std::string& path) {
    return open_into(false, path);
}
bool set_error_file(const std::string& path) {
    return open_into(true, path);
}

namespace {
Level own_level() {
    return g_level.load(std::memory_order_relaxed);
}
void write_text(Level l, const char* subsys, const char* text) {
    write(l, subsys, "%s", text);
}
}  // namespace

const Host& host() {
    static const Host h{own_level, write_text};
    return h;
}

void use_host(const Host* h) {
    if (h != &host()) g_host.store(h, std::memory_order_release);
}

void write(Level l, const char* subsys, const char* fmt, ...) {
    if (l >= Level::off) return;
    // "LEVEL SUBSYS: " then the message, formatted once (printf rules).
    char stack[2048];
    int head = std::snprintf(stack, sizeof stack, "%s %s: ", level_name(l), subsys);
    if (head < 0) return;
    size_t h = std::min(static_cast<size_t>(head), sizeof stack - 1);
    va_list ap;
    va_start(ap, fmt);
    va_list again;
    va_copy(again, ap);
    int n = std::vsnprintf(stack + h, sizeof stack - h, fmt, ap);
    va_end(ap);
    std::string_view line;
    std::vector<char> big;
    if (n < 0) {
        line = std::string_view(stack, h);
    } else if (static_cast<size_t>(n) < sizeof stack - h) {
        line = std::string_view(stack, h + static_cast<size_t>(n));
    } else {
        // Longer than the stack buffer: one allocation, capped at 64 KiB.
        size_t len = std::min<size_t>(static_cast<size_t>(n), 64u << 10);
        big.resize(h + len + 1);
        std::memcpy(big.data(), stack, h);
        std::vsnprintf(big.data() + h, len + 1, fmt, again);
        line = std::string_view(big.data(), h + len);
    }
    va_end(again);
    if (const Host* fwd = g_host.load(std::memory_order_acquire)) {
        // The loader's log writes the level and subsystem itself.
        std::string text(line.substr(std::min(h, line.size())));
        fwd->write(l, subsys, text.c_str());
        return;
    }
    Backend& b = backend();
    std::shared_ptr<spdlog::logger> out;
    {
        std::lock_guard<std::mutex> lk(b.mu);
        out = l >= Level::warn ? b.error : b.info;
    }
    out->log(to_spdlog(l), spdlog::string_view_t(line.data(), line.size()));
}

}  // namespace dyad::log
