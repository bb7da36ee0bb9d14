/* SPDX-License-Identifier: Apache-2.0 */
/* open/read/close over N files in DIR (created first if missing); prints the
 * seconds the loop took. Usage: open_loop DIR N */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DIR N\n", argv[0]);
        return 1;
    }
    const char* dir = argv[1];
    long n = atol(argv[2]);
    char p[4096], buf[4096];
    mkdir(dir, 0755);
    for (long i = 0; i < n; ++i) {
        snprintf(p, sizeof p, "%s/f%06ld", dir, i);
        if (access(p, F_OK) == 0) continue;
        int fd = open(p, O_WRONLY | O_CREAT, 0644);
        if (fd < 0 || write(fd, "0123456789abcdef", 16) != 16) return 2;
        close(fd);
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    long bytes = 0;
    for (long i = 0; i < n; ++i) {
        snprintf(p, sizeof p, "%s/f%06ld", dir, i);
        int fd = open(p, O_RDONLY);
        if (fd < 0) return 3;
        ssize_t r = read(fd, buf, sizeof buf);
        if (r > 0) bytes += r;
        close(fd);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.6f %ld\n", (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9,
           bytes);
    return 0;
}
