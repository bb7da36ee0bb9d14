// SPDX-License-Identifier: Apache-2.0
// A point in time after which a wait gives up. Every blocking call takes one.
#pragma once

#include <chrono>
#include <climits>

namespace dyad {

class Deadline {
  public:
    using clock = std::chrono::steady_clock;
    static Deadline never() { return Deadline(); }
    static Deadline after(double seconds) {
        // Beyond ~30 years is "never" for us, and converting more would
        // overflow the clock's representation.
        if (!(seconds < 1e9)) return never();
        Deadline d;
        d.infinite_ = false;
        d.tp_ = clock::now() + std::chrono::duration_cast<clock::duration>(
                                   std::chrono::duration<double>(seconds < 0 ? 0 : seconds));
        return d;
    }
    bool infinite() const { return infinite_; }
    bool expired() const { return !infinite_ && clock::now() >= tp_; }
    // Seconds left (a large number when infinite).
    double remaining() const {
        if (infinite_) return 1e18;
        double r = std::chrono::duration<double>(tp_ - clock::now()).count();
        return r < 0 ? 0 : r;
    }
    // For poll(2): -1 when infinite, else ms left rounded up.
    int poll_ms() const {
        if (infinite_) return -1;
        double r = remaining() * 1000.0;
        if (r > INT_MAX / 2) return INT_MAX / 2;
        return static_cast<int>(r + 0.999);
    }
    // The earlier of two deadlines.
    Deadline min(const Deadline& o) const {
        if (infinite_) return o;
        if (o.infinite_) return *this;
        return tp_ <= o.tp_ ? *this : o;
    }

  private:
    bool infinite_ = true;
    clock::time_point tp_{};
};

}  // namespace dyad
