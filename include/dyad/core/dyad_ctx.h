/* DYAD context: initialisation and teardown (same names as the original DYAD).
 *
 * Thread safety: there is one process-wide context; every function here and in
 * dyad_client.h may be called from any thread. dyad_finalize must not race with
 * calls that are still using the context. */
#ifndef DYAD_CORE_DYAD_CTX_H
#define DYAD_CORE_DYAD_CTX_H

#include <stdbool.h>
#include <dyad/common/dyad_rc.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dyad_dtl_comm_mode {
    DYAD_COMM_NONE = 0,
    DYAD_COMM_RECV = 1,
    DYAD_COMM_SEND = 2,
    DYAD_COMM_END = 3
} dyad_dtl_comm_mode_t;

/* Opaque: its layout is private (the original exposed it field by field). */
typedef struct dyad_ctx dyad_ctx_t;

/* The process's context, or NULL before a successful initialisation. */
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
 * DYAD_RC_NOCTX otherwise. */
dyad_rc_t dyad_init(bool debug, bool check, bool shared_storage, bool reinit, bool async_publish,
                    bool fsync_write, unsigned int key_depth, unsigned int key_bins,
                    unsigned int service_mux, const char* kvs_namespace,
                    const char* prod_managed_path, const char* cons_managed_path,
                    bool relative_to_managed_path, const char* dtl_mode_str,
                    const dyad_dtl_comm_mode_t dtl_comm_mode, void* flux_handle);

/* dyad_init with the values of DYAD's environment variables. */
dyad_rc_t dyad_init_env(const dyad_dtl_comm_mode_t dtl_comm_mode, void* flux_handle);

/* Tears the context down. Always DYAD_RC_OK. */
dyad_rc_t dyad_finalize(void);

/* New: text of the last error that happened on the calling thread ("" if none).
 * Valid until the thread's next DYAD call. */
const char* dyad_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* DYAD_CORE_DYAD_CTX_H */
