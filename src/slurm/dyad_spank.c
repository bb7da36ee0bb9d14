/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dyad_spank.so: `--dyad[=OPTIONS]` for sbatch, salloc and srun.
 *
 * With it, the job prolog (PrologFlags=Alloc: on every allocated node, at
 * allocation) starts the job's dyadd on the node as the job's user, through
 * `dyad job node-up --detach`, and returns once it proves, with the job key,
 * that it serves; every task gets DYAD_SERVICE_URI, DYAD_PATH_PRODUCER,
 * DYAD_PATH_CONSUMER, DYAD_AUTH_KEY_FILE, DYAD_KVS_NAMESPACE, DYAD_WRAPPER
 * and DYAD_LIBRARY; the job epilog (normal end, scancel, time limit) runs
 * `dyad job node-down`, which stops the dyadd and removes the key, the job
 * directory and the dyadd's /dev/shm files. Without --dyad the plugin does
 * nothing, whatever is on the node.
 *
 * Where things live (spank_files.c): PARENT (default /tmp/dyad, root's,
 * 0711: only root makes entries in it) holds one directory per user
 * (PARENT/UID, theirs, 0700) with the job directories in it (PARENT/UID/
 * JOBID), and one record per --dyad job (PARENT/job-JOBID, root's): the
 * prolog writes it, the tasks' environment and the epilog read nothing else.
 * What another user planted is never used, followed or removed: what stands
 * in the way is renamed aside, and the job goes on.
 *
 * Failures: a user's bad --dyad= value is refused at submission; a start
 * that fails because of the job (its dir=, its own leftovers, ports) fails
 * the job's tasks with the reason in the job's output and leaves the node
 * in service. Only a node fault (no dyadd or dyad program, no site secret,
 * the parent directory impossible to make, a dyadd that does not die) fails
 * the prolog or epilog, which drains the node.
 *
 * The job key is the same on every node without being sent anywhere: each
 * node's prolog derives it as HMAC-SHA-256(site secret, cluster, job id, uid)
 * from a root-only site secret file (site_key=, default /etc/dyad/slurm.key,
 * else Munge's key), and writes it, as the user, into the job directory
 * (mode 0600). See docs/security.md.
 *
 * plugstack.conf arguments (all optional): dyadd=PATH (default: bin/dyadd
 * beside this plugin's installation), parent=DIR (default /tmp/dyad),
 * ports=LOW-HIGH (default 20000-29999; port=N: that port only), kvs=URI,
 * site_key=PATH, timeout=SECONDS (default 60), transports=LIST (dyadd
 * --transports), user_dir=yes (users may give dir=), store=auto|etcd|embedded
 * (default auto: with 3 nodes or more the job's metadata is in an etcd of
 * its own on its first three nodes, tools/job/etcd.hpp), etcd=PATH.
 *
 * Users' OPTIONS, comma-separated: mode=TRANSPORT (DYAD_DTL_MODE of the
 * tasks), wait=DURATION (DYAD_WAIT_TIMEOUT), dir=TEMPLATE (if the site allows).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

#include "spank_files.h"
#include "spank_options.h"
#include "spank_run.h"

SPANK_PLUGIN(dyad, 1);

static int dyad_requested = 0;
static char dyad_optarg[1024] = "";
static struct dyad_conf g_conf; /* the site's, read in slurm_spank_init */
static int g_conf_ok = 0;
/* user_init to task_init: why this job's DYAD is not there on this node. */
static char g_fail[DYAD_REASON_MAX + 512] = "";

static int dyad_opt_cb(int val, const char* optarg, int remote);

static struct spank_option dyad_option = {
    "dyad",
    "[OPTIONS]",
    "start DYAD for this job: a dyadd on every node, the DYAD_* environment in every task "
    "(OPTIONS, comma-separated: mode=TRANSPORT, wait=DURATION, dir=TEMPLATE if the site allows)",
    2,
    0,
    dyad_opt_cb};

/* In sbatch, salloc and srun: a bad value is refused here, at submission.
 * In slurmstepd (remote) nothing is refused: the prolog and the tasks
 * report it without touching the node's state. */
static int dyad_opt_cb(int val, const char* optarg, int remote) {
    (void)val;
    if (!remote && g_conf_ok) {
        struct dyad_user u;
        char err[1024];
        if (dyad_parse_user(optarg, &g_conf, &u, err, sizeof err) != 0) {
            slurm_error("dyad: --dyad=%s: %s", optarg ? optarg : "", err);
            return -1;
        }
    }
    dyad_requested = 1;
    snprintf(dyad_optarg, sizeof dyad_optarg, "%s", optarg ? optarg : "");
    return 0;
}

/* --dyad given (in the submitting command, or in the job's record); its
 * OPTIONS in *arg. */
static int requested(spank_t sp, const char** arg) {
    char* a = NULL;
    if (spank_option_getopt(sp, &dyad_option, &a) == ESPANK_SUCCESS) {
        *arg = a;
        return 1;
    }
    *arg = dyad_optarg;
    return dyad_requested;
}

static int job_ids(spank_t sp, uint32_t* jobid, uid_t* uid, gid_t* gid) {
    const char* e;
    if (spank_get_item(sp, S_JOB_ID, jobid) != ESPANK_SUCCESS) {
        if (!(e = getenv("SLURM_JOB_ID"))) return -1;
        *jobid = (uint32_t)strtoul(e, NULL, 10);
    }
    if (spank_get_item(sp, S_JOB_UID, uid) != ESPANK_SUCCESS) {
        if (!(e = getenv("SLURM_JOB_UID"))) return -1;
        *uid = (uid_t)strtoul(e, NULL, 10);
    }
    if (spank_get_item(sp, S_JOB_GID, gid) != ESPANK_SUCCESS) {
        if (!(e = getenv("SLURM_JOB_GID"))) return -1;
        *gid = (gid_t)strtoul(e, NULL, 10);
    }
    return 0;
}

static double seconds(const struct timespec* a, const struct timespec* b) {
    return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) / 1e9;
}

static void dyad_tool(const struct dyad_conf* c, char* out, size_t n) {
    const char* slash = strrchr(c->dyadd, '/');
    if (!slash) {
        snprintf(out, n, "dyad");
        return;
    }
    snprintf(out, n, "%.*s/dyad", (int)(slash - c->dyadd), c->dyadd);
}

int slurm_spank_init(spank_t sp, int ac, char** av) {
    /* sbatch ignores a static spank_options table: registered here. */
    if (spank_option_register(sp, &dyad_option) != ESPANK_SUCCESS) {
        slurm_error("dyad: cannot register --dyad");
        return -1;
    }
    g_conf_ok = dyad_parse_conf(ac, av, &g_conf) == 0;
    return 0;
}

/* salloc's shell runs where salloc does, not on the job's nodes: say how a
 * shell there gets the environment. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char** av) {
    (void)sp;
    (void)ac;
    (void)av;
    if (spank_context() == S_CTX_ALLOCATOR && dyad_requested && !getenv("SLURM_SCRIPT_CONTEXT") &&
        isatty(2))
        fprintf(stderr,
                "dyad: every srun step of this allocation has the DYAD environment; a shell on "
                "one of its nodes gets it with: eval \"$(dyad job env)\"\n");
    return 0;
}

/* The job's start on this node failed because of the job: recorded (the
 * tasks fail with the reason), logged, and the node stays in service. */
static int job_failed(int pfd, uint32_t jobid, struct dyad_record* r, const char* node,
                      const char* why) {
    snprintf(r->state, sizeof r->state, "failed");
    snprintf(r->reason, sizeof r->reason, "%s", why);
    slurm_error(
        "dyad: job %u: DYAD did not start on %s (the job's tasks fail with this reason; "
        "the node stays in service): %s",
        jobid, node, why);
    if (dyad_write_record(pfd, jobid, r) != 0)
        slurm_error("dyad: job %u: cannot write its record: %m", jobid);
    close(pfd);
    return 0;
}

static int prolog_start(const struct dyad_conf* c, const char* node, const char* nodes,
                        uint32_t jobid, uid_t uid, gid_t gid, int pfd, struct dyad_record* r);

int slurm_spank_job_prolog(spank_t sp, int ac, char** av) {
    struct dyad_conf c;
    const char* arg = NULL;
    if (dyad_parse_conf(ac, av, &c) != 0) return -1;
    if (!requested(sp, &arg)) return 0;
    uint32_t jobid;
    uid_t uid;
    gid_t gid;
    if (job_ids(sp, &jobid, &uid, &gid) != 0) {
        slurm_error("dyad: the job prolog knows no job id or uid");
        return -1;
    }
    const char* node = getenv("SLURMD_NODENAME");
    const char* nodes = getenv("SLURM_JOB_NODELIST");
    if (!nodes) nodes = getenv("SLURM_NODELIST");
    if (!node || !nodes) {
        slurm_error("dyad: job %u: the prolog's environment has no SLURMD_NODENAME or node list",
                    jobid);
        return -1;
    }
    char dyad[DYAD_PATH_MAX], err[1024] = "";
    dyad_tool(&c, dyad, sizeof dyad);
    if (!c.dyadd[0] || access(c.dyadd, X_OK) != 0 || access(dyad, X_OK) != 0) {
        slurm_error(
            "dyad: job %u: no dyadd and dyad programs at %s: install them, or give "
            "dyadd=PATH in plugstack.conf",
            jobid, c.dyadd[0] ? c.dyadd : "(none found beside the plugin)");
        return -1;
    }
    int pfd = dyad_open_parent(c.parent, 1, err, sizeof err);
    if (pfd < 0) {
        slurm_error("dyad: job %u: %s", jobid, err);
        return -1;
    }
    struct dyad_record r;
    memset(&r, 0, sizeof r);
    r.uid = uid;
    r.gid = gid;
    snprintf(r.state, sizeof r.state, "starting");
    struct dyad_user u;
    if (dyad_parse_user(arg, &c, &u, err, sizeof err) != 0) {
        char why[1200];
        snprintf(why, sizeof why, "--dyad=%s: %s", arg, err);
        return job_failed(pfd, jobid, &r, node, why);
    }
    dyad_job_dir(&c, &u, jobid, uid, r.dir, sizeof r.dir);
    return prolog_start(&c, node, nodes, jobid, uid, gid, pfd, &r);
}

/* The job directory's place, the record, the key, then `dyad job node-up`. */
static int prolog_start(const struct dyad_conf* c, const char* node, const char* nodes,
                        uint32_t jobid, uid_t uid, gid_t gid, int pfd, struct dyad_record* r) {
    char err[1024] = "";
    struct dyad_user none;
    memset(&none, 0, sizeof none);
    char standard[DYAD_PATH_MAX];
    dyad_job_dir(c, &none, jobid, uid, standard, sizeof standard);
    if (strcmp(standard, r->dir) == 0) {
        /* PARENT/UID (the user's), then nothing at PARENT/UID/JOBID. */
        int ufd = dyad_user_dir(pfd, c->parent, uid, gid, err, sizeof err);
        if (ufd < 0) {
            slurm_error("dyad: job %u: %s", jobid, err);
            close(pfd);
            return -1;
        }
        char name[16], moved[256];
        snprintf(name, sizeof name, "%u", jobid);
        int m = dyad_move_aside(ufd, name, moved, sizeof moved);
        if (m > 0)
            slurm_error("dyad: job %u: %s held an older entry: moved aside to %s/%u/%s", jobid,
                        r->dir, c->parent, (unsigned)uid, moved);
        close(ufd);
        if (m < 0)
            return job_failed(pfd, jobid, r, node, "cannot move aside an older job directory");
    }
    if (dyad_write_record(pfd, jobid, r) != 0) {
        slurm_error("dyad: job %u: cannot write its record in %s: %m", jobid, c->parent);
        close(pfd);
        return -1;
    }
    char key[66];
    if (dyad_derive_key(c, jobid, uid, key) != 0) {
        close(pfd);
        return -1;
    }
    struct dyad_started s;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = dyad_node_up(c, node, nodes, jobid, uid, gid, r->dir, key, &s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    explicit_bzero(key, sizeof key);
    if (rc == DYAD_RUN_NODE_FAULT) {
        slurm_error("dyad: job %u: cannot run `dyad job node-up` on %s: %s", jobid, node, s.output);
        close(pfd);
        return -1;
    }
    if (rc != 0) {
        char why[DYAD_REASON_MAX];
        snprintf(why, sizeof why, "%s", s.output[0] ? s.output : "`dyad job node-up` failed");
        return job_failed(pfd, jobid, r, node, why);
    }
    if (s.output[0]) slurm_info("dyad: job %u: %s", jobid, s.output);
    snprintf(r->state, sizeof r->state, "ready");
    snprintf(r->address, sizeof r->address, "%s", s.address);
    if (dyad_write_record(pfd, jobid, r) != 0)
        slurm_error("dyad: job %u: cannot write its record in %s: %m", jobid, c->parent);
    close(pfd);
    slurm_info("dyad: job %u: dyadd ready on %s in %.3f s", jobid, node, seconds(&t0, &t1));
    return 0;
}

int slurm_spank_job_epilog(spank_t sp, int ac, char** av) {
    struct dyad_conf c;
    if (dyad_parse_conf(ac, av, &c) != 0) return -1;
    uint32_t jobid;
    uid_t uid;
    gid_t gid;
    if (job_ids(sp, &jobid, &uid, &gid) != 0) return 0;
    char err[1024] = "";
    int pfd = dyad_open_parent(c.parent, 0, err, sizeof err);
    if (pfd < 0) return 0; /* no parent of root's: nothing of ours here */
    struct dyad_record r;
    if (dyad_read_record(pfd, jobid, &r) != 0) { /* the job did not ask for DYAD */
        close(pfd);
        return 0;
    }
    if (r.uid != uid)
        slurm_error("dyad: job %u: its record names uid %u, the job's is %u: cleaning as uid %u",
                    jobid, (unsigned)r.uid, (unsigned)uid, (unsigned)r.uid);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char out[DYAD_REASON_MAX];
    int rc = dyad_node_down(&c, r.uid, r.gid, r.dir, out, sizeof out);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == DYAD_RUN_NODE_FAULT) {
        /* a dyadd that does not die: the node is not fit for the next job */
        slurm_error("dyad: job %u: %s", jobid, out);
        close(pfd);
        return -1;
    }
    if (rc != 0)
        slurm_error("dyad: job %u: cleaning %s: %s (the node stays in service)", jobid, r.dir, out);
    dyad_remove_record(pfd, jobid);
    close(pfd);
    slurm_info("dyad: job %u: stopped and cleaned in %.3f s", jobid, seconds(&t0, &t1));
    return 0;
}

/* Every task of the job (and the batch script): the DYAD environment, from
 * the prolog's record only. */
int slurm_spank_user_init(spank_t sp, int ac, char** av) {
    struct dyad_conf c;
    const char* arg = NULL;
    if (!spank_remote(sp) || !requested(sp, &arg)) return 0;
    uint32_t jobid;
    uid_t uid;
    gid_t gid;
    if (dyad_parse_conf(ac, av, &c) != 0 || job_ids(sp, &jobid, &uid, &gid) != 0) {
        snprintf(g_fail, sizeof g_fail,
                 "the DYAD plugin's configuration is not valid (slurmd's log says why)");
        return 0;
    }
    char err[1024] = "";
    struct dyad_record r;
    int pfd = dyad_open_parent(c.parent, 0, err, sizeof err);
    int have = pfd >= 0 && dyad_read_record(pfd, jobid, &r) == 0;
    if (pfd >= 0) close(pfd);
    if (!have) {
        snprintf(g_fail, sizeof g_fail,
                 "the DYAD prolog did not run on this node before the job's tasks (no record in "
                 "%.512s): slurm.conf needs PrologFlags=Alloc; tell the cluster's administrators",
                 c.parent);
        return 0;
    }
    if (r.uid != uid) {
        snprintf(g_fail, sizeof g_fail, "the DYAD record of this job on this node is not yours");
        return 0;
    }
    if (strcmp(r.state, "ready") != 0) {
        snprintf(g_fail, sizeof g_fail, "DYAD did not start on this node: %s",
                 r.reason[0] ? r.reason : "its start did not finish");
        return 0;
    }
    struct dyad_user u;
    if (dyad_parse_user(arg, &c, &u, err, sizeof err) != 0) memset(&u, 0, sizeof u);
    dyad_task_env(sp, &c, &u, jobid, r.dir);
    return 0;
}

/* A task of a job whose DYAD is not there: it fails, saying why, in the
 * job's output (stderr); the node is not touched. */
int slurm_spank_task_init(spank_t sp, int ac, char** av) {
    (void)sp;
    (void)ac;
    (void)av;
    if (!g_fail[0]) return 0;
    const char* node = getenv("SLURMD_NODENAME");
    const char* job = getenv("SLURM_JOB_ID");
    fprintf(stderr, "dyad: job %s, node %s: %s\n", job ? job : "?", node ? node : "?", g_fail);
    fflush(stderr);
    return -1;
}
