/* SPDX-License-Identifier: Apache-2.0 */
/* DYAD return codes: same names and values as the original DYAD, plus codes
 * this implementation adds (marked "new"). Negative values are errors. */
#ifndef DYAD_COMMON_DYAD_RC_H
#define DYAD_COMMON_DYAD_RC_H

#if defined(DYAD_HAS_CONFIG)
#include <dyad/dyad_config.hpp>
#endif

/* The original's attribute macros, for code that uses them. */
#ifndef DYAD_DLL_EXPORTED
#define DYAD_DLL_EXPORTED
#endif
#ifndef DYAD_DLL_HIDDEN
#define DYAD_DLL_HIDDEN __attribute__((__visibility__("hidden")))
#endif
#ifndef DYAD_PFA_ANNOTATE
#define DYAD_PFA_ANNOTATE
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The one list of return codes: X(NAME, VALUE, EXIT, MEANING), where EXIT
 * is the `dyad` tool's exit status for it. The enum, the names and messages
 * (rc_name, rc_text in the C++ code) and the tool's exit codes come from
 * here; the Python package's DyadRC is checked against it by a test. Codes
 * this implementation adds: TIMEOUT, CONNFAIL, BADCHECKSUM. */
#define DYAD_RC_LIST(X)                                                            \
    X(DYAD_RC_OK, 0, 0, "success")                                                 \
    X(DYAD_RC_SYSFAIL, -1, 6, "a system call failed")                              \
    X(DYAD_RC_NOCTX, -1000, 1, "no usable context (bad configuration)")            \
    X(DYAD_RC_BADMETADATA, -1001, 6, "bad or mismatched metadata record")          \
    X(DYAD_RC_BADFIO, -1002, 2, "file I/O failed")                                 \
    X(DYAD_RC_BADMANAGEDPATH, -1003, 1, "bad managed directory")                   \
    X(DYAD_RC_BADDTLMODE, -1004, 1, "unknown or unavailable transport")            \
    X(DYAD_RC_UNTRACKED, -1005, 2, "path outside the managed directories")         \
    X(DYAD_RC_BAD_B64DECODE, -1006, 6, "bad base64 data")                          \
    X(DYAD_RC_BAD_COMM_MODE, -1007, 6, "bad communication mode")                   \
    X(DYAD_RC_BAD_CLI_ARG_DEF, -1008, 6, "bad command-line argument definition")   \
    X(DYAD_RC_BAD_CLI_PARSE, -1009, 6, "bad command-line arguments")               \
    X(DYAD_RC_BADBUF, -1010, 6, "bad buffer")                                      \
    X(DYAD_RC_FLUXFAIL, -2000, 6, "Flux call failed (unused here)")                \
    X(DYAD_RC_BADCOMMIT, -2001, 6, "publishing the metadata failed")               \
    X(DYAD_RC_NOTFOUND, -2002, 2, "not produced (yet)")                            \
    X(DYAD_RC_BADFETCH, -2003, 5, "the transfer failed")                           \
    X(DYAD_RC_BADRPC, -2004, 6, "protocol error")                                  \
    X(DYAD_RC_BADPACK, -2005, 6, "cannot encode a message")                        \
    X(DYAD_RC_BADUNPACK, -2006, 6, "cannot decode a message")                      \
    X(DYAD_RC_RPC_FINISHED, -2007, 6, "the request already finished")              \
    X(DYAD_RC_TIMEOUT, -2008, 3, "a wait or transfer passed its deadline")         \
    X(DYAD_RC_CONNFAIL, -2009, 4, "the service could not be reached")              \
    X(DYAD_RC_BADCHECKSUM, -2010, 5, "received bytes do not match size/checksum")  \
    X(DYAD_RC_NOAUTH, -2011, 4, "authentication failed or not permitted")          \
    X(DYAD_RC_UCXINIT_FAIL, -3001, 6, "UCX initialization failed")                 \
    X(DYAD_RC_UCXWAIT_FAIL, -3002, 6, "UCX wait failed")                           \
    X(DYAD_RC_UCXEP_FAIL, -3003, 6, "UCX endpoint failed")                         \
    X(DYAD_RC_UCXCOMM_FAIL, -3004, 6, "UCX communication failed")                  \
    X(DYAD_RC_UCXMMAP_FAIL, -3005, 6, "UCX memory registration failed")            \
    X(DYAD_RC_UCXRKEY_PACK_FAILED, -3006, 6, "UCX rkey pack failed")               \
    X(DYAD_RC_UCXRKEY_UNPACK_FAILED, -3007, 6, "UCX rkey unpack failed")           \
    X(DYAD_RC_MARGOINIT_FAIL, -4001, 6, "libfabric (MARGO) initialization failed") \
    X(DYAD_RC_MARGO_BAD_PROTO, -4002, 6, "unavailable libfabric protocol")

enum dyad_core_return_codes {
#define DYAD_RC_ENUM_ENTRY_(name, value, exit_code, text) name = value,
    DYAD_RC_LIST(DYAD_RC_ENUM_ENTRY_)
#undef DYAD_RC_ENUM_ENTRY_
};

typedef enum dyad_core_return_codes dyad_rc_t;

#define DYAD_IS_ERROR(code) ((code) < 0)
#define FLUX_IS_ERROR(code) ((code) < 0)

#ifdef __cplusplus
}
#endif

#endif /* DYAD_COMMON_DYAD_RC_H */
