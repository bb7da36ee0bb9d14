/* SPDX-License-Identifier: Apache-2.0 */
/* DYAD context: initialisation and teardown (same names as the original DYAD).
 *
 * Thread safety: there is one process-wide context; every function here and in
 * dyad_client.h may be called from any thread. dyad_finalize must not race with
 * calls that are still using the context. */
#ifndef DYAD_CORE_DYAD_CTX_H
#define DYAD_CORE_DYAD_CTX_H

#if defined(DYAD_HAS_CONFIG)
#include <dyad/dyad_config.hpp>
#endif

#include <stdbool.h>
#include <stdint.h>
#include <dyad/common/dyad_cache.h>
#include <dyad/common/dyad_dtl.h>
#include <dyad/common/dyad_rc.h>
#include <dyad/common/dyad_structures.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The context, with the original DYAD's layout (x86-64: 200 bytes since
 * upstream's 2026 fields; the first 152 bytes are the earlier layout), so that
 * code reading its fields (the original pydyad through ctypes, data loaders
 * comparing ranks) works unchanged. After dyad_init/dyad_init_env the
 * user-facing fields hold the configuration in effect; the dyad_set_*
 * functions keep them current. Treat every field as read-only. This
 * implementation's own state hangs off `h` (the original's Flux handle). */
struct dyad_ctx {
    void* h;                     /* this implementation's state (opaque) */
    struct dyad_dtl* dtl_handle; /* always NULL here */
    const char* fname;           /* always NULL here */
    bool use_fs_locks;           /* the wrapper's advisory locks (always true) */
    char* prod_real_path;        /* producer directory, symbolic links resolved */
    char* cons_real_path;        /* consumer directory, symbolic links resolved */
    uint32_t prod_managed_len;   /* strlen(prod_managed_path) */
    uint32_t cons_managed_len;   /* strlen(cons_managed_path) */
    uint32_t prod_real_len;      /* strlen(prod_real_path) */
    uint32_t cons_real_len;      /* strlen(cons_real_path) */
    uint32_t prod_managed_hash;  /* hashes of the four paths (0 if unset) */
    uint32_t cons_managed_hash;
    uint32_t prod_real_hash;
    uint32_t cons_real_hash;
    uint32_t delim_len;            /* strlen("/") */
    bool debug;                    /* DYAD_SYNC_DEBUG */
    bool check;                    /* DYAD_SYNC_CHECK */
    bool reenter;                  /* false while DYAD itself is opening files */
    bool initialized;              /* true once dyad_init succeeded */
    bool shared_storage;           /* DYAD_SHARED_STORAGE */
    bool async_publish;            /* DYAD_ASYNC_PUBLISH */
    bool fsync_write;              /* DYAD_FSYNC_WRITE */
    unsigned int key_depth;        /* DYAD_KEY_DEPTH */
    unsigned int key_bins;         /* DYAD_KEY_BINS */
    uint32_t rank;                 /* this node's rank (its service's), see docs */
    uint32_t service_mux;          /* DYAD_SERVICE_MUX */
    uint32_t node_idx;             /* rank / service_mux */
    int pid;                       /* getpid() at initialisation */
    char* kvs_namespace;           /* namespace in effect */
    char* prod_managed_path;       /* DYAD_PATH_PRODUCER, or NULL */
    char* cons_managed_path;       /* DYAD_PATH_CONSUMER, or NULL */
    bool relative_to_managed_path; /* DYAD_PATH_RELATIVE */
    /* Added by upstream DYAD in 2026 (its pull request #183): */
    struct dyad_cache_policy* cache_policy; /* always NULL here */
    int cache_policy_mode;                  /* DYAD_CACHE_NONE, _LRU or _FIFO */
    uint64_t cache_capacity_bytes;          /* DYAD_CACHE_CAPACITY (0: no cache bound) */
    double cache_low_watermark_frac;        /* DYAD_CACHE_LOW_WATERMARK */
    unsigned int cache_grace_period_sec;    /* DYAD_CACHE_GRACE_PERIOD */
    char* origin_path;                      /* DYAD_PATH_ORIGIN, or NULL */
};

/* ctx->rank while this node's rank is not known yet (service unreachable). */
#define DYAD_RANK_UNKNOWN UINT32_MAX

/* A context's fields before initialisation (the original's defaults). */
extern const struct dyad_ctx dyad_ctx_default;

/* The process's context, or NULL before a successful initialisation. The
 * pointer stays the same for the life of the process. */
dyad_ctx_t* dyad_ctx_get(void);

/* dyad_init_env; on failure logs the reason and leaves no context. The
 * flux_handle argument is accepted for compatibility and ignored. */
void dyad_ctx_init(const dyad_dtl_comm_mode_t comm_mode, void* flux_handle);

/* dyad_finalize if a context exists. */
void dyad_ctx_fini(void);

/* Initialises the context from explicit values. No-op returning DYAD_RC_OK if
 * already initialised and reinit is false. With neither managed path set DYAD
 * stays inert (DYAD_RC_OK, warning). kvs_namespace may be NULL or empty: the
 * namespace of the node's service is used. Returns DYAD_RC_BADDTLMODE for an
 * unknown or unavailable transport, DYAD_RC_BADMANAGEDPATH for an empty path,
 * DYAD_RC_NOCTX otherwise (a bad cache setting included).
 *
 * The last five arguments are upstream DYAD's since 2026: cache capacity in
 * bytes (0: unbounded), cache policy ("LRU", "FIFO" or "NONE"; NULL or "":
 * LRU), low watermark (fraction of the capacity evicted down to, in (0, 1]),
 * grace period (seconds a file is never evicted after its last access) and
 * origin path (NULL or "": none). Binaries linked before they existed call
 * the 16-argument dyad_init they were linked with (symbol versions, see
 * docs/migrating-from-dyad.md); source code still written for it defines
 * DYAD_INIT_16_ARGS before including this header. */
#if defined(DYAD_INIT_16_ARGS)
dyad_rc_t dyad_init(bool debug, bool check, bool shared_storage, bool reinit, bool async_publish,
                    bool fsync_write, unsigned int key_depth, unsigned int key_bins,
                    unsigned int service_mux, const char* kvs_namespace,
                    const char* prod_managed_path, const char* cons_managed_path,
                    bool relative_to_managed_path, const char* dtl_mode_str,
                    const dyad_dtl_comm_mode_t dtl_comm_mode,
                    void* flux_handle) __asm__("dyad_init_16");
#else
dyad_rc_t dyad_init(bool debug, bool check, bool shared_storage, bool reinit, bool async_publish,
                    bool fsync_write, unsigned int key_depth, unsigned int key_bins,
                    unsigned int service_mux, const char* kvs_namespace,
                    const char* prod_managed_path, const char* cons_managed_path,
                    bool relative_to_managed_path, const char* dtl_mode_str,
                    const dyad_dtl_comm_mode_t dtl_comm_mode, void* flux_handle,
                    uint64_t cache_capacity_bytes, const char* cache_policy,
                    double cache_low_watermark, unsigned int cache_grace_period_sec,
                    const char* origin_path);
#endif

/* The 16-argument dyad_init of DYAD before 2026 (the five new settings take
 * their defaults, or DYAD_CACHE_* / DYAD_PATH_ORIGIN from the environment). */
dyad_rc_t dyad_init_16(bool debug, bool check, bool shared_storage, bool reinit, bool async_publish,
                       bool fsync_write, unsigned int key_depth, unsigned int key_bins,
                       unsigned int service_mux, const char* kvs_namespace,
                       const char* prod_managed_path, const char* cons_managed_path,
                       bool relative_to_managed_path, const char* dtl_mode_str,
                       const dyad_dtl_comm_mode_t dtl_comm_mode, void* flux_handle);

/* dyad_init with the values of DYAD's environment variables. */
dyad_rc_t dyad_init_env(const dyad_dtl_comm_mode_t dtl_comm_mode, void* flux_handle);

/* Change the producer (consumer) directory of the initialised context; NULL
 * or "" unsets it. DYAD_RC_NOCTX before initialisation. */
dyad_rc_t dyad_set_prod_path(const char* path);
dyad_rc_t dyad_set_cons_path(const char* path);

/* Change the transport ("UCX", "MARGO", "FLUX_RPC", or this implementation's
 * names, see DYAD_DTL_MODE). DYAD_RC_BADDTLMODE if unknown or unavailable. */
dyad_rc_t dyad_set_and_init_dtl_mode(const char* dtl_mode_name, dyad_dtl_comm_mode_t dtl_comm_mode);

/* Resets the context's fields to dyad_ctx_default and releases what it holds,
 * without freeing the context: dyad_ctx_get keeps returning it, and calls
 * through it fail with DYAD_RC_NOCTX until the next dyad_init. */
dyad_rc_t dyad_clear(void);

/* Tears the context down. Always DYAD_RC_OK. */
dyad_rc_t dyad_finalize(void);

/* New: text of the last error that happened on the calling thread ("" if none).
 * Valid until the thread's next DYAD call. */
const char* dyad_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* DYAD_CORE_DYAD_CTX_H */
