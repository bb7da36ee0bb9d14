/* SPDX-License-Identifier: Apache-2.0 */
/* One side of the metadata-store benchmark (bench/store_bench.py), through
 * DYAD's C API in the node's environment (DYAD_SERVICE_URI, DYAD_PATH_*).
 * Reads one relative name per line on stdin and answers one line each:
 *   produce: writes the file, publishes it: "T0 T1" (before, after dyad_produce)
 *   publish: publishes the file (written already): "T0 T1"
 *   consume: "ready", then waits for the file's metadata: "T" (woken)
 *   lookup:  metadata without waiting: "T0 T1 RC"
 * Times are CLOCK_MONOTONIC seconds, comparable between processes. */
#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s produce|publish|consume|lookup DIR\n", argv[0]);
        return 2;
    }
    const char* mode = argv[1];
    const char* dir = argv[2];
    if (dyad_init_env(DYAD_COMM_RECV, NULL) != DYAD_RC_OK) {
        fprintf(stderr, "store_wake: dyad_init_env failed\n");
        return 1;
    }
    dyad_ctx_t* ctx = dyad_ctx_get();
    char line[1024], path[2048];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        snprintf(path, sizeof path, "%s/%s", dir, line);
        if (!strcmp(mode, "produce") || !strcmp(mode, "publish")) {
            if (!strcmp(mode, "produce")) {
                FILE* f = fopen(path, "w");
                if (!f) {
                    perror(path);
                    return 1;
                }
                fputs("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", f);
                fclose(f);
            }
            double t0 = now();
            dyad_rc_t rc = dyad_produce(ctx, path);
            double t1 = now();
            if (rc != DYAD_RC_OK) {
                fprintf(stderr, "store_wake: produce %s: %d\n", path, (int)rc);
                return 1;
            }
            printf("%.9f %.9f\n", t0, t1);
        } else if (!strcmp(mode, "consume")) {
            printf("ready\n");
            fflush(stdout);
            dyad_metadata_t* md = NULL;
            dyad_rc_t rc = dyad_get_metadata(ctx, path, true, &md);
            double t = now();
            if (rc != DYAD_RC_OK) {
                fprintf(stderr, "store_wake: wait %s: %d\n", path, (int)rc);
                return 1;
            }
            dyad_free_metadata(&md);
            printf("%.9f\n", t);
        } else {
            dyad_metadata_t* md = NULL;
            double t0 = now();
            dyad_rc_t rc = dyad_get_metadata(ctx, path, false, &md);
            double t1 = now();
            if (md) dyad_free_metadata(&md);
            printf("%.9f %.9f %d\n", t0, t1, (int)rc);
        }
        fflush(stdout);
    }
    dyad_finalize();
    return 0;
}
