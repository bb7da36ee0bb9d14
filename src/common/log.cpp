#include "log.hpp"

#include <atomic>
#include <chrono>
#include <ctime>
#include <mutex>
#include <strings.h>
#include <unistd.h>

namespace dyad::log {
namespace {
std::atomic<Level> g_level{Level::warn};
std::mutex g_mu;
FILE* g_info = nullptr;   // null: stderr
FILE* g_error = nullptr;  // null: stderr
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

static bool open_into(FILE** slot, const std::string& path) {
    FILE* f = nullptr;
    if (!path.empty()) {
        f = std::fopen(path.c_str(), "ae");
        if (!f) return false;
        setvbuf(f, nullptr, _IOLBF, 0);
    }
    std::lock_guard<std::mutex> lk(g_mu);
    if (*slot) std::fclose(*slot);
    *slot = f;
    return true;
}

bool set_info_file(const std::string& path) {
    return open_into(&g_info, path);
}
bool set_error_file(const std::string& path) {
    return open_into(&g_error, path);
}

void write(Level l, const char* subsys, const char* fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    auto now = std::chrono::system_clock::now();
    auto t = std::chrono::system_clock::to_time_t(now);
    auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
        1000000;
    struct tm tm;
    localtime_r(&t, &tm);
    char ts[32];
    std::strftime(ts, sizeof ts, "%H:%M:%S", &tm);
    std::lock_guard<std::mutex> lk(g_mu);
    FILE* out = (l >= Level::warn) ? (g_error ? g_error : stderr) : (g_info ? g_info : stderr);
    std::fprintf(out, "%s.%06ld dyad[%d] %s %s: %s\n", ts, static_cast<long>(us), getpid(),
                 level_name(l), subsys, msg);
}

}  // namespace dyad::log
