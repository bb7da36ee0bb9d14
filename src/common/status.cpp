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
        case DYAD_RC_BADBUF:
            return "DYAD_RC_BADBUF";
        case DYAD_RC_BAD_B64DECODE:
            return "DYAD_RC_BAD_B64DECODE";
        case DYAD_RC_BAD_CLI_ARG_DEF:
            return "DYAD_RC_BAD_CLI_ARG_DEF";
        case DYAD_RC_BAD_CLI_PARSE:
            return "DYAD_RC_BAD_CLI_PARSE";
        case DYAD_RC_BAD_COMM_MODE:
            return "DYAD_RC_BAD_COMM_MODE";
        case DYAD_RC_FLUXFAIL:
            return "DYAD_RC_FLUXFAIL";
        case DYAD_RC_MARGOINIT_FAIL:
            return "DYAD_RC_MARGOINIT_FAIL";
        case DYAD_RC_MARGO_BAD_PROTO:
            return "DYAD_RC_MARGO_BAD_PROTO";
        case DYAD_RC_UCXCOMM_FAIL:
            return "DYAD_RC_UCXCOMM_FAIL";
        case DYAD_RC_UCXEP_FAIL:
            return "DYAD_RC_UCXEP_FAIL";
        case DYAD_RC_UCXINIT_FAIL:
            return "DYAD_RC_UCXINIT_FAIL";
        case DYAD_RC_UCXMMAP_FAIL:
            return "DYAD_RC_UCXMMAP_FAIL";
        case DYAD_RC_UCXRKEY_PACK_FAILED:
            return "DYAD_RC_UCXRKEY_PACK_FAILED";
        case DYAD_RC_UCXRKEY_UNPACK_FAILED:
            return "DYAD_RC_UCXRKEY_UNPACK_FAILED";
        case DYAD_RC_UCXWAIT_FAIL:
            return "DYAD_RC_UCXWAIT_FAIL";
        default:
            return "DYAD_RC_(other)";
    }
}

}  // namespace dyad
