// SPDX-License-Identifier: Apache-2.0
// dyad: command-line tool for DYAD (produce, consume, stat, ls, config,
// keygen, service status).
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
#include "client/intercept.hpp"
#include "common/auth.hpp"
#include "common/config.hpp"
#include "common/settings.hpp"
#include "common/keygen.hpp"
#include "doctor.hpp"
#include "dtl/dtl.hpp"
#include "common/json_text.hpp"
#include "job/job.hpp"
#include "rm.hpp"

using dyad::kBadUtf8Replaced;

namespace {

constexpr const char* kExitCodes =
    "Exit codes:\n"
    "  0  success\n"
    "  1  usage or configuration error (bad option, bad DYAD_* variable)\n"
    "  2  file problem: not produced, not under a managed directory, missing or unreadable\n"
    "  3  timeout: the file was not produced within --timeout / DYAD_WAIT_TIMEOUT\n"
    "  4  the DYAD service, its metadata store or the owner's service could not be reached\n"
    "     (or is not a DYAD service, or refused this client's key)\n"
    "  5  transfer failed or the received file did not match its checksum\n"
    "  6  other error\n";

// "dyad consume", "dyad service status": the prefix of every error line.
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
            return e == EPROTO;  // not a DYAD service: the message says how
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
int report(const dyad::Status& s, const std::string& file = "", const std::string& extra = "",
           int code = -1) {
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
    char buf[32];
    if (s < 1)
        return "<1 s";
    else if (s < 100)
        std::snprintf(buf, sizeof buf, "%.0f s", s);
    else if (s < 3600)
        std::snprintf(buf, sizeof buf, "%d min %02d s", static_cast<int>(s) / 60,
                      static_cast<int>(s) % 60);
    else
        std::snprintf(buf, sizeof buf, "%d h %02d min", static_cast<int>(s) / 3600,
                      static_cast<int>(s) % 3600 / 60);
    return buf;
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

// The progress line of `dyad consume` on stderr: bytes, rate, ETA. Shown
// on a terminal for files over 64 MiB or transfers past 1 s; --progress
// shows it always (one line per update when stderr is not a terminal),
// --no-progress never.
class Progress {
  public:
    enum class Mode { automatic, on, off };
    Progress(Mode mode) : mode_(mode), tty_(::isatty(STDERR_FILENO) == 1) {}

    bool wanted() const { return mode_ == Mode::on || (mode_ == Mode::automatic && tty_); }

    void start(const std::string& name) {
        name_ = name;
        shown_ = false;
    }
    void update(const dyad::client::TransferProgress& p) {
        if (!wanted()) return;
        if (mode_ == Mode::automatic && p.total <= (64ull << 20) && p.elapsed_s < 1.0) return;
        print(p.bytes, p.total, p.elapsed_s, false);
    }
    // After the file: its last line (if any was shown), then a new line.
    void finish(uint64_t bytes, uint64_t total, double elapsed_s, bool ok) {
        if (!shown_) return;
        if (ok)
            print(bytes, total, elapsed_s, true);
        else if (tty_)
            std::fputc('\n', stderr);
        shown_ = false;
    }

  private:
    void print(uint64_t bytes, uint64_t total, double elapsed, bool done) {
        double rate = elapsed > 0 ? static_cast<double>(bytes) / elapsed : 0;
        std::string line = g_command + " " + name_ + ": " +
                           human_bytes(static_cast<double>(bytes)) + " of " +
                           human_bytes(static_cast<double>(total));
        char pct[16];
        std::snprintf(
            pct, sizeof pct, " (%.0f%%)",
            total ? 100.0 * static_cast<double>(bytes) / static_cast<double>(total) : 100.0);
        line += pct;
        if (rate > 0) line += ", " + human_bytes(rate) + "/s";
        if (done)
            line += ", done in " + human_seconds(elapsed);
        else if (rate > 0 && total > bytes)
            line += ", ETA " + human_seconds(static_cast<double>(total - bytes) / rate);
        if (tty_)
            std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), done ? "\n" : "");
        else
            std::fprintf(stderr, "%s\n", line.c_str());
        std::fflush(stderr);
        shown_ = true;
    }

    Mode mode_;
    bool tty_;
    bool shown_ = false;
    std::string name_;
};

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

// What the command line said (the options of every subcommand).
struct Cli {
    bool json = false, explain = false, progress_on = false, progress_off = false;
    bool follow = false, markdown = false, recursive = false;
    std::vector<std::string> files;
    double timeout = -1;  // --timeout; negative: not given
    double status_wait = -1;  // service status --wait; negative: not given
    unsigned window = 0;
    uint64_t sync_count = 0;
    std::string status_wait_text;  // service status --wait [DURATION]: "" if given alone
    std::string sync_prefix, stat_file, ls_prefix, key_path, keygen_path, uri;
};

// The subcommands, as parsed.
struct Commands {
    CLI::App *produce, *consume, *sync, *stat, *ls, *config, *key, *keygen, *status, *doctor, *rm;
    CLI::Option* status_wait = nullptr;
    dyad::job::Commands job;
};

// The arguments CLI11 parses: --json is taken anywhere on the command line
// (before or after the subcommand) and removed here (it is declared on the
// app for --help); `dyad start|stop` become `dyad job start|stop`.
std::vector<char*> arguments(int argc, char** argv, bool* json) {
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
        if (i > 0 && std::strcmp(argv[i], "--") == 0) {
            for (; i < argc; ++i) args.push_back(argv[i]);
            break;
        }
        if (i > 0 && std::strcmp(argv[i], "--json") == 0) {
            *json = true;
            continue;
        }
        // `dyad start` / `dyad stop`: upstream DYAD's names of `dyad job start|stop`.
        if (args.size() == 1 &&
            (std::strcmp(argv[i], "start") == 0 || std::strcmp(argv[i], "stop") == 0))
            args.push_back(const_cast<char*>("job"));
        args.push_back(argv[i]);
    }
    return args;
}

// --timeout DURATION: seconds ("30", "2.5") or a number with a unit s, m or
// h ("90s", "10m", "1h").
void add_timeout_option(CLI::App* app, double& to, const std::string& help) {
    app->add_option_function<std::string>(
           "--timeout",
           [&to](const std::string& v) {
               if (!parse_duration(v, &to))
                   throw CLI::ValidationError(
                       "--timeout", "'" + v +
                                        "' is not a duration: give seconds (30, 2.5) or a "
                                        "number with a unit s, m or h (90s, 10m, 1h)");
           },
           help)
        ->type_name("DURATION");
}

// produce, consume, sync.
void add_file_commands(CLI::App& app, Cli& o, Commands& c) {
    c.produce = app.add_subcommand("produce", "publish files of DYAD_PATH_PRODUCER");
    c.produce->add_option("FILE", o.files, "files to publish")->required();
    c.produce->add_flag("-r,--recursive", o.recursive,
                        "a directory: publish every regular file under it (not DYAD's own .dyad/ "
                        "nor the temporaries of rsync and sed -i)");
    c.rm = app.add_subcommand(
        "rm", "unpublish files this node produced (their records go; the files stay on disk)");
    c.rm->add_option("FILE", o.files, "files of DYAD_PATH_PRODUCER to unpublish")->required();
    auto* consume =
        app.add_subcommand("consume", "wait for files and bring them into DYAD_PATH_CONSUMER");
    c.consume = consume;
    consume->add_option("FILE", o.files, "consumer-side paths")->required();
    consume->add_flag("--explain", o.explain,
                      "say which transport moved each file and why (DYAD_DTL_MODE=AUTO: every "
                      "candidate with its estimate)");
    add_timeout_option(consume, o.timeout,
                       "how long to wait for each file to be produced: seconds, or with a unit "
                       "(90s, 10m, 1h) (default DYAD_WAIT_TIMEOUT)");
    auto* pon = consume->add_flag("--progress", o.progress_on,
                                  "show the progress of each transfer on stderr (bytes, rate, "
                                  "ETA) even when stderr is not a terminal, and for small files");
    consume
        ->add_flag("--no-progress", o.progress_off,
                   "never show progress (default: shown on a terminal for files over 64 MiB or "
                   "transfers that take more than 1 s)")
        ->excludes(pon);
    consume
        ->add_option("--window", o.window,
                     "files in flight when consuming several (default DYAD_CONSUME_WINDOW)")
        ->check(CLI::Range(1u, 1024u));
    auto* sync = app.add_subcommand(
        "sync",
        "consume every file produced under a relative path prefix (with --follow: as they "
        "appear)");
    c.sync = sync;
    sync->add_option("PREFIX", o.sync_prefix,
                     "path relative to the managed directory: 'data' takes data and what is "
                     "under it, '' or '.' everything, 'run1/x*' every path starting so")
        ->required();
    sync->add_flag("--follow", o.follow,
                   "keep consuming new files (and new generations) until interrupted or --count");
    sync->add_option("--count", o.sync_count, "with --follow: stop after N files consumed")
        ->check(CLI::PositiveNumber);
    sync->add_option("--window", o.window, "files in flight (default DYAD_CONSUME_WINDOW)")
        ->check(CLI::Range(1u, 1024u));
    add_timeout_option(sync, o.timeout,
                       "how long a listed file may take to be found in the store: seconds, or "
                       "with a unit (90s, 10m, 1h) (default DYAD_WAIT_TIMEOUT)");
}

// stat, ls, config, key, keygen, service status.
void add_info_commands(CLI::App& app, Cli& o, Commands& c) {
    c.stat = app.add_subcommand("stat", "show the metadata of a file");
    c.stat
        ->add_option("FILE", o.stat_file,
                     "a path in the consumer directory, or in the producer directory")
        ->required();
    c.ls = app.add_subcommand(
        "ls", "list the files produced in the namespace, page by page as they arrive");
    c.ls->add_option("PREFIX", o.ls_prefix,
                     "only files whose relative path starts with PREFIX (e.g. 'run3/')");
    c.config = app.add_subcommand(
        "config", "print every setting with its value and source, and the transports");
    c.config->add_flag("--markdown", o.markdown,
                       "print the settings table of the user guide (generated from the table)");
    c.key = app.add_subcommand(
        "key", "print the metadata key of a path relative to a managed directory");
    c.key->add_option("UPATH", o.key_path)->required();
    c.keygen = app.add_subcommand(
        "keygen",
        "write a new job key (32 random bytes, mode 0600) for dyadd --auth-key and "
        "DYAD_AUTH_KEY_FILE");
    c.keygen->add_option("FILE", o.keygen_path, "where to write it (never overwritten)")
        ->required();
    c.doctor = app.add_subcommand(
        "doctor",
        "check the settings, directories, key, service, metadata store and transport of this "
        "process's environment, and say what to fix (exit 1 if something must be)");
    auto* service = app.add_subcommand("service", "ask a service about itself");
    c.status = service->add_subcommand("status", "identity, transports and counters of a service");
    c.status->add_option("--uri", o.uri, "service to ask (default DYAD_SERVICE_URI)");
    c.status_wait =
        c.status
            ->add_option("--wait", o.status_wait_text,
                         "wait until the service answers (for job scripts), at most DURATION "
                         "(seconds, or 90s, 10m, 1h; default 60 s); exit 4 if it did not")
            ->expected(0, 1)
            ->type_name("[DURATION]");
    service->require_subcommand(1);
}

// Parses the command line: -1 when parsed, else the exit code (--help: 0;
// an error, said on stderr: 1).
int parse(CLI::App& app, std::vector<char*>& args) {
    try {
        app.parse(static_cast<int>(args.size()), args.data());
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);  // --help
        std::string sub;
        for (const CLI::App* a = &app; a && !a->get_subcommands().empty();) {
            a = a->get_subcommands().front();
            sub += " " + a->get_name();
        }
        std::fprintf(stderr, "dyad%s: %s (see 'dyad%s --help')\n", sub.c_str(), e.what(),
                     sub.c_str());
        return 1;
    }
    for (const CLI::App* a = &app; !a->get_subcommands().empty();) {
        a = a->get_subcommands().front();
        g_command += " " + a->get_name();
    }
    return -1;
}

// ---- the subcommands that need no client ----
int run_keygen(const Cli& o) {
    dyad::Status s = dyad::auth::Key::generate(o.keygen_path);
    if (!s) return report(s, o.keygen_path);
    if (!o.json)
        std::cout << "wrote a new key to " << o.keygen_path
                  << " (mode 0600): give it to dyadd --auth-key and to clients as "
                     "DYAD_AUTH_KEY_FILE\n";
    return 0;
}

// `dyad config` lists the settings even when one is bad (to show where its
// value came from), then fails.
int run_config(const Cli& o, const dyad::Result<dyad::Config>& cfg) {
    if (o.markdown) {
        std::cout << dyad::settings::markdown();
        return 0;
    }
    nlohmann::json j = {{"config", cfg ? cfg->to_json() : nlohmann::json()},
                        {"settings", dyad::settings::describe()}};
    if (!cfg) j["error"] = cfg.status().message();
    nlohmann::json t = nlohmann::json::array();
    for (const auto& b : dyad::dtl::backends()) t.push_back(b.attributes().to_json());
    j["transports_built"] = t;
    if (o.json) {
        std::cout << j.dump(2, ' ', false, kBadUtf8Replaced) << "\n";
    } else {
        // Like `ucx_info -c`: NAME=VALUE, then where the value came from.
        for (const auto& s : j["settings"]) {
            std::string line = s["name"].get<std::string>() + "=" +
                               (s["value"].is_null() ? "" : s["value"].get<std::string>());
            std::cout << line << std::string(line.size() < 40 ? 40 - line.size() : 1, ' ')
                      << "# " << s["source"].get<std::string>() << "\n";
        }
        std::cout << "transports built:";
        for (auto& b : t) std::cout << " " << b["name"].get<std::string>();
        std::cout << "\n";
        for (auto& b : t) {
            std::string info = b.value("info", std::string());
            if (!info.empty())
                std::cout << "  " << b["name"].get<std::string>() << ": " << info << "\n";
        }
    }
    std::cout.flush();
    return cfg ? 0 : report(cfg.status());
}

int run_key(const Cli& o, const dyad::Config& cfg) {
    auto k = dyad::gen_path_key(o.key_path, cfg.key_depth, cfg.key_bins);
    if (!k) return report(k.status(), o.key_path);
    std::cout << k.value() << "\n";
    return 0;
}

// ---- the subcommands of a client ----

// produce -r: the regular files under `dir`, sorted, without DYAD's own
// directory (.dyad) and the temporaries of rsync and sed -i (published
// under their real names when renamed). Symbolic links are not followed.
std::vector<std::string> files_under(const std::string& dir, dyad::Status* err) {
    namespace fs = std::filesystem;
    std::vector<std::string> out;
    std::error_code ec;
    fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
        const auto& p = it->path();
        const std::string name = p.filename().string();
        if (it->is_directory(ec) && !it->is_symlink(ec)) {
            if (name == dyad::kReservedDir) it.disable_recursion_pending();
            continue;
        }
        if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
        if (dyad::client::is_tool_temporary(name.c_str())) continue;
        out.push_back(p.string());
    }
    if (ec) *err = dyad::Status(DYAD_RC_BADFIO, "cannot list '" + dir + "'", ec.value());
    std::sort(out.begin(), out.end());
    return out;
}

bool is_directory(const std::string& path) {
    struct stat sb;
    return ::stat(path.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode);
}

int run_produce(dyad::client::Client& c, const Cli& o) {
    int rc = 0;
    std::vector<std::string> files;
    for (const auto& f : o.files) {
        // Not a directory under the producer directory (the directory
        // itself, or outside it): the client says which.
        if (!is_directory(f) || (!o.recursive && !c.producer_upath(f))) {
            files.push_back(f);
            continue;
        }
        if (!o.recursive) {
            rc = report(dyad::Status(DYAD_RC_BADFIO,
                                     "is a directory: 'dyad produce -r " + f +
                                         "' publishes every file under it",
                                     EISDIR),
                        f);
            continue;
        }
        dyad::Status err;
        auto under = files_under(f, &err);
        if (!err) rc = report(err, f);
        if (under.empty() && err)
            std::fprintf(stderr, "%s %s: no regular file under it to publish\n", g_command.c_str(),
                         f.c_str());
        files.insert(files.end(), under.begin(), under.end());
    }
    for (size_t i = 0; i < files.size(); ++i) {
        const auto& f = files[i];
        dyad::Status s = c.produce(f);
        if (!s) {
            rc = report(s, f);
            if (service_failure(c, s)) return not_attempted(files.size() - i - 1), rc;
        } else if (o.json) {
            std::cout << nlohmann::json{{"file", f}, {"action", "produced"}, {"ok", true}}.dump(
                             -1, ' ', false, kBadUtf8Replaced)
                      << "\n";
        } else {
            std::cout << "produced " << f << "\n";
        }
    }
    return rc;
}

int run_rm(dyad::client::Client& c, const Cli& o) {
    return dyad::tools::unpublish_files(
        c, o.files, o.json, [](const dyad::Status& s, const std::string& f) { return report(s, f); });
}

// ---- consume: what it is doing, on a terminal and on Ctrl-C ----

// The line Ctrl-C prints (built before, written by the handler with
// write(2)): two buffers, the handler reads the one last completed.
char g_interrupt_text[2][1024];
std::atomic<int> g_interrupt_at{-1};

void set_interrupt_text(const std::string& line) {
    int next = g_interrupt_at.load() == 0 ? 1 : 0;
    std::snprintf(g_interrupt_text[next], sizeof g_interrupt_text[next], "%s\n", line.c_str());
    g_interrupt_at.store(next);
}

extern "C" void on_interrupt(int sig) {
    int at = g_interrupt_at.load();
    if (at >= 0) {
        const char* t = g_interrupt_text[at];
        ssize_t n = ::write(STDERR_FILENO, t, std::strlen(t));
        (void)n;
    }
    ::_exit(128 + sig);
}

// After ~1 s without a result, on a terminal: "waiting for X to be
// produced..." (the default is to wait forever, so say so). Once per file
// waited for.
class WaitingLine {
  public:
    explicit WaitingLine(bool enabled) : enabled_(enabled) {
        if (enabled_) thread_ = std::thread([this] { run(); });
    }
    ~WaitingLine() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
    }
    // What is awaited now ("" : nothing, its bytes are arriving).
    void now(const std::string& line) {
        std::lock_guard<std::mutex> lk(mu_);
        if (line != line_) since_ = std::chrono::steady_clock::now();
        line_ = line;
    }

  private:
    void run() {
        std::unique_lock<std::mutex> lk(mu_);
        std::string shown;
        while (!stop_) {
            cv_.wait_for(lk, std::chrono::milliseconds(200));
            if (stop_ || line_.empty() || line_ == shown) continue;
            if (std::chrono::steady_clock::now() - since_ < std::chrono::seconds(1)) continue;
            std::fprintf(stderr, "%s\n", line_.c_str());
            std::fflush(stderr);
            shown = line_;
        }
    }
    bool enabled_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::string line_;
    std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
    std::thread thread_;
};

std::string waiting_text(const std::string& f, const Cli& o) {
    return g_command + ": waiting for " + f + " to be produced (Ctrl-C to stop" +
           (o.timeout >= 0 ? "" : "; --timeout S to give up") + ")...";
}

// A path that does not exist with *, ? or [ in it: a shell pattern that
// matched nothing is passed on as it is, and would be waited for by that
// name.
void warn_unmatched_glob(const std::string& f) {
    if (f.find_first_of("*?[") == std::string::npos) return;
    struct stat sb;
    if (::lstat(f.c_str(), &sb) == 0) return;
    std::fprintf(stderr,
                 "%s: warning: '%s' does not exist and contains *, ? or [: if it was a shell "
                 "pattern, it matched nothing and DYAD waits for a file of exactly this name "
                 "('dyad ls' lists the files produced)\n",
                 g_command.c_str(), f.c_str());
}

// The names `dyad ls` prints are relative to the managed directory: a
// relative path that is not under the consumer directory when taken from
// the current directory is taken from the consumer directory (from the
// producer directory for `dyad stat` on a node with only that).
std::string resolve_relative(dyad::client::Client& c, const std::string& f, bool producer_too) {
    if (f.empty() || f[0] == '/') return f;
    if (c.consumer_upath(f)) return f;
    if (producer_too && c.producer_upath(f)) return f;
    const auto& dir = !c.consumer_dir().empty()                   ? c.consumer_dir()
                      : producer_too && !c.producer_dir().empty() ? c.producer_dir()
                                                                  : c.consumer_dir();
    if (dir.empty()) return f;
    return dir.join(f);
}

// One file: the progress of its transfer can be shown.
int run_consume_one(dyad::client::Client& c, const Cli& o) {
    Progress bar(o.progress_on    ? Progress::Mode::on
                 : o.progress_off ? Progress::Mode::off
                                  : Progress::Mode::automatic);
    const auto& f = o.files[0];
    dyad::client::ConsumeReport r;
    WaitingLine waiting(::isatty(STDERR_FILENO) == 1);
    waiting.now(waiting_text(f, o));
    set_interrupt_text(g_command + ": interrupted while waiting for " + f +
                       " to be produced: nothing was installed");
    bool wanted = bar.wanted();
    if (wanted) bar.start(f);
    bool arriving = false;
    r.progress = [&](const dyad::client::TransferProgress& p) {
        if (!arriving) {
            arriving = true;
            waiting.now("");
            set_interrupt_text(g_command + ": interrupted while fetching " + f +
                               ": nothing was installed (its partial copy is removed by the next "
                               "consume of it)");
        }
        if (wanted) bar.update(p);
    };
    dyad::Status s = c.consume(f, &r);
    waiting.now("");
    bar.finish(r.bytes, r.bytes, r.transfer_s, s.is_ok());
    return print_consumed(f, s, r, o.json, o.explain, o.timeout >= 0);
}

// Several files: pipelined, printed as they finish, in the order given (each
// line as soon as its file and those before it have finished).
int run_consume_many(dyad::client::Client& c, const Cli& o);

int run_consume(dyad::client::Client& c, const Cli& given) {
    Cli o = given;
    for (auto& f : o.files) {
        warn_unmatched_glob(f);
        f = resolve_relative(c, f, false);
    }
    std::signal(SIGINT, on_interrupt);
    std::signal(SIGTERM, on_interrupt);
    if (o.files.size() == 1) return run_consume_one(c, o);
    return run_consume_many(c, o);
}

int run_consume_many(dyad::client::Client& c, const Cli& o) {
    // Nothing can be consumed if the node's service cannot be reached: say it once.
    if (auto svc = c.service(); !svc) {
        int rc = report(svc.status(), o.files[0]);
        return not_attempted(o.files.size() - 1), rc;
    }
    int rc = 0;
    std::vector<std::optional<std::pair<dyad::Status, dyad::client::ConsumeReport>>> ended(
        o.files.size());
    size_t next = 0;
    auto print = [&](size_t i, const dyad::Status& s, const dyad::client::ConsumeReport& r) {
        int code = print_consumed(o.files[i], s, r, o.json, o.explain, o.timeout >= 0);
        if (code && !rc) rc = code;
    };
    dyad::client::ConsumeManyOptions m;
    m.window = o.window;
    g_flush_each_line = false;
    WaitingLine waiting(::isatty(STDERR_FILENO) == 1);
    const size_t total = o.files.size();
    auto now_at = [&](size_t done) {
        if (done >= total) return waiting.now("");
        waiting.now(g_command + ": waiting for " + o.files[done] + " (" + std::to_string(done) +
                    " of " + std::to_string(total) + " files consumed; Ctrl-C to stop)...");
        set_interrupt_text(g_command + ": interrupted after " + std::to_string(done) + " of " +
                           std::to_string(total) +
                           " files: the others were not installed (a partial copy is removed "
                           "by the next consume of its file)");
    };
    now_at(0);
    m.done = [&](size_t i, const dyad::Status& s, const dyad::client::ConsumeReport& r) {
        if (i == next) {  // the usual case: printed at once, nothing kept
            print(i, s, r);
            ++next;
        } else {
            ended[i].emplace(s, r);
        }
        for (; next < o.files.size() && ended[next]; ++next) {
            print(next, ended[next]->first, ended[next]->second);
            ended[next].reset();
        }
        now_at(next);
    };
    c.consume_many(o.files, m);
    return rc;
}

volatile std::sig_atomic_t g_stop = 0;

int run_sync(dyad::client::Client& c, const Cli& o) {
    std::signal(SIGINT, [](int) { g_stop = 1; });
    std::signal(SIGTERM, [](int) { g_stop = 1; });
    int rc = 0;
    dyad::client::SyncOptions so;
    so.prefix = o.sync_prefix;
    so.follow = o.follow;
    so.count = o.sync_count;
    so.window = o.window;
    so.stop = [] { return g_stop != 0; };
    so.done = [&](const std::string& f, const dyad::Status& s,
                  const dyad::client::ConsumeReport& r) {
        int code = print_consumed(f, s, r, o.json, false, o.timeout >= 0);
        if (code && !rc) rc = code;
    };
    uint64_t consumed = 0;
    dyad::Status s = c.sync(so, &consumed);
    if (!s && !rc) return report(s);
    if (!o.json)
        std::fprintf(stderr, "%s: %llu file%s consumed%s\n", g_command.c_str(),
                     static_cast<unsigned long long>(consumed), consumed == 1 ? "" : "s",
                     g_stop ? " (interrupted)" : "");
    return rc;
}

int run_stat(dyad::client::Client& c, const Cli& o) {
    auto r = c.stat(resolve_relative(c, o.stat_file, true));
    if (!r)
        return report(r.status(), o.stat_file,
                      r.status().rc() == DYAD_RC_NOTFOUND
                          ? "'dyad ls' lists the files produced so far, 'dyad consume' "
                            "waits for one"
                          : "");
    nlohmann::json j = r->to_json();
    j["generation"] = r->generation;
    j["owner_rank"] = r->owner_rank();
    j["key"] = c.key_of(r->upath);
    if (o.json) {
        std::cout << j.dump(2, ' ', false, kBadUtf8Replaced) << "\n";
        return 0;
    }
    for (auto& [k, v] : j.items()) {
        if (k == "mode" && v.is_number_unsigned())
            std::cout << "mode: " << octal_mode(v.get<uint64_t>()) << "\n";
        else if (k == "mtime_ns" && v.is_number_integer())
            std::cout << "mtime: " << iso_time(v.get<int64_t>()) << "\n";
        else
            std::cout << k << ": "
                      << (v.is_string() ? v.get<std::string>()
                                        : v.dump(-1, ' ', false, kBadUtf8Replaced))
                      << "\n";
    }
    return 0;
}

// Streamed: a page is printed as it arrives, so memory stays flat however
// many records there are. --json: one object per line.
int run_ls(dyad::client::Client& c, const Cli& o) {
    dyad::Status s = c.list(o.ls_prefix, [&](const dyad::client::Record& r) {
        if (o.json) {
            auto j = r.to_json();
            j["generation"] = r.generation;
            std::cout << j.dump(-1, ' ', false, kBadUtf8Replaced) << "\n";
        } else {
            std::cout << std::setw(12) << r.size << "  gen " << std::left << std::setw(4)
                      << r.generation << " " << std::setw(16) << r.owner << std::right << " "
                      << r.upath << "\n";
        }
        return static_cast<bool>(std::cout);  // stdout closed (dyad ls | head): stop
    });
    std::cout.flush();
    return s ? 0 : report(s);
}

// `dyad service status`: the counters of the service and of its peers.
void print_counters(nlohmann::json& j) {
    auto& ctr = j["counters"];
    // Files asked for and served by this dyadd (a dyad.fetch_many asks for
    // many in one request); what its own clients fetched from others is
    // counted by those others.
    std::printf("files requested %llu (in %llu requests), served %llu, errors %llu, bytes sent "
                "%llu\n",
                ctr.value("files_requested", 0ull),
                ctr.value("requests", 0ull) + ctr.value("fetch_many_requests", 0ull),
                ctr.value("served", 0ull), ctr.value("errors", 0ull),
                ctr.value("bytes_sent", 0ull));
    std::printf(
        "authentication: %s; refused peers %llu, unproduced fetches refused %llu, "
        "stale fetches refused %llu, published %llu\n",
        j.value("auth", std::string("none")).c_str(), ctr.value("auth_refused", 0ull),
        ctr.value("refused_unproduced", 0ull), ctr.value("refused_stale", 0ull),
        ctr.value("published", 0ull));
    if (j.contains("peers")) {
        auto& pc = j["peers"];
        std::printf(
            "caps per peer: refused connections %llu (cap %llu), fetches %llu (cap %llu), "
            "LOCAL %llu (cap %llu); memory %llu bytes a peer\n",
            ctr.value("refused_peer_connections", 0ull),
            pc.value("max_connections_per_peer", 0ull), ctr.value("refused_peer_fetches", 0ull),
            pc.value("max_fetches_per_peer", 0ull), ctr.value("refused_peer_local", 0ull),
            pc.value("max_local_per_peer", 0ull), pc.value("memory_per_peer", 0ull));
    }
    for (auto& [name, p] : ctr["per_transport"].items())
        std::printf("  %-10s requests %llu served %llu errors %llu sent %llu received %llu\n",
                    name.c_str(), p.value("requests", 0ull), p.value("served", 0ull),
                    p.value("errors", 0ull), p.value("bytes_sent", 0ull),
                    p.value("bytes_received", 0ull));
}

// `dyad service status`: the store it hosts and the metadata store it uses.
void print_stores(nlohmann::json& j) {
    if (j.contains("store") && j["store"].is_object())
        std::printf("store: %llu keys, %llu waiting, epoch %llu\n", j["store"].value("keys", 0ull),
                    j["store"].value("waiters", 0ull), j["store"].value("epoch", 0ull));
    if (!j.contains("metadata_store")) return;
    auto& m = j["metadata_store"];
    bool up = m.value("reachable", false);
    std::string backend = m.value("backend", ""), endpoint = m.value("endpoint", "");
    if (backend != endpoint) backend += " at " + endpoint;
    std::printf("metadata store: %s, %s%s%s\n", backend.c_str(), up ? "reachable" : "NOT reachable",
                up ? "" : ": ", up ? "" : m.value("error", "").c_str());
    if (m.value("backend", "") == "etcd")
        std::printf(
            "  watch stream %s: %llu keys watched, %llu consumers waiting, %llu "
            "reconnects; lease %lld (TTL %.0f s)\n",
            m.value("watch_stream_up", false) ? "up" : "DOWN", m.value("watched_keys", 0ull),
            m.value("waiters", 0ull), m.value("watch_reconnects", 0ull), m.value("lease_id", 0ll),
            m.value("lease_ttl", 0.0));
    if (m.value("rejoined", 0ull) || m.value("republished", 0ull))
        std::printf(
            "  registered again %llu times after the store came back empty, "
            "%llu records published again\n",
            m.value("rejoined", 0ull), m.value("republished", 0ull));
}

int run_status(dyad::client::Client& c, const Cli& o) {
    auto s = c.service_status(o.uri);
    if (o.status_wait >= 0) {
        // --wait: ask again until it answers (a job script's "is it up yet").
        const auto end = std::chrono::steady_clock::now() +
                         std::chrono::duration<double>(o.status_wait < 0 ? 60 : o.status_wait);
        while (!s && s.status().rc() == DYAD_RC_CONNFAIL &&
               std::chrono::steady_clock::now() < end) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            s = c.service_status(o.uri);
        }
        if (!s && s.status().rc() == DYAD_RC_CONNFAIL)
            return report(s.status(), "",
                          "it did not answer within " +
                              human_seconds(o.status_wait < 0 ? 60 : o.status_wait) + " (--wait)");
    }
    if (!s) return report(s.status());
    if (o.json) {
        std::cout << s->dump(2, ' ', false, kBadUtf8Replaced) << "\n";
        return 0;
    }
    auto& j = s.value();
    std::printf("service %s on node %s (pid %d), namespace %s\n",
                j.value("service_id", "").c_str(), j.value("node", "").c_str(), j.value("pid", 0),
                j.value("namespace", "").c_str());
    std::printf("producer dir: %s\nmetadata: %s\nendpoints: %s\n",
                j.value("producer_dir", "").c_str(), j.value("kvs", "").c_str(),
                j["endpoints"].dump(-1, ' ', false, kBadUtf8Replaced).c_str());
    std::printf("uptime: %.1f s, connections: %d\n", j.value("uptime_s", 0.0),
                j.value("connections", 0));
    print_counters(j);
    print_stores(j);
    if (j.contains("metrics")) std::printf("metrics: %s\n", j.value("metrics", "").c_str());
    return 0;
}

// Runs the parsed subcommand; returns the exit code.
int dispatch(const Commands& c, Cli& o, dyad::job::Options& job_options) {
    if (*c.job.job) return dyad::job::run(c.job, job_options);
    if (*c.keygen) return run_keygen(o);
    if (*c.doctor) return dyad::tools::doctor(o.json);
    g_json = o.json;
    auto cfg = dyad::Config::from_env();
    if (!cfg && !*c.config) return report(cfg.status());
    if (cfg) {
        if (o.timeout >= 0) cfg->wait_timeout = o.timeout;
        dyad::log::set_level(cfg->log_level);
        g_debug = cfg->log_level <= dyad::log::Level::debug;
    }
    if (c.status_wait->count()) {
        o.status_wait = 60;
        if (!o.status_wait_text.empty() && !parse_duration(o.status_wait_text, &o.status_wait)) {
            std::fprintf(stderr,
                         "%s: --wait: '%s' is not a duration: give seconds (30, 2.5) or a "
                         "number with a unit s, m or h (90s, 10m, 1h)\n",
                         g_command.c_str(), o.status_wait_text.c_str());
            return 1;
        }
    }
    if (*c.config) {
        g_json = false;  // its document says the error
        return run_config(o, cfg);
    }
    if (*c.key) return run_key(o, cfg.value());
    auto client = dyad::client::Client::create(cfg.value());
    // Every reason a client cannot be made is this process's configuration
    // (a transport, a key file that cannot be read): exit 1.
    if (!client) return report(client.status(), "", "", 1);
    // The subcommands of a client.
    const std::pair<const CLI::App*, int (*)(dyad::client::Client&, const Cli&)> table[] = {
        {c.produce, run_produce}, {c.consume, run_consume}, {c.sync, run_sync},
        {c.stat, run_stat},       {c.ls, run_ls},           {c.status, run_status},
        {c.rm, run_rm}};
    for (const auto& [app, run] : table)
        if (*app) return run(*client.value(), o);
    return 1;
}

}  // namespace

int main(int argc, char** argv) {
    std::signal(SIGPIPE, SIG_IGN);
    CLI::App app{
        "dyad: produce and consume files through DYAD, inspect the metadata and the services.\n"
        "Configuration comes from DYAD_* environment variables (see 'dyad config')."};
    app.footer(kExitCodes);
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("dyad ") + dyad_version(),
                         "print the version and exit");
    Cli o;
    std::vector<char*> args = arguments(argc, argv, &o.json);
    bool json_flag = false;
    app.add_flag("--json", json_flag, "machine-readable output (anywhere on the command line)");
    Commands c{};
    add_file_commands(app, o, c);
    add_info_commands(app, o, c);
    dyad::job::Options job_options;
    c.job = dyad::job::add_commands(app, job_options);
    if (int rc = parse(app, args); rc >= 0) return rc;
    o.json = o.json || json_flag;
    return dispatch(c, o, job_options);
}
