// SPDX-License-Identifier: Apache-2.0
// The logging backend, over spdlog (header-only, with fmt header-only: see
// docs/design.md, "Logging"). Only this file includes spdlog: its code is
// compiled into libdyad.so here and stays local to it (src/libdyad.map), so a
// host program with its own spdlog or fmt, of any version, neither binds to
// ours nor shares our loggers. We never use spdlog's global registry or its
// default logger: a host's spdlog::set_level or set_pattern cannot touch DYAD's
// lines, and ours cannot touch the host's.
#include "log.hpp"

#include <strings.h>

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
    std::lock_guard<std::mutex> lk(b.mu);
    (errors ? b.error : b.info) = std::move(l);
    return true;
}

}  // namespace

Level level() {
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

bool set_info_file(const std::string& path) {
    return open_into(false, path);
}
bool set_error_file(const std::string& path) {
    return open_into(true, path);
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
    Backend& b = backend();
    std::shared_ptr<spdlog::logger> out;
    {
        std::lock_guard<std::mutex> lk(b.mu);
        out = l >= Level::warn ? b.error : b.info;
    }
    out->log(to_spdlog(l), spdlog::string_view_t(line.data(), line.size()));
}

}  // namespace dyad::log
