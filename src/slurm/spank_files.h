/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the SPANK plugin keeps on a node, as root, where no other user can
 * plant anything: the parent directory (root's, 0711), one directory per
 * user in it (the user's, 0700) holding the job directories, and one record
 * per job (root's, 0644: "this job asked for DYAD; its directory, state and
 * address"). Nothing here follows a symbolic link; anything unexpected is
 * renamed aside, never opened.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define DYAD_PATH_MAX 4096
#define DYAD_REASON_MAX 2048

struct dyad_record {
    uid_t uid;
    gid_t gid;
    char state[16]; /* starting, ready, failed */
    char dir[DYAD_PATH_MAX];
    char address[128];
    char reason[DYAD_REASON_MAX];
};

/* The parent directory, opened (O_PATH-free, O_DIRECTORY): root's, with no
 * group or other write. With `create`, made (0711) if absent, and whatever
 * else holds its name moved aside first. -1 (and a message in err) when it
 * cannot be had; without `create`, also when it is absent or not root's. */
int dyad_open_parent(const char* parent, int create, char* err, size_t errlen);

/* parent/UID: the user's directory (0700, theirs), made or checked; a
 * leftover that is not a directory of that user is moved aside. Its fd. */
int dyad_user_dir(int parent_fd, const char* parent, uid_t uid, gid_t gid, char* err,
                  size_t errlen);

/* Moves aside whatever is named `name` in dir_fd (renamed, never followed):
 * 1 when something was there, 0 when nothing, -1 on failure. `moved` gets
 * the new name. */
int dyad_move_aside(int dir_fd, const char* name, char* moved, size_t movedlen);

/* The job's record in the parent: written whole (a new file renamed over
 * the old one), read back only when it is a regular file of root's. */
int dyad_write_record(int parent_fd, uint32_t jobid, const struct dyad_record* r);
/* 0 when read; -1 when there is none (or not a valid one of root's). */
int dyad_read_record(int parent_fd, uint32_t jobid, struct dyad_record* r);
int dyad_remove_record(int parent_fd, uint32_t jobid);
