/* SPDX-License-Identifier: Apache-2.0 */
/* The original DYAD's public layout and values, checked at compile time
 * against our headers (x86-64 / LP64), and the context's fields printed after
 * dyad_init_env as JSON, for the test to compare with the environment.
 * Built with -DDYAD_HAS_CONFIG=1 -ldyad_ctx only. */
#include <dyad/client/dyad_client.h>
#include <dyad/common/dyad_dtl.h>
#include <dyad/common/dyad_envs.h>
#include <dyad/common/dyad_rc.h>
#include <dyad/common/dyad_structures.h>
#include <dyad/core/dyad_ctx.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define AT(field, off) _Static_assert(offsetof(struct dyad_ctx, field) == off, #field " at " #off)
AT(h, 0);
AT(dtl_handle, 8);
AT(fname, 16);
AT(use_fs_locks, 24);
AT(prod_real_path, 32);
AT(cons_real_path, 40);
AT(prod_managed_len, 48);
AT(cons_managed_len, 52);
AT(prod_real_len, 56);
AT(cons_real_len, 60);
AT(prod_managed_hash, 64);
AT(cons_managed_hash, 68);
AT(prod_real_hash, 72);
AT(cons_real_hash, 76);
AT(delim_len, 80);
AT(debug, 84);
AT(check, 85);
AT(reenter, 86);
AT(initialized, 87);
AT(shared_storage, 88);
AT(async_publish, 89);
AT(fsync_write, 90);
AT(key_depth, 92);
AT(key_bins, 96);
AT(rank, 100);
AT(service_mux, 104);
AT(node_idx, 108);
AT(pid, 112);
AT(kvs_namespace, 120);
AT(prod_managed_path, 128);
AT(cons_managed_path, 136);
AT(relative_to_managed_path, 144);
/* Upstream's 2026 fields (its pull request #183) */
AT(cache_policy, 152);
AT(cache_policy_mode, 160);
AT(cache_capacity_bytes, 168);
AT(cache_low_watermark_frac, 176);
AT(cache_grace_period_sec, 184);
AT(origin_path, 192);
_Static_assert(sizeof(struct dyad_ctx) == 200, "struct dyad_ctx is 200 bytes");
_Static_assert(offsetof(dyad_metadata_t, fpath) == 0, "fpath at 0");
_Static_assert(offsetof(dyad_metadata_t, owner_rank) == 8, "owner_rank at 8");

#define EQ(name, value) _Static_assert((name) == (value), #name " == " #value)
EQ(DYAD_RC_OK, 0);
EQ(DYAD_RC_SYSFAIL, -1);
EQ(DYAD_RC_NOCTX, -1000);
EQ(DYAD_RC_BADMETADATA, -1001);
EQ(DYAD_RC_BADFIO, -1002);
EQ(DYAD_RC_BADMANAGEDPATH, -1003);
EQ(DYAD_RC_BADDTLMODE, -1004);
EQ(DYAD_RC_UNTRACKED, -1005);
EQ(DYAD_RC_BAD_B64DECODE, -1006);
EQ(DYAD_RC_BAD_COMM_MODE, -1007);
EQ(DYAD_RC_BAD_CLI_ARG_DEF, -1008);
EQ(DYAD_RC_BAD_CLI_PARSE, -1009);
EQ(DYAD_RC_BADBUF, -1010);
EQ(DYAD_RC_FLUXFAIL, -2000);
EQ(DYAD_RC_BADCOMMIT, -2001);
EQ(DYAD_RC_NOTFOUND, -2002);
EQ(DYAD_RC_BADFETCH, -2003);
EQ(DYAD_RC_BADRPC, -2004);
EQ(DYAD_RC_BADPACK, -2005);
EQ(DYAD_RC_BADUNPACK, -2006);
EQ(DYAD_RC_RPC_FINISHED, -2007);
EQ(DYAD_RC_UCXINIT_FAIL, -3001);
EQ(DYAD_RC_UCXWAIT_FAIL, -3002);
EQ(DYAD_RC_UCXEP_FAIL, -3003);
EQ(DYAD_RC_UCXCOMM_FAIL, -3004);
EQ(DYAD_RC_UCXMMAP_FAIL, -3005);
EQ(DYAD_RC_UCXRKEY_PACK_FAILED, -3006);
EQ(DYAD_RC_UCXRKEY_UNPACK_FAILED, -3007);
EQ(DYAD_RC_MARGOINIT_FAIL, -4001);
EQ(DYAD_COMM_NONE, 0);
EQ(DYAD_COMM_RECV, 1);
EQ(DYAD_COMM_SEND, 2);
EQ(DYAD_CACHE_NONE, 0);
EQ(DYAD_CACHE_LRU, 1);
EQ(DYAD_CACHE_FIFO, 2);
EQ(DYAD_COMM_END, 3);
EQ(DYAD_DTL_UCX, 0);
EQ(DYAD_DTL_MARGO, 1);
EQ(DYAD_DTL_FLUX_RPC, 2);
EQ(DYAD_DTL_DEFAULT, 2);
EQ(DYAD_DTL_END, 3);
_Static_assert(sizeof(DYAD_DTL_RPC_NAME) == sizeof("dyad.fetch"), "DYAD_DTL_RPC_NAME");
_Static_assert(sizeof(DYAD_CHECK_ENV) == sizeof("DYAD_SYNC_HEALTH"), "DYAD_CHECK_ENV");

static void str(const char* name, const char* v, const char* sep) {
    if (v)
        printf("\"%s\": \"%s\"%s", name, v, sep);
    else
        printf("\"%s\": null%s", name, sep);
}

int main(int argc, char** argv) {
    dyad_dtl_mode_t mode = DYAD_DTL_DEFAULT;
    dyad_ctx_t* before = dyad_ctx_get();
    if (strcmp(DYAD_DTL_RPC_NAME, "dyad.fetch") != 0 || strcmp(DYAD_CHECK_ENV, "DYAD_SYNC_HEALTH"))
        return 1;
    if (dyad_ctx_default.key_depth != 3 || dyad_ctx_default.key_bins != 1024 ||
        dyad_ctx_default.service_mux != 1 || dyad_ctx_default.pid != -1)
        return 1;
    if (DYAD_IS_ERROR(dyad_init_env(DYAD_COMM_RECV, NULL))) return 1;
    const struct dyad_ctx* c = dyad_ctx_get();
    printf("{\"null_before\": %s, \"mode\": %d, ", before == NULL ? "true" : "false", (int)mode);
    str("prod_managed_path", c->prod_managed_path, ", ");
    str("cons_managed_path", c->cons_managed_path, ", ");
    str("prod_real_path", c->prod_real_path, ", ");
    str("cons_real_path", c->cons_real_path, ", ");
    str("kvs_namespace", c->kvs_namespace, ", ");
    printf(
        "\"prod_managed_len\": %u, \"key_depth\": %u, \"key_bins\": %u, \"rank\": %u, "
        "\"node_idx\": %u, \"service_mux\": %u, \"pid\": %d, \"initialized\": %d, "
        "\"shared_storage\": %d, \"relative\": %d, \"debug\": %d",
        c->prod_managed_len, c->key_depth, c->key_bins, c->rank, c->node_idx, c->service_mux,
        c->pid, c->initialized, c->shared_storage, c->relative_to_managed_path, c->debug);
    /* The set functions change the fields in place. */
    int same = dyad_set_cons_path(argc > 1 ? argv[1] : NULL) == DYAD_RC_OK && dyad_ctx_get() == c;
    printf(", \"set_cons_same_ctx\": %d, ", same);
    str("cons_after_set", c->cons_managed_path, ", ");
    printf("\"bad_mode\": %d, ", (int)dyad_set_and_init_dtl_mode("NOPE", DYAD_COMM_RECV));
    printf("\"flux_rpc_mode\": %d, ", (int)dyad_set_and_init_dtl_mode("FLUX_RPC", DYAD_COMM_RECV));
    int cleared = (int)dyad_clear();
    printf("\"clear\": %d, \"initialized_after_clear\": %d, ", cleared, c->initialized);
    printf("\"produce_after_clear\": %d, ", (int)dyad_produce(dyad_ctx_get(), "/x"));
    printf("\"ctx_after_clear\": %s", dyad_ctx_get() == c ? "true" : "false");
    dyad_finalize();
    printf(", \"ctx_after_finalize\": %s}\n", dyad_ctx_get() == NULL ? "null" : "set");
    return 0;
}
