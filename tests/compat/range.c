/* SPDX-License-Identifier: Apache-2.0 */
/* A consumer written against upstream DYAD's 2026 API only (its pull request
 * #183): dyad_init with 21 arguments and dyad_consume_range.
 * Usage: range FILE OFFSET:LENGTH...
 * Initialises with the consumer directory and transport of DYAD_PATH_CONSUMER
 * and DYAD_DTL_MODE, a 64 MiB FIFO cache, watermark 0.5, grace 7 s; prints
 * the context's cache fields, then per range "OFFSET LENGTH rc=RC len=N
 * fnv=HEX null=0|1" (FNV-1a 64 of the bytes; null: *data was NULL). */
#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fnv1a(const unsigned char* p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: range FILE OFFSET:LENGTH...\n");
        return 2;
    }
    dyad_rc_t rc = dyad_init(false, false, false, false, false, false, 3, 1024, 1, NULL, NULL,
                             getenv("DYAD_PATH_CONSUMER"), false, getenv("DYAD_DTL_MODE"),
                             DYAD_COMM_RECV, NULL, 64u << 20, "FIFO", 0.5, 7, NULL);
    if (DYAD_IS_ERROR(rc)) {
        fprintf(stderr, "dyad_init: %d\n", (int)rc);
        return 1;
    }
    dyad_ctx_t* ctx = dyad_ctx_get();
    printf("cache mode=%d capacity=%" PRIu64 " watermark=%.2f grace=%u origin=%s\n",
           ctx->cache_policy_mode, ctx->cache_capacity_bytes, ctx->cache_low_watermark_frac,
           ctx->cache_grace_period_sec, ctx->origin_path ? ctx->origin_path : "(null)");
    for (int i = 2; i < argc; i++) {
        unsigned long long off = 0, len = 0;
        if (sscanf(argv[i], "%llu:%llu", &off, &len) != 2) return 2;
        void* data = (void*)1; /* must be cleared on failure */
        size_t n = 12345;
        rc = dyad_consume_range(ctx, argv[1], (size_t)off, (size_t)len, &data, &n);
        uint64_t h = data && !DYAD_IS_ERROR(rc) ? fnv1a((const unsigned char*)data, n) : 0;
        printf("%llu %llu rc=%d len=%zu fnv=%016" PRIx64 " null=%d\n", off, len, (int)rc, n, h,
               data == NULL);
        if (!DYAD_IS_ERROR(rc)) free(data);
    }
    dyad_finalize();
    return 0;
}
