// SPDX-License-Identifier: Apache-2.0
// Seconds in messages and logs, written one way, and the time since a
// point of the steady clock.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace dyad {

// "%g": "30", "2.5", "0.001", "1e+06"; nullopt (a wait without a deadline):
// "inf". Messages add the unit themselves ("... within 30 s").
std::string seconds_text(double s);
std::string seconds_text(std::optional<double> s);

// For people (a progress line, a wait's message): "<1 s", "42 s",
// "3 min 07 s", "2 h 05 min".
std::string seconds_human(double s);

// "%.1f": "0.3", "12.0" (a store's outage, a start's progress).
std::string seconds_tenths(double s);

// A moment of the system clock as UTC, to the second: "2026-12-02T15:04:05Z".
std::string utc_text(std::chrono::system_clock::time_point t);

// Seconds from t0 to now, on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace dyad
