// SPDX-License-Identifier: Apache-2.0
// What the dyad tool's subcommands share: how a failure is reported (text,
// --json, exit code), durations and sizes as people write them, the
// progress line, and the line of a consumed file.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include <cctype>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <dyad/dyad_version.h>

#include "client/client.hpp"
#include "capi/intercept.hpp"
#include "common/auth.hpp"
#include "common/config.hpp"
#include "common/settings.hpp"
#include "common/keygen.hpp"
#include "doctor.hpp"
#include "dtl/dtl.hpp"
#include "common/json_text.hpp"
#include "job/job.hpp"
#include "cli_common.hpp"
#include "common/seconds.hpp"

using dyad::kBadUtf8Replaced;

namespace dyad::tool {

std::string g_command = "dyad";
bool g_debug = false;
// --json: every error is also a JSON object on stdout (one line).
bool g_json = false;

std::string lower(std::string t) {
    for (auto& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return t;
}

// Does the message already say what its errno would? (The errno of a
// timeout is ETIMEDOUT, of a path outside the managed directories EINVAL...:
// appending "Connection timed out" to "not produced within 2 s" misleads.)
bool errno_said(const dyad::Status& s) {
    int e = s.err();
    if (e == 0) return true;
    if (lower(s.message()).find(lower(std::strerror(e))) != std::string::npos) return true;
    switch (s.rc()) {
        case DYAD_RC_TIMEOUT:
            return e == ETIMEDOUT;
        case DYAD_RC_NOTFOUND:
            return e == ENOENT;
        case DYAD_RC_NOCTX:
        case DYAD_RC_BADMANAGEDPATH:
        case DYAD_RC_UNTRACKED:
        case DYAD_RC_BADDTLMODE:
        case DYAD_RC_BAD_CLI_PARSE:
            return e == EINVAL;
        case DYAD_RC_BADMETADATA:
        case DYAD_RC_BADRPC:
        case DYAD_RC_BADPACK:
        case DYAD_RC_BADUNPACK:
            return e == EPROTO || e == EINVAL;
        case DYAD_RC_CONNFAIL:
            // Not a DYAD service, or its metadata store is down
            // (kvs/outage.hpp): the message says how.
            return e == EPROTO || (e == EHOSTUNREACH &&
                                   s.message().find(" is unreachable since ") != std::string::npos);
        case DYAD_RC_NOAUTH:
            return e == EACCES || e == EPERM;
        case DYAD_RC_BADFETCH:
            return e == ESTALE;
        case DYAD_RC_BADCHECKSUM:
            return true;
        case DYAD_RC_BADFIO:
            return e == EBUSY;  // still open for writing: the message says so
        default:
            return false;
    }
}

// What to do, for the errors whose message does not say it already.
std::string advice(const dyad::Status& s) {
    switch (s.rc()) {
        case DYAD_RC_NOCTX:
            if (s.message().rfind("--", 0) == 0) return "";  // an option: its own message
            return "fix or unset it ('dyad config' shows every setting and where its value "
                   "comes from)";
        default:
            return "";
    }
}

// The exit code of a failure, and the text that says it.
int exit_code_of(const dyad::Status& s) {
    return dyad::rc_exit_code(s.rc());
}

// With --json: the failure as one object on stdout, beside the success
// lines (same "file" field): {"error", "exit", "file", "ok": false, "rc"}.
void json_error(const dyad::Status& s, const std::string& file, const std::string& msg, int code) {
    nlohmann::json j = {{"ok", false},
                        {"error", msg},
                        {"exit", code},
                        {"rc", dyad::rc_name(s.rc())},
                        {"command", g_command}};
    if (!file.empty()) j["file"] = file;
    std::cout << j.dump(-1, ' ', false, kBadUtf8Replaced) << "\n";
    std::cout.flush();
}

// Prints "dyad SUBCOMMAND [FILE]: what happened[: errno text][: what to do]"
// on stderr (and, with --json, the same as an object on stdout) and returns
// the exit code of the failure. `code`: an exit code other than the
// status's (a configuration error met while connecting: 1).
int report(const dyad::Status& s, const std::string& file, const std::string& extra, int code) {
    std::string msg = s.message();
    if (!errno_said(s)) msg += std::string(": ") + std::strerror(s.err());
    std::string what = extra.empty() ? advice(s) : extra;
    if (!what.empty()) msg += ": " + what;
    if (code < 0) code = exit_code_of(s);
    if (g_json) json_error(s, file, msg, code);
    // The code's name is for whoever debugs the library, not the cause.
    if (g_debug) msg += std::string(" [") + dyad::rc_name(s.rc()) + "]";
    std::fprintf(stderr, "%s%s%s: %s\n", g_command.c_str(), file.empty() ? "" : " ", file.c_str(),
                 msg.c_str());
    return code;
}

// "30", "2.5", "90s", "10m", "1h": seconds. False if it is none of these.
bool parse_duration(const std::string& text, double* seconds) {
    if (text.empty()) return false;
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || errno != 0 || !(v >= 0)) return false;
    std::string unit = lower(end);
    double scale = 0;
    if (unit.empty() || unit == "s" || unit == "sec")
        scale = 1;
    else if (unit == "m" || unit == "min")
        scale = 60;
    else if (unit == "h")
        scale = 3600;
    else
        return false;
    *seconds = v * scale;
    return true;
}

std::string human_bytes(double b) {
    const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        ++i;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, i ? "%.1f %s" : "%.0f %s", b, u[i]);
    return buf;
}

std::string human_seconds(double s) {
    return seconds_human(s);
}

// "0644"
std::string octal_mode(uint64_t mode) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%04llo", static_cast<unsigned long long>(mode & 07777));
    return buf;
}

// ISO 8601 in the local time zone, to the nanosecond:
// 2024-05-02T14:03:07.123456789+02:00.
std::string iso_time(int64_t ns) {
    time_t sec = static_cast<time_t>(ns / 1000000000LL);
    long frac = static_cast<long>(ns % 1000000000LL);
    if (frac < 0) {
        frac += 1000000000L;
        --sec;
    }
    struct tm tm;
    if (!localtime_r(&sec, &tm)) return std::to_string(ns) + " ns";
    char date[64], zone[16];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", &tm);
    std::strftime(zone, sizeof zone, "%z", &tm);  // +0200
    std::string z(zone);
    if (z.size() == 5) z.insert(3, ":");
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s.%09ld%s", date, frac, z.c_str());
    return buf;
}

// Errors that every remaining file would meet too (the node's service,
// never reached, cannot be): the command stops at the first.
bool service_failure(dyad::client::Client& c, const dyad::Status& s) {
    return (s.rc() == DYAD_RC_CONNFAIL || s.rc() == DYAD_RC_NOAUTH) && !c.reached_service();
}

int not_attempted(size_t left) {
    if (left)
        std::fprintf(stderr, "%s: %zu more file%s not attempted\n", g_command.c_str(), left,
                     left == 1 ? "" : "s");
    return 0;
}

// Prints the line of one consumed file (--json: its object), or its error
// on stderr; returns the file's exit code. cli_timeout: the wait limit came
// from --timeout, not from the environment.
// Lines of consumed files go out at once to a terminal and for `dyad sync`
// (a pipe reader waits for them); for `dyad consume` of many files into a
// pipe or file, at most every 0.1 s (one write per line costs as much as a
// small file's transfer) and at exit.
bool g_flush_each_line = true;

void flush_lines() {
    using clock = std::chrono::steady_clock;
    static const bool tty = ::isatty(STDOUT_FILENO) == 1;
    static clock::time_point last = clock::now();
    const auto now = clock::now();
    if (!g_flush_each_line && !tty && now - last < std::chrono::milliseconds(100)) return;
    std::fflush(stdout);
    last = now;
}

int print_consumed(const std::string& f, dyad::Status s, const dyad::client::ConsumeReport& r,
                   bool json, bool explain, bool cli_timeout) {
    if (!s) {
        // The limit came from --timeout: the message names it, not the
        // variable that was overridden.
        std::string m = s.message();
        size_t at = m.find(" (DYAD_WAIT_TIMEOUT)");
        if (cli_timeout && at != std::string::npos) {
            if (s.rc() == DYAD_RC_TIMEOUT)
                m = m.substr(0, at) +
                    " (--timeout): produce it first, or wait longer (--timeout SECONDS)";
            else
                m.replace(at, std::strlen(" (DYAD_WAIT_TIMEOUT)"), " (--timeout)");
            s = dyad::Status(s.rc(), m, s.err());
        }
        return report(s, f);
    }
    if (json) {
        // AUTO's selection is one shared object for every file of the same
        // owner and size class: dumped once, not copied and dumped per file
        // (3000 x 4 KiB with --json: consumer CPU per file 0.058-0.075 ms ->
        // 0.046-0.056, 3 rounds each). The cache holds the object, so its
        // address cannot be reused meanwhile.
        static std::shared_ptr<const nlohmann::json> dumped_sel;
        static std::string sel_text = "null";
        if (r.selection != dumped_sel) {
            dumped_sel = r.selection;
            sel_text = r.selection ? r.selection->dump(-1, ' ', false, kBadUtf8Replaced) : "null";
        }
        // Written field by field in the order a JSON object of them would
        // dump (sorted keys), each value by nlohmann: building the object
        // took a map and eight allocations per line (10,000 x 4 KiB with
        // --json: ~1 us of the consumer's ~40 us per file).
        auto text = [](const auto& v) {
            return nlohmann::json(v).dump(-1, ' ', false, kBadUtf8Replaced);
        };
        std::string line = "{\"action\":";
        line += text(r.action);
        line += ",\"bytes\":";
        line += std::to_string(r.bytes);
        line += ",\"endpoint\":";
        line += text(r.endpoint);
        line += ",\"file\":";
        line += text(f);
        line += ",\"ok\":true";
        line += ",\"transfer_s\":";
        line += text(r.transfer_s);
        line += ",\"transport\":";
        line += text(r.transport);
        line += ",\"wait_s\":";
        line += text(r.wait_s);
        line += ",\"selection\":";
        line += sel_text;
        line += "}\n";
        std::cout << line;
        flush_lines();
        return 0;
    }
    std::printf("%s: %s", f.c_str(), r.action.c_str());
    if (r.action == "fetched")
        std::printf(" %s via %s from %s", human_bytes(static_cast<double>(r.bytes)).c_str(),
                    r.transport.c_str(), r.endpoint.c_str());
    std::printf(" (waited %.3f s, transfer %.3f s)\n", r.wait_s, r.transfer_s);
    if (explain)
        std::printf("  %s\n", r.explain.empty() ? (r.action == "fetched"
                                                       ? "fixed transport (DYAD_DTL_MODE)"
                                                       : "nothing moved: the file was already here")
                                                : r.explain.c_str());
    flush_lines();
    return 0;
}

}  // namespace dyad::tool
