// SPDX-License-Identifier: Apache-2.0
#include "seconds.hpp"

#include <cstdio>
#include <ctime>

namespace dyad {

std::string seconds_text(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", s);
    return b;
}

std::string seconds_human(double s) {
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

std::string seconds_tenths(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f", s);
    return b;
}

std::string utc_text(std::chrono::system_clock::time_point t) {
    std::time_t s = std::chrono::system_clock::to_time_t(t);
    std::tm tm{};
    ::gmtime_r(&s, &tm);
    char b[32];
    std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return b;
}

std::string seconds_text(std::optional<double> s) {
    return s ? seconds_text(*s) : std::string("inf");
}

}  // namespace dyad
