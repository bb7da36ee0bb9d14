/* SPDX-License-Identifier: Apache-2.0 */
/* Reads DIR/t<i>.bin from 8 threads (each opened first by its thread, so the
 * wrapper consumes from non-main threads) and checks every byte.
 * Usage: mt_reader DIR SIZE. Exit 0 when all match. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "pattern.h"

enum { kThreads = 8 };
static const char* g_dir;
static size_t g_size;
static int g_bad;

static void* reader(void* arg) {
    unsigned t = (unsigned)(size_t)arg;
    char p[4096], buf[65536];
    snprintf(p, sizeof p, "%s/t%u.bin", g_dir, t);
    int fd = open(p, O_RDONLY);
    if (fd < 0) {
        perror(p);
        __atomic_add_fetch(&g_bad, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    size_t off = 0;
    ssize_t r;
    while ((r = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < r; ++i)
            if ((unsigned char)buf[i] != dyad_test_byte(t, off + (size_t)i)) {
                fprintf(stderr, "%s: wrong byte at %zu\n", p, off + (size_t)i);
                __atomic_add_fetch(&g_bad, 1, __ATOMIC_RELAXED);
                close(fd);
                return NULL;
            }
        off += (size_t)r;
    }
    if (off != g_size) {
        fprintf(stderr, "%s: %zu bytes, expected %zu\n", p, off, g_size);
        __atomic_add_fetch(&g_bad, 1, __ATOMIC_RELAXED);
    }
    close(fd);
    return NULL;
}

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DIR SIZE\n", argv[0]);
        return 1;
    }
    g_dir = argv[1];
    g_size = strtoull(argv[2], NULL, 10);
    pthread_t th[kThreads];
    for (size_t i = 0; i < kThreads; ++i) pthread_create(&th[i], NULL, reader, (void*)i);
    for (int i = 0; i < kThreads; ++i) pthread_join(th[i], NULL);
    return g_bad ? 3 : 0;
}
