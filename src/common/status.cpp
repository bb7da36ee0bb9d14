// SPDX-License-Identifier: Apache-2.0
#include "status.hpp"

#include <cstring>

namespace dyad {

std::string Status::to_string() const {
    if (is_ok()) return "ok";
    std::string s = msg_;
    if (errno_ != 0) {
        s += ": ";
        s += std::strerror(errno_);
    }
    return s;
}

// All three from the one list in dyad_rc.h.
const char* rc_name(dyad_rc_t rc) {
    switch (rc) {
#define DYAD_RC_NAME_(name, value, exit_code, text) \
    case name:                                      \
        return #name;
        DYAD_RC_LIST(DYAD_RC_NAME_)
#undef DYAD_RC_NAME_
    }
    return "DYAD_RC_(other)";
}

const char* rc_text(dyad_rc_t rc) {
    switch (rc) {
#define DYAD_RC_TEXT_(name, value, exit_code, text) \
    case name:                                      \
        return text;
        DYAD_RC_LIST(DYAD_RC_TEXT_)
#undef DYAD_RC_TEXT_
    }
    return "unknown return code";
}

int rc_exit_code(dyad_rc_t rc) {
    switch (rc) {
#define DYAD_RC_EXIT_(name, value, exit_code, text) \
    case name:                                      \
        return exit_code;
        DYAD_RC_LIST(DYAD_RC_EXIT_)
#undef DYAD_RC_EXIT_
    }
    return 6;
}

}  // namespace dyad
