/* SPDX-License-Identifier: Apache-2.0 */
/* The publish-latency row (bench/publish_latency.py, issue 48): the cost of
 * one dyad_produce of a small file, beside a bare round trip over the same
 * kind of Unix socket.
 *   produce DIR N SIZE  through the C API in the node's environment
 *                       (DYAD_ASYNC_PUBLISH says sync or async): writes
 *                       DIR/pl-PID-I (SIZE bytes; not timed), times dyad_produce;
 *                       one line per call (ns), then "finalize NS" (the
 *                       drain of an async queue).
 *   echo SOCK REQ ANS   a server: reads REQ bytes, answers ANS bytes, per
 *                       connection, until the client closes.
 *   rt SOCK N REQ ANS   its client: N round trips, one line each (ns). */
#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int exact(int fd, char* p, size_t n, int writing) {
    while (n > 0) {
        ssize_t r = writing ? write(fd, p, n) : read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int unix_addr(const char* path, struct sockaddr_un* a) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a->sun_path) return -1;
    strcpy(a->sun_path, path);
    return 0;
}

static int produce(const char* dir, int n, size_t size) {
    if (dyad_init_env(DYAD_COMM_RECV, NULL) != DYAD_RC_OK) {
        fprintf(stderr, "publish_latency: dyad_init_env: %s\n", dyad_last_error());
        return 1;
    }
    dyad_ctx_t* ctx = dyad_ctx_get();
    char* buf = malloc(size ? size : 1);
    memset(buf, 'p', size);
    char path[4096];
    for (int i = 0; i < n; ++i) {
        /* A new file each call, as an application's outputs (a file
         * rewritten while its publish is in flight waits for it). */
        snprintf(path, sizeof path, "%s/pl-%d-%d", dir, (int)getpid(), i);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || exact(fd, buf, size, 1) != 0 || close(fd) != 0) {
            perror(path);
            return 1;
        }
        long long t0 = now_ns();
        dyad_rc_t rc = dyad_produce(ctx, path);
        long long t1 = now_ns();
        if (rc != DYAD_RC_OK) {
            fprintf(stderr, "publish_latency: dyad_produce %s: %s\n", path, dyad_last_error());
            return 1;
        }
        printf("%lld\n", t1 - t0);
    }
    long long t0 = now_ns();
    dyad_rc_t rc = dyad_finalize();
    printf("finalize %lld\n", now_ns() - t0);
    free(buf);
    if (rc != DYAD_RC_OK) {
        fprintf(stderr, "publish_latency: dyad_finalize: %s\n", dyad_last_error());
        return 1;
    }
    return 0;
}

static int echo(const char* sock, size_t req, size_t ans) {
    struct sockaddr_un a;
    int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0 || unix_addr(sock, &a) != 0) return 1;
    unlink(sock);
    if (bind(l, (struct sockaddr*)&a, sizeof a) != 0 || listen(l, 8) != 0) {
        perror(sock);
        return 1;
    }
    printf("listening\n");
    fflush(stdout);
    char* in = malloc(req);
    char* out = calloc(1, ans);
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0) continue;
        while (exact(c, in, req, 0) == 0 && exact(c, out, ans, 1) == 0) {
        }
        close(c);
    }
}

static int rt(const char* sock, int n, size_t req, size_t ans) {
    struct sockaddr_un a;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || unix_addr(sock, &a) != 0 || connect(s, (struct sockaddr*)&a, sizeof a) != 0) {
        perror(sock);
        return 1;
    }
    char* out = calloc(1, req);
    char* in = malloc(ans);
    for (int i = 0; i < n; ++i) {
        long long t0 = now_ns();
        if (exact(s, out, req, 1) != 0 || exact(s, in, ans, 0) != 0) {
            fprintf(stderr, "publish_latency: the echo server closed\n");
            return 1;
        }
        printf("%lld\n", now_ns() - t0);
    }
    close(s);
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 5 && !strcmp(argv[1], "produce"))
        return produce(argv[2], atoi(argv[3]), (size_t)atol(argv[4]));
    if (argc == 5 && !strcmp(argv[1], "echo"))
        return echo(argv[2], (size_t)atol(argv[3]), (size_t)atol(argv[4]));
    if (argc == 6 && !strcmp(argv[1], "rt"))
        return rt(argv[2], atoi(argv[3]), (size_t)atol(argv[4]), (size_t)atol(argv[5]));
    fprintf(stderr, "usage: %s produce DIR N SIZE | echo SOCK REQ ANS | rt SOCK N REQ ANS\n",
            argv[0]);
    return 2;
}
