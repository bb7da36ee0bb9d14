/* SPDX-License-Identifier: Apache-2.0 */
/* Data transport layer names (same names and values as the original DYAD).
 *
 * DYAD_DTL_FLUX_RPC is served by this implementation's stream transport
 * (STREAM), DYAD_DTL_MARGO by its libfabric transport (OFI); the names
 * "FLUX_RPC", "MARGO", "UCX" are accepted wherever a transport is named
 * (DYAD_DTL_MODE, dyad_init, dyad_set_and_init_dtl_mode). */
#ifndef DYAD_COMMON_DYAD_DTL_H
#define DYAD_COMMON_DYAD_DTL_H

#if defined(DYAD_HAS_CONFIG)
#include <dyad/dyad_config.hpp>
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum dyad_dtl_mode {
    DYAD_DTL_UCX = 0,
    DYAD_DTL_MARGO = 1,
    DYAD_DTL_FLUX_RPC = 2,
    DYAD_DTL_DEFAULT = 2,
    DYAD_DTL_END = 3
};
typedef enum dyad_dtl_mode dyad_dtl_mode_t;

/* Direction of a transport connection (a consumer receives, a service sends). */
enum dyad_dtl_comm_mode {
    DYAD_COMM_NONE = 0,
    DYAD_COMM_RECV = 1,
    DYAD_COMM_SEND = 2,
    DYAD_COMM_END = 3
};
typedef enum dyad_dtl_comm_mode dyad_dtl_comm_mode_t;

/* The request a consumer sends to the owner's service for a file's bytes. */
#define DYAD_DTL_RPC_NAME "dyad.fetch"

/* Opaque. */
struct dyad_dtl;

#ifdef __cplusplus
}
#endif

#endif /* DYAD_COMMON_DYAD_DTL_H */
