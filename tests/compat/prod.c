/* SPDX-License-Identifier: Apache-2.0 */
/* A producer written against the original DYAD's C API and names only
 * (built like its users build: -DDYAD_HAS_CONFIG=1 -ldyad_client -ldyad_ctx).
 * Usage: prod N DIR. Writes DIR/data<i>.bin (64 int32 values from i*64) and
 * produces each. */
#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: prod N DIR\n");
        return 2;
    }
    int n = atoi(argv[1]);
    dyad_ctx_init(DYAD_COMM_SEND, NULL);
    dyad_ctx_t* ctx = dyad_ctx_get();
    if (ctx == NULL) {
        fprintf(stderr, "no DYAD context\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/data%d.bin", argv[2], i);
        FILE* f = fopen(path, "wb");
        if (!f) return 1;
        int32_t v[64];
        for (int k = 0; k < 64; k++) v[k] = i * 64 + k;
        if (fwrite(v, sizeof v, 1, f) != 1) return 1;
        fclose(f);
        dyad_rc_t rc = dyad_produce(ctx, path);
        if (DYAD_IS_ERROR(rc)) {
            fprintf(stderr, "dyad_produce(%s) = %d\n", path, (int)rc);
            return 1;
        }
        printf("produced %d\n", i);
    }
    dyad_ctx_fini();
    return 0;
}
