/* SPDX-License-Identifier: Apache-2.0 */
/* The node-local cache policies (upstream DYAD's names and values since 2026),
 * for struct dyad_ctx's cache_policy_mode. */
#ifndef DYAD_COMMON_DYAD_CACHE_H
#define DYAD_COMMON_DYAD_CACHE_H

#if defined(DYAD_HAS_CONFIG)
#include <dyad/dyad_config.hpp>
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum dyad_cache_policy_mode {
    DYAD_CACHE_NONE = 0,    /* nothing is evicted */
    DYAD_CACHE_LRU = 1,     /* least recently accessed first (the default) */
    DYAD_CACHE_FIFO = 2,    /* oldest first */
    DYAD_CACHE_DEFAULT = 1, /* = DYAD_CACHE_LRU */
    DYAD_CACHE_END = 3
};
typedef enum dyad_cache_policy_mode dyad_cache_policy_mode_t;

/* Opaque (upstream's policy handle); ctx->cache_policy is always NULL here. */
struct dyad_cache_policy;

#ifdef __cplusplus
}
#endif

#endif /* DYAD_COMMON_DYAD_CACHE_H */
