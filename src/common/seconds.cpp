// SPDX-License-Identifier: Apache-2.0
#include "seconds.hpp"

#include <cstdio>

namespace dyad {

std::string seconds_text(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", s);
    return b;
}

std::string seconds_text(std::optional<double> s) {
    return s ? seconds_text(*s) : std::string("inf");
}

}  // namespace dyad
