/* SPDX-License-Identifier: Apache-2.0 */
/* The plain file -> TCP socket -> file copy that bench/bench.py sets beside
 * DYAD: read()/write() loops with 1 MiB buffers, nothing else (no checksum,
 * no framing, no fsync).
 *
 *   bench_plain_copy send ADDR FILE
 *       listens on ADDR (a free port), prints the port on stdout, accepts one
 *       connection, then opens FILE and writes it to the socket.
 *   bench_plain_copy recv ADDR PORT FILE [BIND_ADDR]
 *       connects to ADDR:PORT (from BIND_ADDR if given), writes what it
 *       reads into FILE (created or truncated) until the sender closes, and
 *       prints the number of bytes.
 *
 * Exit status 0 on success, 1 on bad usage, 2 on an I/O error (a message on
 * stderr names the call that failed). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

enum { BUFFER_BYTES = 1 << 20 };

static int fail(const char* what, const char* arg) {
    fprintf(stderr, "plain_copy: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    return 2;
}

/* Writes all of buf[0..n) to fd; 0 on success, -1 (errno set) on error. */
static int write_all(int fd, const char* buf, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Copies in to out until EOF on in; the byte count, or -1 (errno set). */
static long long copy_fd(int in, int out, char* buf) {
    long long total = 0;
    for (;;) {
        ssize_t r = read(in, buf, BUFFER_BYTES);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) return total;
        if (write_all(out, buf, (size_t)r) != 0) return -1;
        total += r;
    }
}

static int parse_addr(const char* text, unsigned port, struct sockaddr_in* sa) {
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((unsigned short)port);
    return inet_pton(AF_INET, text, &sa->sin_addr) == 1 ? 0 : -1;
}

static int do_send(const char* addr, const char* path, char* buf) {
    struct sockaddr_in sa;
    if (parse_addr(addr, 0, &sa) != 0) {
        fprintf(stderr, "plain_copy: bad address %s\n", addr);
        return 1;
    }
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0) return fail("socket", NULL);
    socklen_t len = sizeof sa;
    if (bind(lfd, (struct sockaddr*)&sa, sizeof sa) != 0) return fail("bind", addr);
    if (listen(lfd, 1) != 0) return fail("listen", addr);
    if (getsockname(lfd, (struct sockaddr*)&sa, &len) != 0) return fail("getsockname", addr);
    printf("%u\n", (unsigned)ntohs(sa.sin_port));
    fflush(stdout);
    int cfd;
    do {
        cfd = accept(lfd, NULL, NULL);
    } while (cfd < 0 && errno == EINTR);
    if (cfd < 0) return fail("accept", addr);
    close(lfd);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail("open", path);
    long long n = copy_fd(fd, cfd, buf);
    if (n < 0) return fail("copy from", path);
    close(fd);
    if (close(cfd) != 0) return fail("close", "socket");
    return 0;
}

static int do_recv(const char* addr, const char* port, const char* path, const char* bind_addr,
                   char* buf) {
    struct sockaddr_in sa;
    if (parse_addr(addr, (unsigned)atoi(port), &sa) != 0) {
        fprintf(stderr, "plain_copy: bad address %s\n", addr);
        return 1;
    }
    int sfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sfd < 0) return fail("socket", NULL);
    if (bind_addr) {
        struct sockaddr_in local;
        if (parse_addr(bind_addr, 0, &local) != 0) {
            fprintf(stderr, "plain_copy: bad address %s\n", bind_addr);
            return 1;
        }
        if (bind(sfd, (struct sockaddr*)&local, sizeof local) != 0) return fail("bind", bind_addr);
    }
    int rc;
    do {
        rc = connect(sfd, (struct sockaddr*)&sa, sizeof sa);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) return fail("connect", addr);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return fail("open", path);
    long long n = copy_fd(sfd, fd, buf);
    if (n < 0) return fail("copy to", path);
    if (close(fd) != 0) return fail("close", path);
    close(sfd);
    printf("%lld\n", n);
    return 0;
}

int main(int argc, char** argv) {
    static char buf[BUFFER_BYTES];
    if (argc == 4 && strcmp(argv[1], "send") == 0) return do_send(argv[2], argv[3], buf);
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "recv") == 0)
        return do_recv(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : NULL, buf);
    fprintf(stderr, "usage: %s send ADDR FILE | recv ADDR PORT FILE [BIND_ADDR]\n", argv[0]);
    return 1;
}
