/* SPDX-License-Identifier: Apache-2.0 */
/* Writes from 8 threads. Usage:
 *   mt_writer one  PATH SIZE      8 threads pwrite disjoint parts of one file
 *   mt_writer many DIR SIZE       8 threads each create, write, close DIR/t<i>.bin
 * Content follows pattern.h (file index 0 for "one", i for "many"). */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pattern.h"

enum { kThreads = 8 };
static const char* g_path;
static size_t g_size;
static int g_fd;

static int fill_and_write(int fd, unsigned k, size_t from, size_t to) {
    char buf[65536];
    for (size_t off = from; off < to;) {
        size_t n = to - off < sizeof buf ? to - off : sizeof buf;
        for (size_t i = 0; i < n; ++i) buf[i] = (char)dyad_test_byte(k, off + i);
        ssize_t w = pwrite(fd, buf, n, (off_t)off);
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    return 0;
}

static void* part(void* arg) {
    size_t t = (size_t)arg, chunk = (g_size + kThreads - 1) / kThreads;
    size_t from = t * chunk, to = from + chunk > g_size ? g_size : from + chunk;
    if (from < to && fill_and_write(g_fd, 0, from, to) != 0) {
        perror("pwrite");
        exit(2);
    }
    return NULL;
}

static void* whole(void* arg) {
    unsigned t = (unsigned)(size_t)arg;
    char p[4096];
    snprintf(p, sizeof p, "%s/t%u.bin", g_path, t);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || fill_and_write(fd, t, 0, g_size) != 0 || close(fd) != 0) {
        perror(p);
        exit(2);
    }
    return NULL;
}

int main(int argc, char** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s one|many PATH SIZE\n", argv[0]);
        return 1;
    }
    g_path = argv[2];
    g_size = strtoull(argv[3], NULL, 10);
    int one = strcmp(argv[1], "one") == 0;
    if (one) {
        g_fd = open(g_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (g_fd < 0) {
            perror(g_path);
            return 2;
        }
    }
    pthread_t th[kThreads];
    for (size_t i = 0; i < kThreads; ++i)
        pthread_create(&th[i], NULL, one ? part : whole, (void*)i);
    for (int i = 0; i < kThreads; ++i) pthread_join(th[i], NULL);
    if (one && close(g_fd) != 0) {
        perror("close");
        return 2;
    }
    return 0;
}
