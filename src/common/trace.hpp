// SPDX-License-Identifier: Apache-2.0
// Where the time goes: with DYAD_TRACE=DIR (dyadd --trace DIR) every DYAD
// process writes its own Chrome trace-event file, DIR/dyad-<node>-<pid>.json
// (docs/user-guide.md, "Tracing (DYAD_TRACE)"). Each traced operation is one
// complete event ("ph":"X", ts and dur in microseconds, ts since the Unix
// epoch so the files of several processes and nodes line up) with its file,
// key and sizes in "args".
//
// The file is a JSON array written as it goes ("[", then the events separated
// by ",", then "]" at exit): a process that crashes or leaves by _exit
// leaves the array without its closing bracket, which Perfetto and
// chrome://tracing accept (and a reader repairs by appending "]"). Events are
// buffered and written whole: in a client, when an outermost span ends (a
// consume, a produce: a process that leaves by _exit, as Python's
// multiprocessing workers do, loses no finished operation); in dyadd, every
// kFlushEvents events or when the oldest is kFlushAge seconds old; and at
// exit and before a fork. A file holds at most
// DYAD_TRACE_MAX_SIZE bytes of events: later ones are dropped and counted,
// the count written in its last event ("trace_end") and logged once.
//
// Off (DYAD_TRACE unset), a Span costs one load and one branch.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "status.hpp"

namespace dyad::trace {

namespace detail {
extern std::atomic<bool> g_on;
}

// True while this process writes a trace.
inline bool on() {
    return detail::g_on.load(std::memory_order_relaxed);
}

// Starts tracing if DYAD_TRACE names a directory (created if missing), once
// per process: later calls do nothing. `role` names the process in the trace
// ("dyadd", or empty: the program's name). A directory that cannot be
// written, or a DYAD_TRACE_MAX_SIZE that does not parse, is one warning and
// no trace; never an error.
void start_from_settings(const std::string& role = "");

// Writes what is buffered (tests; exit and fork do it themselves).
void flush();

// What this process's trace did (tests, `dyad service status`).
struct Stats {
    std::string file;        // "" when not tracing
    uint64_t events = 0;     // written (or buffered)
    uint64_t dropped = 0;    // over DYAD_TRACE_MAX_SIZE
    uint64_t bytes = 0;      // of events written (or buffered)
    uint64_t max_bytes = 0;  // DYAD_TRACE_MAX_SIZE
};
Stats stats();
// The same as JSON (dyadd's status: "trace").
nlohmann::json stats_json();

// Microseconds since the Unix epoch (the events' clock).
int64_t now_us();

// A complete event that already ended: it began at `ts_us` (now_us()) and
// took `dur_us`. Does nothing when off.
void complete(const char* name, const char* cat, int64_t ts_us, double dur_us,
              const nlohmann::json& args);

// One traced operation, from construction to destruction:
//   trace::Span sp("transfer", "client");
//   ... sp.arg("bytes", n).arg("transport", name);
// name and cat must be string literals (kept by pointer).
class Span {
  public:
    Span(const char* name, const char* cat) : name_(name), cat_(cat), active_(on()) {
        if (active_) begin();
    }
    ~Span() {
        if (active_) end();
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

    bool active() const { return active_; }
    Span& arg(const char* key, std::string_view v) {
        if (active_) args_[key] = v;
        return *this;
    }
    Span& arg(const char* key, const char* v) { return arg(key, std::string_view(v ? v : "")); }
    Span& arg(const char* key, const std::string& v) { return arg(key, std::string_view(v)); }
    Span& arg(const char* key, uint64_t v) {
        if (active_) args_[key] = v;
        return *this;
    }
    Span& arg(const char* key, int v) {
        if (active_) args_[key] = v;
        return *this;
    }
    Span& arg(const char* key, bool v) {
        if (active_) args_[key] = v;
        return *this;
    }
    // Ends the event now (instead of at destruction).
    void finish() {
        if (active_) end();
        active_ = false;
    }
    // The operation failed: its message goes in args.error.
    Span& fail(const Status& s) {
        if (active_ && !s) args_["error"] = s.message();
        return *this;
    }

  private:
    void begin();
    void end();
    const char* name_;
    const char* cat_;
    bool active_;
    bool outermost_ = false;  // no other span open on this thread
    int64_t ts_us_ = 0;
    std::chrono::steady_clock::time_point t0_;
    nlohmann::json args_;
};

}  // namespace dyad::trace
