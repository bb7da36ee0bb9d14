/* SPDX-License-Identifier: Apache-2.0 */
/* DYAD's C demo, consumer side: waits for data<i>.txt (i < N) in DIR, brings
 * each here and checks its 10 int32 values. Exit 1 on a wrong value, 2 on a
 * DYAD error. Usage: c_cons N DIR (DIR must be DYAD_PATH_CONSUMER or inside it). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s N DIR\n", argv[0]);
        return 1;
    }
    int n = atoi(argv[1]);
    if (DYAD_IS_ERROR(dyad_init_env(DYAD_COMM_RECV, NULL))) {
        fprintf(stderr, "c_cons: %s\n", dyad_last_error());
        return 2;
    }
    dyad_ctx_t* ctx = dyad_ctx_get();
    for (int i = 0; i < n; ++i) {
        char path[4096];
        snprintf(path, sizeof path, "%s/data%d.txt", argv[2], i);
        if (DYAD_IS_ERROR(dyad_consume(ctx, path))) {
            fprintf(stderr, "c_cons: %s\n", dyad_last_error());
            return 2;
        }
        int fd = open(path, O_RDONLY);
        int v[10];
        if (fd < 0 || read(fd, v, sizeof v) != (ssize_t)sizeof v) {
            perror(path);
            return 2;
        }
        close(fd);
        for (int k = 0; k < 10; ++k) {
            if (v[k] != i * 10 + k) {
                fprintf(stderr, "File %d validation: BAD (value %d is %d, expected %d)\n", i, k,
                        v[k], i * 10 + k);
                return 1;
            }
        }
        printf("File %d validation: OK\n", i);
    }
    dyad_finalize();
    return 0;
}
