/* DYAD return codes: same names and values as the original DYAD, plus codes
 * this implementation adds (marked "new"). Negative values are errors. */
#ifndef DYAD_COMMON_DYAD_RC_H
#define DYAD_COMMON_DYAD_RC_H

#ifdef __cplusplus
extern "C" {
#endif

enum dyad_core_return_codes {
    DYAD_RC_OK = 0,
    DYAD_RC_SYSFAIL = -1,
    DYAD_RC_NOCTX = -1000,
    DYAD_RC_BADMETADATA = -1001,
    DYAD_RC_BADFIO = -1002,
    DYAD_RC_BADMANAGEDPATH = -1003,
    DYAD_RC_BADDTLMODE = -1004,
    DYAD_RC_UNTRACKED = -1005,
    DYAD_RC_BAD_B64DECODE = -1006,
    DYAD_RC_BAD_COMM_MODE = -1007,
    DYAD_RC_BAD_CLI_ARG_DEF = -1008,
    DYAD_RC_BAD_CLI_PARSE = -1009,
    DYAD_RC_BADBUF = -1010,
    DYAD_RC_FLUXFAIL = -2000,
    DYAD_RC_BADCOMMIT = -2001,
    DYAD_RC_NOTFOUND = -2002,
    DYAD_RC_BADFETCH = -2003,
    DYAD_RC_BADRPC = -2004,
    DYAD_RC_BADPACK = -2005,
    DYAD_RC_BADUNPACK = -2006,
    DYAD_RC_RPC_FINISHED = -2007,
    DYAD_RC_TIMEOUT = -2008,     /* new: a wait or transfer passed its deadline */
    DYAD_RC_CONNFAIL = -2009,    /* new: the service could not be reached */
    DYAD_RC_BADCHECKSUM = -2010, /* new: received bytes do not match size/checksum */
    DYAD_RC_UCXINIT_FAIL = -3001,
    DYAD_RC_UCXWAIT_FAIL = -3002,
    DYAD_RC_UCXEP_FAIL = -3003,
    DYAD_RC_UCXCOMM_FAIL = -3004,
    DYAD_RC_UCXMMAP_FAIL = -3005,
    DYAD_RC_UCXRKEY_PACK_FAILED = -3006,
    DYAD_RC_UCXRKEY_UNPACK_FAILED = -3007,
    DYAD_RC_MARGOINIT_FAIL = -4001,
    DYAD_RC_MARGO_BAD_PROTO = -4002,
};

typedef enum dyad_core_return_codes dyad_rc_t;

#define DYAD_IS_ERROR(code) ((code) < 0)

#ifdef __cplusplus
}
#endif

#endif /* DYAD_COMMON_DYAD_RC_H */
