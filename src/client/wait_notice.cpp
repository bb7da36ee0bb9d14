// SPDX-License-Identifier: Apache-2.0
// The waits of this process live in a fixed table (no allocation, readable
// from a signal handler); one thread per process (started by the first
// wait, again in a forked child) prints the lines that are due.
#include "wait_notice.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <thread>
#include <unistd.h>

namespace dyad::client {

namespace {

constexpr int kSlots = 64;
constexpr size_t kText = 900;

enum : int { kFree = 0, kClaimed = 1, kActive = 2, kReading = 3 };

// Trivially destructible: the notifier thread and signal handlers may read
// it while the process exits.
struct Slot {
    std::atomic<int> state;
    pid_t pid;
    int64_t start_ns;
    int64_t next_ns;
    double gap;
    char what[kText];
    char limit[kText / 4];
};
Slot g_slots[kSlots];
std::atomic<pid_t> g_thread_pid{0};
std::atomic<bool> g_signals_tried{false};

int64_t now_ns() {
    struct timespec ts;
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

void copy_text(char* dst, size_t cap, const std::string& s) {
    size_t n = s.size() < cap - 1 ? s.size() : cap - 1;
    std::memcpy(dst, s.data(), n);
    dst[n] = '\0';
}

void write_all(const char* p, size_t n) {
    while (n > 0) {
        ssize_t w = ::write(STDERR_FILENO, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= static_cast<size_t>(w);
    }
}

// ---- the last line at a kill (async-signal-safe: no stdio, no allocation) ----
struct Line {
    char buf[kText + 256];
    size_t n = 0;
    void add(const char* s) {
        while (*s && n < sizeof buf - 1) buf[n++] = *s++;
    }
    void add_number(long long v) {
        char d[24];
        int k = 0;
        if (v < 0) v = 0;
        do {
            d[k++] = static_cast<char>('0' + v % 10);
            v /= 10;
        } while (v && k < 20);
        while (k && n < sizeof buf - 1) buf[n++] = d[--k];
    }
};

void on_fatal_signal(int sig) {
    const int saved = errno;
    const pid_t me = ::getpid();
    const int64_t now = now_ns();
    for (Slot& s : g_slots) {
        int st = s.state.load(std::memory_order_acquire);
        if ((st != kActive && st != kReading) || s.pid != me) continue;
        Line l;
        l.add("dyad: ");
        l.add(sig == SIGTERM ? "killed (SIGTERM, e.g. a job's time limit)"
                             : "interrupted (SIGINT)");
        l.add(" after waiting ");
        l.add_number((now - s.start_ns) / 1000000000LL);
        l.add(" s for ");
        l.add(s.what);
        l.add(": it had not been produced ('dyad ls' lists what was)\n");
        write_all(l.buf, l.n);
    }
    // Then dies of the signal, as without this handler.
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    ::sigaction(sig, &dfl, nullptr);
    errno = saved;
    ::raise(sig);  // blocked until this handler returns, then fatal
}

// Only where the program left the signal at its default: a program with a
// handler of its own (the dyad CLI, Python's SIGINT) keeps it untouched.
void install_signal_lines() {
    if (g_signals_tried.exchange(true)) return;
    for (int sig : {SIGTERM, SIGINT}) {
        struct sigaction old;
        if (::sigaction(sig, nullptr, &old) != 0) continue;
        if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
        struct sigaction sa;
        std::memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        ::sigaction(sig, &sa, nullptr);
    }
}

void print_due(Slot& s, int64_t now) {
    if (now < s.next_ns) return;
    // The kill's last line is in place before the first "still waiting"
    // line is out: a user (or a test) who sees that line and kills the
    // process at once gets the last line too.
    install_signal_lines();
    char line[kText + 512];
    int n =
        std::snprintf(line, sizeof line, "dyad: still waiting for %s: %lld s so far; %s\n", s.what,
                      static_cast<long long>((now - s.start_ns) / 1000000000LL), s.limit);
    if (n > 0) write_all(line, static_cast<size_t>(n) < sizeof line ? n : sizeof line - 1);
    s.gap = s.gap * 2 < WaitNotice::kLongestGap ? s.gap * 2 : WaitNotice::kLongestGap;
    s.next_ns = now + static_cast<int64_t>(s.gap * 1e9);
}

void notifier() {
    const pid_t me = ::getpid();
    for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        if (g_thread_pid.load() != me) return;  // cannot happen: a child has no such thread
        const int64_t now = now_ns();
        for (Slot& s : g_slots) {
            int active = kActive;
            if (!s.state.compare_exchange_strong(active, kReading)) continue;
            if (s.pid != me) {
                // A wait of the parent's, copied by fork: not this process's.
                s.state.store(kFree, std::memory_order_release);
                continue;
            }
            print_due(s, now);
            s.state.store(kActive, std::memory_order_release);
        }
    }
}

void start_notifier() {
    const pid_t me = ::getpid();
    pid_t seen = g_thread_pid.load();
    if (seen == me || !g_thread_pid.compare_exchange_strong(seen, me)) return;
    // A forked child's copy of g_signals_tried is the parent's, and so is
    // its handler (if any): nothing to do for it.
    try {
        std::thread(notifier).detach();
    } catch (...) {
        g_thread_pid.store(0);  // no thread: no lines (the wait itself goes on)
    }
}

}  // namespace

WaitNotice::WaitNotice(const std::string& what, const std::string& limit) {
    start_notifier();
    for (int i = 0; i < kSlots; ++i) {
        int free = kFree;
        if (!g_slots[i].state.compare_exchange_strong(free, kClaimed)) continue;
        Slot& s = g_slots[i];
        s.pid = ::getpid();
        s.start_ns = now_ns();
        s.gap = kFirstNotice;
        s.next_ns = s.start_ns + static_cast<int64_t>(kFirstNotice * 1e9);
        copy_text(s.what, sizeof s.what, what);
        copy_text(s.limit, sizeof s.limit, limit);
        s.state.store(kActive, std::memory_order_release);
        slot_ = i;
        return;
    }
}

WaitNotice::~WaitNotice() {
    if (slot_ < 0) return;
    Slot& s = g_slots[slot_];
    for (;;) {
        int st = s.state.load(std::memory_order_acquire);
        if (st == kReading) {
            std::this_thread::yield();  // the notifier is printing its line
            continue;
        }
        if (st != kActive || s.pid != ::getpid()) return;  // not this process's (cannot happen)
        if (s.state.compare_exchange_weak(st, kFree)) return;
    }
}

}  // namespace dyad::client
