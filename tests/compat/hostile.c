/* SPDX-License-Identifier: Apache-2.0 */
#define _DEFAULT_SOURCE /* mmap flags under -std=c11 */
/* Metadata that is not what it claims: must give clear errors, never crash.
 * Usage: hostile PATH (a consumer-managed path of a produced file). Prints
 * one "<case> <rc>" line per case. */
#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct original_metadata {
    char* fpath;
    uint32_t owner_rank;
};

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    if (DYAD_IS_ERROR(dyad_init_env(DYAD_COMM_RECV, NULL))) return 1;
    dyad_ctx_t* ctx = dyad_ctx_get();
    long page = sysconf(_SC_PAGESIZE);
    char* area = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED || mprotect(area + page, page, PROT_NONE) != 0) return 1;
    char* hole = area + page;
    struct original_metadata* m = (struct original_metadata*)area;

    /* The metadata pointer itself points at unreadable memory. */
    printf("unreadable_struct %d\n",
           (int)dyad_consume_w_metadata(ctx, argv[1], (dyad_metadata_t*)hole));
    /* fpath points at unreadable memory. */
    m->fpath = hole;
    printf("unreadable_fpath %d\n",
           (int)dyad_consume_w_metadata(ctx, argv[1], (dyad_metadata_t*)m));
    /* fpath runs into unreadable memory without a terminating NUL. */
    memset(area + 64, 'a', (size_t)page - 64);
    m->fpath = area + 64;
    printf("unterminated_fpath %d\n",
           (int)dyad_consume_w_metadata(ctx, argv[1], (dyad_metadata_t*)m));
    /* fpath names another file. */
    m->fpath = "someone/else.bin";
    printf("other_file %d\n", (int)dyad_consume_w_metadata(ctx, argv[1], (dyad_metadata_t*)m));
    printf("other_file_error %s\n", dyad_last_error());
    /* Freeing metadata this library did not allocate: refused, not freed. */
    dyad_metadata_t* mine = (dyad_metadata_t*)m;
    printf("free_foreign %d\n", (int)dyad_free_metadata(&mine));
    dyad_finalize();
    return 0;
}
