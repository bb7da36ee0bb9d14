/* SPDX-License-Identifier: Apache-2.0 */
/* The plugin's settings: plugstack.conf's arguments (the site's) and
 * --dyad=OPTIONS (the user's), each checked with a message saying why. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "spank_files.h"

struct dyad_conf {
    char dyadd[DYAD_PATH_MAX];
    char parent[DYAD_PATH_MAX];
    char kvs[1024];
    char site_key[DYAD_PATH_MAX];
    char transports[256];
    char ports[32];           /* LOW-HIGH, or N */
    char store[16];           /* auto (default), etcd or embedded: the job's own store */
    char etcd[DYAD_PATH_MAX]; /* the etcd program (default: etcd in PATH) */
    int timeout;
    int user_dir;
};

struct dyad_user {
    char mode[32];
    char wait[32]; /* seconds, as DYAD_WAIT_TIMEOUT takes them */
    char dir_template[DYAD_PATH_MAX];
};

/* plugstack.conf's arguments; -1 and a message (slurm_error) when one is
 * not known or not valid. */
int dyad_parse_conf(int ac, char** av, struct dyad_conf* c);

/* --dyad's OPTIONS (NULL, "" and "(null)": none). -1 with the reason in
 * err when one is not valid, or dir= where the site does not allow it. */
int dyad_parse_user(const char* arg, const struct dyad_conf* c, struct dyad_user* u, char* err,
                    size_t errlen);

/* The job directory: the user's dir= template expanded, else
 * PARENT/UID/JOBID. */
void dyad_job_dir(const struct dyad_conf* c, const struct dyad_user* u, uint32_t jobid, uid_t uid,
                  char* out, size_t n);
