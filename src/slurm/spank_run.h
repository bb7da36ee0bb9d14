/* SPDX-License-Identifier: Apache-2.0 */
/* The plugin's work as the job's user: the job key, `dyad job node-up` and
 * `node-down`, and the tasks' environment. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <slurm/spank.h>

#include "spank_options.h"

/* A result of dyad_node_up/down that is the node's fault, not the job's. */
#define DYAD_RUN_NODE_FAULT (-2)

struct dyad_started {
    char address[128];            /* "ADDR:PORT" the dyadd serves on */
    char output[DYAD_REASON_MAX]; /* what node-up said (errors, ports skipped) */
};

/* HMAC-SHA-256(site secret; "dyad-slurm-job-key-v1", cluster, job id, uid)
 * as 64 hex digits and a new line; -1 (logged) without a valid secret. */
int dyad_derive_key(const struct dyad_conf* c, uint32_t jobid, uid_t uid, char out[66]);

/* `dyad job node-up --detach` as uid/gid, the key on its standard input: 0
 * when its dyadd is ready, DYAD_RUN_NODE_FAULT when it could not be run at
 * all, else -1 (the job's failure: the reason in s->output). */
int dyad_node_up(const struct dyad_conf* c, const char* node, const char* nodes, uint32_t jobid,
                 uid_t uid, gid_t gid, const char* dir, const char* key, struct dyad_started* s);

/* `dyad job node-down` as uid/gid: 0, -1 (could not clean everything), or
 * DYAD_RUN_NODE_FAULT (the dyadd does not die). Its words in out. */
int dyad_node_down(const struct dyad_conf* c, uid_t uid, gid_t gid, const char* dir, char* out,
                   size_t n);

/* DYAD_* of the job's tasks. */
void dyad_task_env(spank_t sp, const struct dyad_conf* c, const struct dyad_user* u, uint32_t jobid,
                   const char* dir);
