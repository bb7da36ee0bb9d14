// SPDX-License-Identifier: Apache-2.0
// Internal to the dyad tool (tools/*.cpp): what its subcommands share.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/client.hpp"
#include "common/config.hpp"
#include "common/status.hpp"

namespace dyad::tool {

// "dyad SUBCOMMAND" for messages; --debug-level logging; --json.
extern std::string g_command;
extern bool g_debug;
extern bool g_json;
// Lines of consumed files go out at once (a terminal, dyad sync), or at
// most every 0.1 s into a pipe or file (flush_lines).
extern bool g_flush_each_line;

std::string lower(std::string t);
// Whether the status's message already says its errno's text.
bool errno_said(const dyad::Status& s);
// What to do about a failure, when its message does not say.
std::string advice(const dyad::Status& s);
int exit_code_of(const dyad::Status& s);
void json_error(const dyad::Status& s, const std::string& file, const std::string& msg, int code);
// Prints "dyad SUBCOMMAND [FILE]: what happened[: errno text][: what to do]"
// on stderr (and, with --json, the same as an object on stdout) and returns
// the exit code of the failure. `code`: an exit code other than the
// status's (a configuration error met while connecting: 1).
int report(const dyad::Status& s, const std::string& file = "", const std::string& extra = "",
           int code = -1);
// "30", "2.5", "90s", "10m", "1h": seconds. False if it is none of these.
bool parse_duration(const std::string& text, double* seconds);
std::string human_bytes(double b);
std::string human_seconds(double s);
std::string octal_mode(uint64_t mode);
std::string iso_time(int64_t ns);
bool service_failure(dyad::client::Client& c, const dyad::Status& s);
int not_attempted(size_t left);
void flush_lines();
// Prints the line of one consumed file (--json: its object), or its error
// on stderr; returns the file's exit code. cli_timeout: the wait limit came
// from --timeout, not from the environment.
int print_consumed(const std::string& f, dyad::Status s, const dyad::client::ConsumeReport& r,
                   bool json, bool explain, bool cli_timeout);

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

// What the command line said (the options of every subcommand).
struct Cli {
    bool json = false, explain = false, progress_on = false, progress_off = false;
    bool follow = false, markdown = false, recursive = false;
    std::vector<std::string> files;
    double timeout = -1;      // --timeout; negative: not given
    double status_wait = -1;  // service status --wait; negative: not given
    unsigned window = 0;
    uint64_t sync_count = 0;
    std::string status_wait_text;  // service status --wait [DURATION]: "" if given alone
    std::string sync_prefix, stat_file, ls_prefix, key_path, keygen_path, uri;
    bool doctor_site = false;  // doctor --site
    std::string slurm_conf;    // doctor --slurm-conf
};

// A relative name as `dyad ls` prints it: resolved against the consumer
// directory (and, with producer_too, the producer directory) when it is not
// under it from the current directory (consume.cpp).
std::string resolve_relative(dyad::client::Client& c, const std::string& f, bool producer_too);

// The subcommands (consume.cpp, info.cpp); each returns its exit code.
int run_consume(dyad::client::Client& c, const Cli& o);
int run_sync(dyad::client::Client& c, const Cli& o);
int run_keygen(const Cli& o);
int run_config(const Cli& o, const dyad::Result<dyad::Config>& cfg);
int run_key(const Cli& o, const dyad::Config& cfg);
int run_stat(dyad::client::Client& c, const Cli& o);
int run_ls(dyad::client::Client& c, const Cli& o);
int run_status(dyad::client::Client& c, const Cli& o);

}  // namespace dyad::tool
