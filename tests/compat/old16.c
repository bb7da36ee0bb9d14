/* SPDX-License-Identifier: Apache-2.0 */
/* A program as it was linked before upstream's 2026 API: the 16-argument
 * dyad_init of the original's header (declared here as that header did),
 * an unversioned reference. test_compat.py links it against a stand-in
 * library without symbol versions (old16_stub.c, SONAME libdyad.so.0), then
 * runs it against ours: the dynamic linker must bind it to the 16-argument
 * dyad_init. Usage: old16 CONSUMER_DIR; prints the context's fields. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef int dyad_rc_t;
struct dyad_ctx_before_2026 {
    void *h, *dtl_handle;
    const char* fname;
    bool use_fs_locks;
    char *prod_real_path, *cons_real_path;
    uint32_t lens_and_hashes[9];
    bool debug, check, reenter, initialized, shared_storage, async_publish, fsync_write;
    unsigned int key_depth, key_bins;
    uint32_t rank, service_mux, node_idx;
    int pid;
    char *kvs_namespace, *prod_managed_path, *cons_managed_path;
    bool relative_to_managed_path;
};
dyad_rc_t dyad_init(bool debug, bool check, bool shared_storage, bool reinit, bool async_publish,
                    bool fsync_write, unsigned int key_depth, unsigned int key_bins,
                    unsigned int service_mux, const char* kvs_namespace,
                    const char* prod_managed_path, const char* cons_managed_path,
                    bool relative_to_managed_path, const char* dtl_mode_str, int dtl_comm_mode,
                    void* flux_handle);
struct dyad_ctx_before_2026* dyad_ctx_get(void);
dyad_rc_t dyad_finalize(void);
extern const struct dyad_ctx_before_2026 dyad_ctx_default;

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    /* Values in the trailing registers and stack slots a 21-argument
     * dyad_init would read: garbage to it. */
    dyad_rc_t rc = dyad_init(false, false, false, false, false, false, 2, 64, 1, NULL, NULL,
                             argv[1], false, NULL, 1, NULL);
    struct dyad_ctx_before_2026* c = dyad_ctx_get();
    printf("rc=%d key_depth=%u key_bins=%u cons=%s default_key_bins=%u\n", rc, c ? c->key_depth : 0,
           c ? c->key_bins : 0, c && c->cons_managed_path ? c->cons_managed_path : "(null)",
           dyad_ctx_default.key_bins);
    dyad_finalize();
    return rc == 0 ? 0 : 1;
}
