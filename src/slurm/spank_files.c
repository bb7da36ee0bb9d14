/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "spank_files.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

int dyad_move_aside(int dir_fd, const char* name, char* moved, size_t movedlen) {
    struct stat st;
    if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : -1;
    for (int i = 0; i < 16; ++i) {
        snprintf(moved, movedlen, "%s.moved-%ld-%d-%d", name[0] == '.' ? name + 1 : name,
                 (long)time(NULL), (int)getpid(), i);
        /* RENAME_NOREPLACE: never over something else that is there. */
        if (renameat2(dir_fd, name, dir_fd, moved, RENAME_NOREPLACE) == 0) return 1;
        if (errno == ENOENT) return 0;
        if (errno != EEXIST) return -1;
    }
    return -1;
}

static void describe(const struct stat* st, char* out, size_t n) {
    const char* kind = S_ISDIR(st->st_mode)    ? "a directory"
                       : S_ISLNK(st->st_mode)  ? "a symbolic link"
                       : S_ISREG(st->st_mode)  ? "a file"
                       : S_ISSOCK(st->st_mode) ? "a socket"
                                               : "not a directory";
    snprintf(out, n, "%s of uid %u, mode %04o", kind, (unsigned)st->st_uid,
             (unsigned)(st->st_mode & 07777));
}

/* The directory `name` in dir_fd if it is one of `uid` without group or
 * other write, else -1 (errno ENOENT when nothing is there). */
static int open_owned_dir(int dir_fd, const char* name, uid_t uid, struct stat* st, int how) {
    int fd = openat(dir_fd, name, how | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT && fstatat(dir_fd, name, st, AT_SYMLINK_NOFOLLOW) != 0)
            memset(st, 0, sizeof *st);
        return -1;
    }
    if (fstat(fd, st) != 0 || st->st_uid != uid || (st->st_mode & 022)) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

int dyad_open_parent(const char* parent, int create, char* err, size_t errlen) {
    char a[DYAD_PATH_MAX], b[DYAD_PATH_MAX];
    snprintf(a, sizeof a, "%s", parent);
    snprintf(b, sizeof b, "%s", parent);
    const char* up = dirname(a);
    const char* base = basename(b);
    int gfd = open(up, O_PATH | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (gfd < 0 || fstat(gfd, &st) != 0) {
        snprintf(err, errlen, "cannot open %s: %s", up, strerror(errno));
        if (gfd >= 0) close(gfd);
        return -1;
    }
    if (st.st_uid != 0 || ((st.st_mode & 022) && !(st.st_mode & S_ISVTX))) {
        snprintf(err, errlen,
                 "%s (where parent=%s lies) is not root's, or others may rename in it: choose "
                 "another parent= in plugstack.conf",
                 up, parent);
        close(gfd);
        return -1;
    }
    int fd = -1;
    for (int tries = 0; tries < 4 && fd < 0; ++tries) {
        /* Root (the prolog) reads it; a task (the user) only searches it. */
        fd = open_owned_dir(gfd, base, 0, &st, create ? O_RDONLY : O_PATH);
        if (fd >= 0) break;
        if (!create) {
            snprintf(err, errlen, "%s is absent or not root's", parent);
            break;
        }
        if (errno == ENOENT) {
            if (mkdirat(gfd, base, 0711) != 0 && errno != EEXIST) {
                snprintf(err, errlen, "cannot create %s: %s", parent, strerror(errno));
                break;
            }
            continue;
        }
        char what[128], moved[256];
        describe(&st, what, sizeof what);
        if (dyad_move_aside(gfd, base, moved, sizeof moved) < 0) {
            snprintf(err, errlen, "cannot move aside %s (%s): %s", parent, what, strerror(errno));
            break;
        }
        slurm_error(
            "dyad: %s was %s, not root's private directory: moved aside to %s/%s "
            "(untouched), and made anew",
            parent, what, up, moved);
    }
    close(gfd);
    if (fd >= 0 && (st.st_mode & 07777) != 0711) fchmod(fd, 0711);
    if (fd < 0 && !err[0]) snprintf(err, errlen, "%s: cannot make it root's directory", parent);
    return fd;
}

int dyad_user_dir(int parent_fd, const char* parent, uid_t uid, gid_t gid, char* err,
                  size_t errlen) {
    char name[32];
    snprintf(name, sizeof name, "%u", (unsigned)uid);
    struct stat st;
    for (int tries = 0; tries < 4; ++tries) {
        int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) {
            if (fstat(fd, &st) == 0 && st.st_uid == uid) {
                if ((st.st_mode & 07777) != 0700) fchmod(fd, 0700);
                return fd;
            }
            if (fstat(fd, &st) == 0 && st.st_uid == 0) {
                /* made by the plugin (only root makes entries here): the
                 * user's from now on */
                if (fchown(fd, uid, gid) == 0 && fchmod(fd, 0700) == 0) return fd;
            }
            close(fd);
        } else if (errno == ENOENT) {
            if (mkdirat(parent_fd, name, 0700) != 0 && errno != EEXIST) break;
            continue;
        }
        if (fstatat(parent_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        char what[128], moved[256];
        describe(&st, what, sizeof what);
        if (dyad_move_aside(parent_fd, name, moved, sizeof moved) < 0) break;
        slurm_error("dyad: %s/%s was %s, not uid %u's directory: moved aside to %s/%s", parent,
                    name, what, (unsigned)uid, parent, moved);
    }
    snprintf(err, errlen, "cannot make %s/%s uid %u's directory: %s", parent, name, (unsigned)uid,
             strerror(errno));
    return -1;
}

static void record_name(uint32_t jobid, const char* suffix, char* out, size_t n) {
    snprintf(out, n, "job-%u%s", jobid, suffix);
}

/* One line of the record: no new lines inside a value. */
static void put(FILE* f, const char* key, const char* value) {
    fprintf(f, "%s=", key);
    for (const char* p = value; *p; ++p) fputc(*p == '\n' || *p == '\r' ? ' ' : *p, f);
    fputc('\n', f);
}

int dyad_write_record(int parent_fd, uint32_t jobid, const struct dyad_record* r) {
    char tmp[64], name[64], num[32];
    record_name(jobid, ".new", tmp, sizeof tmp);
    record_name(jobid, "", name, sizeof name);
    unlinkat(parent_fd, tmp, 0);
    int fd = openat(parent_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    fchmod(fd, 0644);
    FILE* f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        return -1;
    }
    snprintf(num, sizeof num, "%u", (unsigned)r->uid);
    put(f, "uid", num);
    snprintf(num, sizeof num, "%u", (unsigned)r->gid);
    put(f, "gid", num);
    put(f, "state", r->state);
    put(f, "dir", r->dir);
    put(f, "address", r->address);
    put(f, "reason", r->reason);
    if (fclose(f) != 0) return -1;
    return renameat(parent_fd, tmp, parent_fd, name);
}

static void take(char* dst, size_t n, const char* src) {
    snprintf(dst, n, "%s", src);
}

int dyad_read_record(int parent_fd, uint32_t jobid, struct dyad_record* r) {
    char name[64];
    record_name(jobid, "", name, sizeof name);
    memset(r, 0, sizeof *r);
    int fd = openat(parent_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return -1;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022) ||
        st.st_size > 16384) {
        close(fd);
        return -1;
    }
    FILE* f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return -1;
    }
    char line[DYAD_PATH_MAX + 64];
    int have_uid = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char* eq = strchr(line, '=');
        if (!eq) continue;
        *eq = 0;
        const char* v = eq + 1;
        if (strcmp(line, "uid") == 0) r->uid = (uid_t)strtoul(v, NULL, 10), have_uid = 1;
        if (strcmp(line, "gid") == 0) r->gid = (gid_t)strtoul(v, NULL, 10);
        if (strcmp(line, "state") == 0) take(r->state, sizeof r->state, v);
        if (strcmp(line, "dir") == 0) take(r->dir, sizeof r->dir, v);
        if (strcmp(line, "address") == 0) take(r->address, sizeof r->address, v);
        if (strcmp(line, "reason") == 0) take(r->reason, sizeof r->reason, v);
    }
    fclose(f);
    return have_uid && r->state[0] ? 0 : -1;
}

int dyad_remove_record(int parent_fd, uint32_t jobid) {
    char name[64];
    record_name(jobid, "", name, sizeof name);
    return unlinkat(parent_fd, name, 0);
}
