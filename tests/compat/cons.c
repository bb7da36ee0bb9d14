/* SPDX-License-Identifier: Apache-2.0 */
#define _DEFAULT_SOURCE /* mmap flags under -std=c11 */
/* A consumer written against the original DYAD's C API and names only.
 * Usage: cons MODE N DIR, MODE one of
 *   consume   dyad_consume each file
 *   metadata  dyad_get_metadata (waiting), then dyad_consume_w_metadata
 *   handmade  metadata built by hand with the original's two fields only, in
 *             exactly 16 bytes that end where readable memory ends
 * Checks every value; prints "File <i>: OK". */
#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The original's dyad_metadata_t, as code compiled against its header (or
 * Python's ctypes) lays it out: 16 bytes. */
struct original_metadata {
    char* fpath;
    uint32_t owner_rank;
};

static int check_file(const char* path, int i) {
    FILE* f = fopen(path, "rb");
    if (!f) return 0;
    int32_t v[64];
    size_t got = fread(v, sizeof v, 1, f);
    fclose(f);
    if (got != 1) return 0;
    for (int k = 0; k < 64; k++)
        if (v[k] != i * 64 + k) return 0;
    return 1;
}

int main(int argc, char** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: cons consume|metadata|handmade N DIR\n");
        return 2;
    }
    const char* mode = argv[1];
    int n = atoi(argv[2]);
    if (DYAD_IS_ERROR(dyad_init_env(DYAD_COMM_RECV, NULL))) return 1;
    dyad_ctx_t* ctx = dyad_ctx_get();
    long page = sysconf(_SC_PAGESIZE);
    /* Two pages, the second unreadable: the metadata ends at the boundary. */
    char* area = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED || mprotect(area + page, page, PROT_NONE) != 0) return 1;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        char path[4096], rel[64];
        snprintf(rel, sizeof rel, "data%d.bin", i);
        snprintf(path, sizeof path, "%s/%s", argv[3], rel);
        dyad_rc_t rc;
        if (strcmp(mode, "consume") == 0) {
            rc = dyad_consume(ctx, path);
        } else if (strcmp(mode, "metadata") == 0) {
            dyad_metadata_t* md = NULL;
            rc = dyad_get_metadata(ctx, path, true, &md);
            if (!DYAD_IS_ERROR(rc)) {
                if (strcmp(md->fpath, rel) != 0) {
                    fprintf(stderr, "fpath %s, expected %s\n", md->fpath, rel);
                    return 1;
                }
                rc = dyad_consume_w_metadata(ctx, path, md);
                dyad_free_metadata(&md);
                if (md != NULL) return 1;
            }
        } else {
            struct original_metadata* m =
                (struct original_metadata*)(area + page - sizeof(struct original_metadata));
            char* name = area; /* the path string lives in the same page */
            strcpy(name, rel);
            m->fpath = name;
            m->owner_rank = 0;
            rc = dyad_consume_w_metadata(ctx, path, (const dyad_metadata_t*)m);
        }
        if (DYAD_IS_ERROR(rc)) {
            fprintf(stderr, "%s: rc %d\n", path, (int)rc);
            return 1;
        }
        int good = check_file(path, i);
        printf("File %d: %s\n", i, good ? "OK" : "BAD");
        bad += !good;
    }
    dyad_finalize();
    return bad ? 1 : 0;
}
