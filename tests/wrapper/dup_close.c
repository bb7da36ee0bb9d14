/* SPDX-License-Identifier: Apache-2.0 */
/* Publishes only at the last close of duplicated fds. Usage: dup_close PATH
 * Writes "first", dups the fd (dup, then fcntl F_DUPFD), closes the original,
 * prints "ONE-CLOSED", waits for a line on stdin, writes "second" through a
 * duplicate, closes both duplicates. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char** argv) {
    if (argc != 2) return 1;
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return 2;
    if (write(fd, "first\n", 6) != 6) return 2;
    int d1 = dup(fd);
    int d2 = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    if (d1 < 0 || d2 < 0) return 2;
    close(fd);
    printf("ONE-CLOSED\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 3;
    if (write(d1, "second\n", 7) != 7) return 2;
    close(d1);
    printf("TWO-CLOSED\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 3;
    close(d2);
    return 0;
}
