/* SPDX-License-Identifier: Apache-2.0 */
/* New in this implementation: consume many files with several in flight
 * (lookups batched, fetches overlapped, answers in any order). Each file is
 * still installed whole and checked, exactly as dyad_consume would. */
#ifndef DYAD_CORE_DYAD_CONSUME_MANY_H
#define DYAD_CORE_DYAD_CONSUME_MANY_H

#include <stddef.h>
#include <dyad/common/dyad_rc.h>
#include <dyad/core/dyad_ctx.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Called once per file as it finishes, in any order, one call at a time, on
 * a thread of DYAD's (not necessarily the caller's): the file's index in
 * fnames, its code and, if it failed, the error's text (NULL on success;
 * valid during the call only). */
typedef void (*dyad_consume_done_fn)(void* arg, size_t index, dyad_rc_t rc, const char* error);

/* Consumes fnames[0..count-1] (consumer-managed paths; unmanaged ones are
 * left alone, as by dyad_consume) with up to `window` files in flight
 * (0: DYAD_CONSUME_WINDOW, default 16). Every file waits at most
 * DYAD_WAIT_TIMEOUT from the start of the call. rcs (may be NULL) receives
 * each file's code; done (may be NULL) is called as each finishes. Returns
 * DYAD_RC_OK when every file was consumed, else the code of the first file
 * of the list that failed, with dyad_last_error() saying how many failed and
 * why the first did. Returns when every file has finished. */
dyad_rc_t dyad_consume_many(dyad_ctx_t* ctx, const char* const* fnames, size_t count,
                            unsigned int window, dyad_rc_t* rcs, dyad_consume_done_fn done,
                            void* arg);

#ifdef __cplusplus
}
#endif

#endif /* DYAD_CORE_DYAD_CONSUME_MANY_H */
