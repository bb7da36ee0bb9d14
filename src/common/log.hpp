// SPDX-License-Identifier: Apache-2.0
// One logging facade: named subsystems, a level chosen by DYAD_LOG_LEVEL (or
// DYAD_SYNC_DEBUG), output to stderr or a file. A library never writes to
// stdout. Hot-path callers use DYAD_LOG_EVERY to rate-limit.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <string>

namespace dyad::log {

enum class Level { trace = 0, debug, info, warn, error, off };

Level level();
void set_level(Level l);
bool parse_level(const std::string& s, Level* out);
const char* level_name(Level l);
// Redirects output (per level class) to files; nullptr/"" keeps stderr.
bool set_info_file(const std::string& path);
bool set_error_file(const std::string& path);

// For a long-running program (dyadd): a fatal signal (SIGSEGV, SIGBUS,
// SIGILL, SIGFPE, SIGABRT) writes one error line in the log's format to the
// error log (file or stderr) with the signal, then a backtrace, then the
// default action runs (core dump as the system configures it). Only
// async-signal-safe calls in the handler. Call after the libraries that
// install handlers of their own have been initialised.
void install_crash_handler();

void write(Level l, const char* subsys, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

// The log of the code that loaded a plugin (src/dtl/plugin.h). A plugin
// links the layers it uses into itself, so a process may hold two copies of
// this log: the plugin's writes through the loader's, at the loader's level
// and into its files (dyadd --info-log, --error-log).
struct Host {
    Level (*level)();
    void (*write)(Level l, const char* subsys, const char* text);
};
// This copy's own level and output, to hand to a plugin.
const Host& host();
// From now on, this copy's level and lines are `h`'s (`h` outlives it).
void use_host(const Host* h);

inline bool enabled(Level l) {
    return l >= level();
}

}  // namespace dyad::log

#define DYAD_LOG(lvl, subsys, ...)                                            \
    do {                                                                      \
        if (::dyad::log::enabled(::dyad::log::Level::lvl))                    \
            ::dyad::log::write(::dyad::log::Level::lvl, subsys, __VA_ARGS__); \
    } while (0)

#define DYAD_TRACE(s, ...) DYAD_LOG(trace, s, __VA_ARGS__)
#define DYAD_DEBUG(s, ...) DYAD_LOG(debug, s, __VA_ARGS__)
#define DYAD_INFO(s, ...) DYAD_LOG(info, s, __VA_ARGS__)
#define DYAD_WARN(s, ...) DYAD_LOG(warn, s, __VA_ARGS__)
#define DYAD_ERROR(s, ...) DYAD_LOG(error, s, __VA_ARGS__)
