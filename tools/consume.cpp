// SPDX-License-Identifier: Apache-2.0
// dyad consume and dyad sync: the waiting line on a terminal, Ctrl-C, globs
// that matched nothing, relative names, many files in flight.
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

using dyad::kBadUtf8Replaced;

namespace dyad::tool {
namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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
}  // namespace dyad::tool
