/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dyad_spank.so: `--dyad[=OPTIONS]` for sbatch, salloc and srun.
 *
 * With it, the job prolog (PrologFlags=Alloc: on every allocated node, at
 * allocation) starts the job's dyadd on the node as the job's user, through
 * `dyad job node-up --detach`, and returns once it accepts connections; every
 * task gets DYAD_SERVICE_URI, DYAD_PATH_PRODUCER, DYAD_PATH_CONSUMER,
 * DYAD_AUTH_KEY_FILE and DYAD_KVS_NAMESPACE; the job epilog (normal end,
 * scancel, time limit) runs `dyad job node-down`, which stops the dyadd and
 * removes the key, the job directory and the dyadd's /dev/shm files.
 * Without --dyad the plugin does nothing.
 *
 * The job key is the same on every node without being sent anywhere: each
 * node's prolog derives it as HMAC-SHA-256(site secret, cluster, job id, uid)
 * from a root-only site secret file (site_key=, default /etc/dyad/slurm.key,
 * else Munge's key), and writes it, as the user, into the job directory
 * (mode 0600). See docs/security.md.
 *
 * plugstack.conf arguments (all optional): dyadd=PATH (default: bin/dyadd
 * beside this plugin's installation), dir=TEMPLATE ({jobid}, {uid}; default
 * /tmp/dyad-{jobid}), port=N (default 20000 + job id % 10000), kvs=URI (an
 * etcd://... for the whole site; default: the first node's dyadd),
 * site_key=PATH, timeout=SECONDS (default 60), transports=LIST (dyadd
 * --transports), user_dir=yes (users may give dir=).
 *
 * Users' OPTIONS, comma-separated: mode=TRANSPORT (DYAD_DTL_MODE of the
 * tasks), wait=SECONDS (DYAD_WAIT_TIMEOUT), dir=TEMPLATE (if the site allows).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>
#include <sodium.h>

SPANK_PLUGIN(dyad, 1);

#define DYAD_PATH_MAX 4096

struct dyad_conf {
    char dyadd[DYAD_PATH_MAX];
    char dir_template[DYAD_PATH_MAX];
    char kvs[1024];
    char site_key[DYAD_PATH_MAX];
    char transports[256];
    unsigned port;
    int timeout;
    int user_dir;
    /* from --dyad=OPTIONS */
    char mode[64];
    char wait[32];
    char user_dir_template[DYAD_PATH_MAX];
};

static int dyad_requested = 0;
static char dyad_optarg[1024] = "";

static int dyad_opt_cb(int val, const char* optarg, int remote);

static struct spank_option dyad_option = {
    "dyad",
    "[OPTIONS]",
    "start DYAD for this job: a dyadd on every node, the DYAD_* environment in every task "
    "(OPTIONS, comma-separated: mode=TRANSPORT, wait=SECONDS, dir=TEMPLATE if the site allows)",
    2,
    0,
    dyad_opt_cb};

static int copy(char* dst, size_t n, const char* src) {
    if (strlen(src) >= n) return -1;
    strcpy(dst, src);
    return 0;
}

/* The user's OPTIONS into conf; -1 (and a message) when one is not known. */
static int parse_user_options(const char* arg, struct dyad_conf* c, int quiet) {
    char buf[1024];
    /* --dyad without OPTIONS reaches the job's steps as "(null)" (sbatch
     * exports the option as SLURM_SPANK__SLURM_SPANK_OPTION_dyad_dyad). */
    if (!arg || !*arg || strcmp(arg, "(null)") == 0) return 0;
    if (copy(buf, sizeof buf, arg) != 0) return -1;
    char* save = NULL;
    for (char* tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (strncmp(tok, "mode=", 5) == 0 && copy(c->mode, sizeof c->mode, tok + 5) == 0) continue;
        if (strncmp(tok, "wait=", 5) == 0 && copy(c->wait, sizeof c->wait, tok + 5) == 0) continue;
        if (strncmp(tok, "dir=", 4) == 0 && tok[4] == '/' &&
            copy(c->user_dir_template, sizeof c->user_dir_template, tok + 4) == 0)
            continue;
        if (!quiet)
            slurm_error("dyad: --dyad=%s: '%s' is not mode=TRANSPORT, wait=SECONDS or dir=/PATH",
                        arg, tok);
        return -1;
    }
    return 0;
}

static int dyad_opt_cb(int val, const char* optarg, int remote) {
    struct dyad_conf c;
    (void)val;
    (void)remote;
    memset(&c, 0, sizeof c);
    if (parse_user_options(optarg, &c, 0) != 0) return -1;
    dyad_requested = 1;
    snprintf(dyad_optarg, sizeof dyad_optarg, "%s", optarg ? optarg : "");
    return 0;
}

/* bin/dyadd of the installation (or build tree) this plugin belongs to: the
 * nearest ancestor of its directory that has one. */
static void find_dyadd(char* out, size_t n) {
    Dl_info info;
    char dir[DYAD_PATH_MAX];
    out[0] = 0;
    if (!dladdr((void*)find_dyadd, &info) || !info.dli_fname) return;
    if (!realpath(info.dli_fname, dir)) return;
    for (int up = 0; up < 4; ++up) {
        char* slash = strrchr(dir, '/');
        if (!slash || slash == dir) return;
        *slash = 0;
        char cand[DYAD_PATH_MAX + 16];
        snprintf(cand, sizeof cand, "%s/bin/dyadd", dir);
        if (access(cand, X_OK) == 0) {
            snprintf(out, n, "%s", cand);
            return;
        }
    }
}

static int parse_conf(int ac, char** av, struct dyad_conf* c) {
    memset(c, 0, sizeof *c);
    snprintf(c->dir_template, sizeof c->dir_template, "/tmp/dyad-{jobid}");
    c->timeout = 60;
    for (int i = 0; i < ac; ++i) {
        const char* a = av[i];
        int bad = 0;
        if (strncmp(a, "dyadd=", 6) == 0)
            bad = copy(c->dyadd, sizeof c->dyadd, a + 6);
        else if (strncmp(a, "dir=", 4) == 0)
            bad = copy(c->dir_template, sizeof c->dir_template, a + 4) || a[4] != '/';
        else if (strncmp(a, "kvs=", 4) == 0)
            bad = copy(c->kvs, sizeof c->kvs, a + 4);
        else if (strncmp(a, "site_key=", 9) == 0)
            bad = copy(c->site_key, sizeof c->site_key, a + 9);
        else if (strncmp(a, "transports=", 11) == 0)
            bad = copy(c->transports, sizeof c->transports, a + 11);
        else if (strncmp(a, "port=", 5) == 0)
            bad = (c->port = (unsigned)strtoul(a + 5, NULL, 10)) == 0 || c->port > 65535;
        else if (strncmp(a, "timeout=", 8) == 0)
            bad = (c->timeout = atoi(a + 8)) <= 0;
        else if (strcmp(a, "user_dir=yes") == 0)
            c->user_dir = 1;
        else
            bad = 1;
        if (bad) {
            slurm_error("dyad: plugstack.conf argument '%s' is not known or not valid", a);
            return -1;
        }
    }
    if (!c->dyadd[0]) find_dyadd(c->dyadd, sizeof c->dyadd);
    return 0;
}

static void job_dir(const struct dyad_conf* c, const char* jobid, uid_t uid, char* out, size_t n) {
    const char* t = c->user_dir && c->user_dir_template[0] ? c->user_dir_template : c->dir_template;
    size_t o = 0;
    char uidbuf[32];
    snprintf(uidbuf, sizeof uidbuf, "%u", (unsigned)uid);
    while (*t && o + 1 < n) {
        const char* sub = NULL;
        size_t skip = 0;
        if (strncmp(t, "{jobid}", 7) == 0) sub = jobid, skip = 7;
        if (strncmp(t, "{uid}", 5) == 0) sub = uidbuf, skip = 5;
        if (sub) {
            o += (size_t)snprintf(out + o, n - o, "%s", sub);
            if (o >= n) o = n - 1;
            t += skip;
        } else {
            out[o++] = *t++;
        }
    }
    out[o] = 0;
}

static unsigned job_port(const struct dyad_conf* c, uint32_t jobid) {
    return c->port ? c->port : 20000 + jobid % 10000;
}

/* --dyad given (in the submitting command, or in the job's record). */
static int requested(spank_t sp, struct dyad_conf* c) {
    char* arg = NULL;
    if (spank_option_getopt(sp, &dyad_option, &arg) == ESPANK_SUCCESS) {
        parse_user_options(arg, c, 1);
        return 1;
    }
    if (dyad_requested) parse_user_options(dyad_optarg, c, 1);
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

/* HMAC-SHA-256(site secret; "dyad-slurm-job-key-v1", cluster, job id, uid)
 * as 64 hex digits and a new line. */
static int derive_key(const struct dyad_conf* c, uint32_t jobid, uid_t uid, char out[66]) {
    const char* paths[2] = {c->site_key[0] ? c->site_key : "/etc/dyad/slurm.key",
                            c->site_key[0] ? NULL : "/etc/munge/munge.key"};
    unsigned char secret[4096], mac[crypto_auth_hmacsha256_BYTES];
    ssize_t len = -1;
    const char* used = paths[0];
    for (int i = 0; i < 2 && len < 0 && paths[i]; ++i) {
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) continue;
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && !(st.st_mode & 0077)) {
            len = read(fd, secret, sizeof secret);
            used = paths[i];
        } else {
            slurm_error("dyad: %s must be a regular file with no group or other access", paths[i]);
        }
        close(fd);
    }
    if (len < 32) {
        slurm_error(
            "dyad: no site secret of 32 bytes or more in %s%s: make one on every node "
            "(dyad keygen FILE as root, then chmod 0400)",
            paths[0], paths[1] ? " nor in /etc/munge/munge.key" : "");
        return -1;
    }
    if (sodium_init() < 0) return -1;
    char msg[512];
    const char* cluster = getenv("SLURM_CLUSTER_NAME");
    int m = snprintf(msg, sizeof msg, "dyad-slurm-job-key-v1%c%s%c%u%c%u", 0,
                     cluster ? cluster : "", 0, jobid, 0, (unsigned)uid);
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, secret, (size_t)len);
    crypto_auth_hmacsha256_update(&st, (const unsigned char*)msg, (unsigned long long)m);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_bin2hex(out, 65, mac, sizeof mac);
    out[64] = '\n';
    out[65] = 0;
    sodium_memzero(secret, sizeof secret);
    sodium_memzero(mac, sizeof mac);
    (void)used;
    return 0;
}

/* Runs `dyad job ARGS...` as uid/gid, `input` on its stdin; waits at most
 * `timeout` seconds. Its stderr goes to the slurmd log. 0 on success. */
static int run_as_user(uid_t uid, gid_t gid, const char* dyad, char* const args[],
                       const char* input, int timeout) {
    int in[2], err[2];
    if (pipe2(in, O_CLOEXEC) != 0) return -1;
    if (pipe2(err, O_CLOEXEC) != 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    struct passwd* pw = getpwuid(uid);
    pid_t pid = fork();
    if (pid == 0) {
        /* slurmstepd may run us with 0-2 closed: a pipe's end can be one of
         * them. Move every end above them first, then into place. */
        int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
        int fin = fcntl(in[0], F_DUPFD_CLOEXEC, 10), fout = fcntl(devnull, F_DUPFD_CLOEXEC, 10),
            ferr = fcntl(err[1], F_DUPFD_CLOEXEC, 10);
        if (fin < 0 || fout < 0 || ferr < 0 || dup2(fin, 0) < 0 || dup2(fout, 1) < 0 ||
            dup2(ferr, 2) < 0)
            _exit(126);
        if (pw) {
            if (initgroups(pw->pw_name, gid) != 0 && getuid() == 0) _exit(126);
        } else if (setgroups(0, NULL) != 0 && getuid() == 0) {
            _exit(126);
        }
        if (setgid(gid) != 0 || setuid(uid) != 0) {
            fprintf(stderr, "cannot become uid %u gid %u: %s\n", (unsigned)uid, (unsigned)gid,
                    strerror(errno));
            _exit(126);
        }
        if (chdir("/") != 0) _exit(126);
        const char* keep[] = {"SLURM_JOB_ID", "SLURM_CLUSTER_NAME", "SLURMD_NODENAME", NULL};
        char* saved[3] = {NULL, NULL, NULL};
        for (int i = 0; keep[i]; ++i)
            if (getenv(keep[i])) saved[i] = strdup(getenv(keep[i]));
        clearenv();
        for (int i = 0; keep[i]; ++i)
            if (saved[i]) setenv(keep[i], saved[i], 1);
        setenv("PATH", "/usr/local/bin:/usr/bin:/bin", 1);
        if (pw) {
            setenv("HOME", pw->pw_dir, 1);
            setenv("USER", pw->pw_name, 1);
            setenv("LOGNAME", pw->pw_name, 1);
        }
        execv(dyad, args);
        fprintf(stderr, "cannot run %s: %s\n", dyad, strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(err[1]);
    if (pid < 0) {
        close(in[1]);
        close(err[0]);
        return -1;
    }
    if (input && write(in[1], input, strlen(input)) < 0) slurm_error("dyad: writing the key: %m");
    close(in[1]);
    /* Read its stderr until it closes (it ends), at most until the deadline. */
    char msg[4096];
    size_t got = 0;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int timed_out = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = (long)timeout * 1000 -
                    ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd p = {err[0], POLLIN, 0};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            timed_out = r == 0;
            break;
        }
        ssize_t n = read(err[0], msg + got, sizeof msg - 1 - got);
        if (n <= 0) break;
        got += (size_t)n;
        if (got >= sizeof msg - 1) got = 0; /* keep the last part */
    }
    msg[got] = 0;
    close(err[0]);
    if (timed_out) kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (got) slurm_error("dyad: %s", msg);
    if (timed_out) {
        slurm_error("dyad: `dyad job %s` did not end within %d s", args[2], timeout);
        return -1;
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
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
    (void)ac;
    (void)av;
    /* sbatch ignores a static spank_options table: registered here. */
    if (spank_option_register(sp, &dyad_option) != ESPANK_SUCCESS) {
        slurm_error("dyad: cannot register --dyad");
        return -1;
    }
    return 0;
}

int slurm_spank_job_prolog(spank_t sp, int ac, char** av) {
    struct dyad_conf c;
    if (parse_conf(ac, av, &c) != 0) return -1;
    if (!requested(sp, &c)) return 0;
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
    if (!c.dyadd[0]) {
        slurm_error("dyad: no dyadd beside this plugin: give dyadd=PATH in plugstack.conf");
        return -1;
    }
    char dyad[DYAD_PATH_MAX], dir[DYAD_PATH_MAX], id[16], port[16], timeout[16], key[66];
    dyad_tool(&c, dyad, sizeof dyad);
    snprintf(id, sizeof id, "%u", jobid);
    job_dir(&c, id, uid, dir, sizeof dir);
    snprintf(port, sizeof port, "%u", job_port(&c, jobid));
    snprintf(timeout, sizeof timeout, "%d", c.timeout);
    if (derive_key(&c, jobid, uid, key) != 0) return -1;
    char transports[300];
    snprintf(transports, sizeof transports, "--dyadd-arg=--transports=%s", c.transports);
    char* args[32] = {dyad,      "job",        "node-up",   "--detach", "--node",   (char*)node,
                      "--nodes", (char*)nodes, "--dir",     dir,        "--job-id", id,
                      "--port",  port,         "--timeout", timeout,    "--dyadd",  c.dyadd};
    int n = 18;
    if (c.kvs[0]) args[n++] = "--kvs", args[n++] = c.kvs;
    if (c.transports[0]) args[n++] = transports;
    args[n] = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = run_as_user(uid, gid, dyad, args, key, c.timeout + 5);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    sodium_memzero(key, sizeof key);
    if (rc == 0)
        slurm_info("dyad: job %u: dyadd ready on %s in %.3f s", jobid, node, seconds(&t0, &t1));
    if (rc != 0)
        slurm_error("dyad: job %u: the dyadd on %s did not start (its log: %s/dyadd.log)", jobid,
                    node, dir);
    return rc;
}

int slurm_spank_job_epilog(spank_t sp, int ac, char** av) {
    struct dyad_conf c;
    if (parse_conf(ac, av, &c) != 0) return -1;
    int asked = requested(sp, &c);
    uint32_t jobid;
    uid_t uid;
    gid_t gid;
    if (job_ids(sp, &jobid, &uid, &gid) != 0) return asked ? -1 : 0;
    char dyad[DYAD_PATH_MAX], dir[DYAD_PATH_MAX], id[16];
    snprintf(id, sizeof id, "%u", jobid);
    job_dir(&c, id, uid, dir, sizeof dir);
    /* Not asked, and no dyadd of the job was started here: nothing of ours
     * (a directory of that name without our pid file is left alone). */
    char pidfile[DYAD_PATH_MAX + 16];
    struct stat st;
    snprintf(pidfile, sizeof pidfile, "%s/dyadd.pid", dir);
    if (!asked && lstat(pidfile, &st) != 0) return 0;
    if (!c.dyadd[0]) return asked ? -1 : 0;
    dyad_tool(&c, dyad, sizeof dyad);
    char* args[] = {dyad, "job", "node-down", "--dir", dir, "--timeout", "10", NULL};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (run_as_user(uid, gid, dyad, args, NULL, 20) != 0) {
        slurm_error("dyad: job %u: could not stop or clean %s", jobid, dir);
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    slurm_info("dyad: job %u: stopped and cleaned in %.3f s", jobid, seconds(&t0, &t1));
    return 0;
}

/* Every task of the job (and the batch script): the DYAD environment. */
int slurm_spank_user_init(spank_t sp, int ac, char** av) {
    struct dyad_conf c;
    if (!spank_remote(sp)) return 0;
    if (parse_conf(ac, av, &c) != 0) return -1;
    uint32_t jobid;
    uid_t uid;
    gid_t gid;
    if (job_ids(sp, &jobid, &uid, &gid) != 0) return 0;
    char id[16], dir[DYAD_PATH_MAX], v[DYAD_PATH_MAX + 32];
    snprintf(id, sizeof id, "%u", jobid);
    int asked = requested(sp, &c);
    job_dir(&c, id, uid, dir, sizeof dir);
    snprintf(v, sizeof v, "%s/dyadd.sock", dir);
    struct stat st;
    if (!asked && stat(v, &st) != 0) return 0;
    if (asked && stat(v, &st) != 0)
        slurm_error("dyad: job %u: no dyadd socket at %s (is PrologFlags=Alloc set?)", jobid, v);
    snprintf(v, sizeof v, "unix:%s/dyadd.sock", dir);
    spank_setenv(sp, "DYAD_SERVICE_URI", v, 1);
    snprintf(v, sizeof v, "%s/data", dir);
    spank_setenv(sp, "DYAD_PATH_PRODUCER", v, 1);
    spank_setenv(sp, "DYAD_PATH_CONSUMER", v, 1);
    snprintf(v, sizeof v, "%s/job.key", dir);
    spank_setenv(sp, "DYAD_AUTH_KEY_FILE", v, 1);
    snprintf(v, sizeof v, "dyad-job-%u", jobid);
    spank_setenv(sp, "DYAD_KVS_NAMESPACE", v, 1);
    if (c.mode[0]) spank_setenv(sp, "DYAD_DTL_MODE", c.mode, 1);
    if (c.wait[0]) spank_setenv(sp, "DYAD_WAIT_TIMEOUT", c.wait, 1);
    return 0;
}
