/* SPDX-License-Identifier: Apache-2.0 */
/* DYAD's C demo, producer side: writes N files data<i>.txt of 10 int32
 * (i*10 .. i*10+9) into DIR and publishes each. Usage: c_prod N DIR
 * (DIR must be DYAD_PATH_PRODUCER or inside it). */
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
    if (DYAD_IS_ERROR(dyad_init_env(DYAD_COMM_SEND, NULL))) {
        fprintf(stderr, "c_prod: %s\n", dyad_last_error());
        return 2;
    }
    dyad_ctx_t* ctx = dyad_ctx_get();
    for (int i = 0; i < n; ++i) {
        char path[4096];
        snprintf(path, sizeof path, "%s/data%d.txt", argv[2], i);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) {
            perror(path);
            return 2;
        }
        int v[10];
        for (int k = 0; k < 10; ++k) v[k] = i * 10 + k;
        if (write(fd, v, sizeof v) != (ssize_t)sizeof v || close(fd) != 0) {
            perror(path);
            return 2;
        }
        if (DYAD_IS_ERROR(dyad_produce(ctx, path))) {
            fprintf(stderr, "c_prod: %s\n", dyad_last_error());
            return 2;
        }
        printf("produced %s\n", path);
    }
    dyad_finalize();
    return 0;
}
