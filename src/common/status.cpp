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

const char* rc_name(dyad_rc_t rc) {
    switch (rc) {
        case DYAD_RC_OK:
            return "DYAD_RC_OK";
        case DYAD_RC_SYSFAIL:
            return "DYAD_RC_SYSFAIL";
        case DYAD_RC_NOCTX:
            return "DYAD_RC_NOCTX";
        case DYAD_RC_BADMETADATA:
            return "DYAD_RC_BADMETADATA";
        case DYAD_RC_BADFIO:
            return "DYAD_RC_BADFIO";
        case DYAD_RC_BADMANAGEDPATH:
            return "DYAD_RC_BADMANAGEDPATH";
        case DYAD_RC_BADDTLMODE:
            return "DYAD_RC_BADDTLMODE";
        case DYAD_RC_UNTRACKED:
            return "DYAD_RC_UNTRACKED";
        case DYAD_RC_NOTFOUND:
            return "DYAD_RC_NOTFOUND";
        case DYAD_RC_BADFETCH:
            return "DYAD_RC_BADFETCH";
        case DYAD_RC_BADRPC:
            return "DYAD_RC_BADRPC";
        case DYAD_RC_BADPACK:
            return "DYAD_RC_BADPACK";
        case DYAD_RC_BADUNPACK:
            return "DYAD_RC_BADUNPACK";
        case DYAD_RC_RPC_FINISHED:
            return "DYAD_RC_RPC_FINISHED";
        case DYAD_RC_BADCOMMIT:
            return "DYAD_RC_BADCOMMIT";
        case DYAD_RC_TIMEOUT:
            return "DYAD_RC_TIMEOUT";
        case DYAD_RC_CONNFAIL:
            return "DYAD_RC_CONNFAIL";
        case DYAD_RC_BADCHECKSUM:
            return "DYAD_RC_BADCHECKSUM";
        default:
            return "DYAD_RC_(other)";
    }
}

}  // namespace dyad
