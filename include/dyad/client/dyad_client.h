/* SPDX-License-Identifier: Apache-2.0 */
/* DYAD client API: produce and consume files (same names as the original DYAD). */
#ifndef DYAD_CLIENT_DYAD_CLIENT_H
#define DYAD_CLIENT_DYAD_CLIENT_H

#if defined(DYAD_HAS_CONFIG)
#include <dyad/dyad_config.hpp>
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <dyad/common/dyad_rc.h>
#include <dyad/common/dyad_structures.h>
#include <dyad/core/dyad_ctx.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where a file lives. The first two fields are those of the original DYAD. */
struct dyad_metadata {
    char* fpath;         /* path relative to the managed directory */
    uint32_t owner_rank; /* numeric id of the owner's node */
    char* owner_service; /* id of the owning service */
    char* owner_node;    /* node name of the owning service */
    uint64_t size;       /* bytes */
    int64_t mtime_ns;    /* producer-side modification time */
    uint64_t generation; /* 1 on first produce, +1 on each re-produce; larger after a
                           restart of the store host (epoch << 32, docs/design.md) */
    char* record;        /* the serialized record (used by dyad_consume_w_metadata) */
};
typedef struct dyad_metadata dyad_metadata_t;

/* Publishes fname (a path under the producer-managed directory). Unmanaged
 * paths are ignored (DYAD_RC_OK). */
dyad_rc_t dyad_produce(dyad_ctx_t* ctx, const char* fname);

/* Looks up the metadata of fname (consumer-managed). should_wait blocks until
 * the file is produced or DYAD_WAIT_TIMEOUT passes (DYAD_RC_TIMEOUT). Without
 * waiting, an absent file is DYAD_RC_NOTFOUND. Unmanaged: DYAD_RC_UNTRACKED.
 * *mdata is set only on success; free it with dyad_free_metadata. */
dyad_rc_t dyad_get_metadata(dyad_ctx_t* ctx, const char* fname, bool should_wait,
                            dyad_metadata_t** mdata);

dyad_rc_t dyad_free_metadata(dyad_metadata_t** mdata);

/* Waits for fname to be produced, then brings it into the consumer-managed
 * directory. The file appears whole or not at all. */
dyad_rc_t dyad_consume(dyad_ctx_t* ctx, const char* fname);

/* As dyad_consume, with metadata from dyad_get_metadata (no lookup, except
 * when the owner answers that the file was produced again since: then, as
 * dyad_consume does, it is looked up again and fetched again, at most 3
 * times). */
dyad_rc_t dyad_consume_w_metadata(dyad_ctx_t* ctx, const char* fname, const dyad_metadata_t* mdata);

/* Bytes [offset, offset + length) of fname (consumer-managed) in memory; no
 * file is written. Waits for fname to be produced, as dyad_consume does.
 * The bytes are read with pread when the file is on this node already (the
 * producer's directory is this one, or a copy of this produce was consumed
 * here); otherwise only the range travels from the owner, over any transport
 * (FLUX_RPC, UCX, MARGO, LOCAL, AUTO), checked against its size and
 * checksum. On success *data is a buffer the caller frees with free() and
 * *data_len == length; an empty range (length 0) gives a non-NULL buffer and
 * *data_len 0. On failure *data is NULL and *data_len 0.
 * Errors: DYAD_RC_BADFIO for a range past the end of the file (no bytes are
 * returned, not a shorter range); DYAD_RC_BADMANAGEDPATH without a consumer
 * directory or for a path outside it; DYAD_RC_TIMEOUT (DYAD_WAIT_TIMEOUT);
 * DYAD_RC_BADFETCH / DYAD_RC_BADCHECKSUM when the transfer fails. The bytes
 * are always those of one produce: a file produced again meanwhile is read
 * from its newest produce. dyad_last_error() says what went wrong. */
dyad_rc_t dyad_consume_range(dyad_ctx_t* ctx, const char* fname, size_t offset, size_t length,
                             void** data, size_t* data_len);

/* New: as dyad_consume_range, into the caller's buffer `buf` (room for
 * `length` bytes; may be NULL when length is 0): DYAD allocates nothing. On
 * failure the buffer's content is undefined and *data_len is 0. */
dyad_rc_t dyad_consume_range_into(dyad_ctx_t* ctx, const char* fname, size_t offset, size_t length,
                                  void* buf, size_t* data_len);

#ifdef __cplusplus
}
#endif

#endif /* DYAD_CLIENT_DYAD_CLIENT_H */
