/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "spank_run.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

/* node-up's and node-down's exit codes (tools/job/support.hpp). */
#define DYAD_EXIT_DOES_NOT_END 5

int dyad_derive_key(const struct dyad_conf* c, uint32_t jobid, uid_t uid, char out[66]) {
    const char* paths[2] = {c->site_key[0] ? c->site_key : "/etc/dyad/slurm.key",
                            c->site_key[0] ? NULL : "/etc/munge/munge.key"};
    unsigned char secret[4096], mac[crypto_auth_hmacsha256_BYTES];
    ssize_t len = -1;
    for (int i = 0; i < 2 && len < 0 && paths[i]; ++i) {
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) continue;
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && !(st.st_mode & 0077))
            len = read(fd, secret, sizeof secret);
        else
            slurm_error("dyad: %s must be a regular file with no group or other access", paths[i]);
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
    return 0;
}

/* In the child: become uid/gid (with the user's groups), a clean
 * environment, `/` as the working directory. */
static void become(uid_t uid, gid_t gid) {
    struct passwd* pw = getpwuid(uid);
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
}

/* Reads `fd` until it closes or the deadline; the last part that fits. */
static int read_all(int fd, char* out, size_t n, int timeout) {
    size_t got = 0;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = (long)timeout * 1000 -
                    ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
        if (left <= 0) break;
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        ssize_t k = read(fd, out + got, n - 1 - got);
        if (k <= 0) {
            out[got] = 0;
            return 0;
        }
        got += (size_t)k;
        if (got >= n - 1) got = 0; /* keep the last part */
    }
    out[got] = 0;
    return -1;
}

/* Runs `dyad job ARGS...` as uid/gid, `input` on its standard input, its
 * standard output and error into `out`; waits at most `timeout` seconds.
 * Its exit code, -1 when it did not end in time (then killed),
 * DYAD_RUN_NODE_FAULT when it could not be started. */
static int run_as_user(uid_t uid, gid_t gid, const char* dyad, char* const args[],
                       const char* input, int timeout, char* out, size_t n) {
    int in[2], o[2];
    out[0] = 0;
    if (pipe2(in, O_CLOEXEC) != 0) return DYAD_RUN_NODE_FAULT;
    if (pipe2(o, O_CLOEXEC) != 0) {
        close(in[0]);
        close(in[1]);
        return DYAD_RUN_NODE_FAULT;
    }
    pid_t pid = fork();
    if (pid == 0) {
        /* slurmstepd may run us with 0-2 closed: a pipe's end can be one of
         * them. Move every end above them first, then into place. */
        int fin = fcntl(in[0], F_DUPFD_CLOEXEC, 10), fout = fcntl(o[1], F_DUPFD_CLOEXEC, 10);
        if (fin < 0 || fout < 0 || dup2(fin, 0) < 0 || dup2(fout, 1) < 0 || dup2(fout, 2) < 0)
            _exit(126);
        become(uid, gid);
        execv(dyad, args);
        fprintf(stderr, "cannot run %s: %s\n", dyad, strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(o[1]);
    if (pid < 0) {
        close(in[1]);
        close(o[0]);
        snprintf(out, n, "fork: %s", strerror(errno));
        return DYAD_RUN_NODE_FAULT;
    }
    if (input && write(in[1], input, strlen(input)) < 0) slurm_error("dyad: writing the key: %m");
    close(in[1]);
    int timed_out = read_all(o[0], out, n, timeout) != 0;
    close(o[0]);
    if (timed_out) kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    size_t len = strlen(out);
    while (len && (out[len - 1] == '\n' || out[len - 1] == ' ')) out[--len] = 0;
    if (timed_out) return -1;
    if (WIFEXITED(status) && (WEXITSTATUS(status) == 126 || WEXITSTATUS(status) == 127))
        return DYAD_RUN_NODE_FAULT;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void dyad_tool_of(const struct dyad_conf* c, char* out, size_t n) {
    const char* slash = strrchr(c->dyadd, '/');
    if (!slash)
        snprintf(out, n, "dyad");
    else
        snprintf(out, n, "%.*s/dyad", (int)(slash - c->dyadd), c->dyadd);
}

/* "ready NODE ADDR:PORT pid N" out of node-up's words; the rest stays. */
static void take_ready_line(char* text, char* address, size_t n) {
    char* line = text;
    while (line && *line) {
        char* next = strchr(line, '\n');
        if (strncmp(line, "ready ", 6) == 0) {
            char nodebuf[256], addr[128];
            if (sscanf(line, "ready %255s %127s", nodebuf, addr) == 2)
                snprintf(address, n, "%s", addr);
            size_t rest = next ? strlen(next + 1) : 0;
            memmove(line, next ? next + 1 : line + strlen(line), rest + 1);
            continue;
        }
        line = next ? next + 1 : NULL;
    }
    size_t len = strlen(text);
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) text[--len] = 0;
}

int dyad_node_up(const struct dyad_conf* c, const char* node, const char* nodes, uint32_t jobid,
                 uid_t uid, gid_t gid, const char* dir, const char* key, struct dyad_started* s) {
    char dyad[DYAD_PATH_MAX], id[16], timeout[16], ports[48], transports[300];
    char conf_arg[DYAD_PATH_MAX + 16], store_arg[32], etcd_arg[DYAD_PATH_MAX + 16];
    memset(s, 0, sizeof *s);
    dyad_tool_of(c, dyad, sizeof dyad);
    snprintf(id, sizeof id, "%u", jobid);
    snprintf(timeout, sizeof timeout, "%d", c->timeout);
    char* args[40] = {
        dyad,        "job",        "node-up", "--detach",      "--node",       (char*)node,
        "--nodes",   (char*)nodes, "--dir",   (char*)dir,      "--job-id",     id,
        "--timeout", timeout,      "--dyadd", (char*)c->dyadd, "--from-prolog"};
    int n = 17;
    if (c->ports[0]) {
        snprintf(ports, sizeof ports, "%s=%s", strchr(c->ports, '-') ? "--ports" : "--port",
                 c->ports);
        args[n++] = ports;
    }
    /* Node addresses as slurmd has them (NodeAddr), and PrologFlags. */
    const char* sc = getenv("SLURM_CONF");
    if (!sc && access("/etc/slurm/slurm.conf", R_OK) == 0) sc = "/etc/slurm/slurm.conf";
    if (sc) {
        snprintf(conf_arg, sizeof conf_arg, "--slurm-conf=%s", sc);
        args[n++] = conf_arg;
    }
    if (c->kvs[0]) args[n++] = "--kvs", args[n++] = (char*)c->kvs;
    if (c->store[0]) {
        snprintf(store_arg, sizeof store_arg, "--store=%s", c->store);
        args[n++] = store_arg;
    }
    if (c->etcd[0]) {
        snprintf(etcd_arg, sizeof etcd_arg, "--etcd=%s", c->etcd);
        args[n++] = etcd_arg;
    }
    if (c->transports[0]) {
        snprintf(transports, sizeof transports, "--dyadd-arg=--transports=%s", c->transports);
        args[n++] = transports;
    }
    args[n] = NULL;
    int rc = run_as_user(uid, gid, dyad, args, key, c->timeout + 5, s->output, sizeof s->output);
    take_ready_line(s->output, s->address, sizeof s->address);
    if (rc == DYAD_RUN_NODE_FAULT) return rc;
    if (rc == -1 && !s->output[0])
        snprintf(s->output, sizeof s->output, "`dyad job node-up` did not end within %d s",
                 c->timeout + 5);
    return rc == 0 && s->address[0] ? 0 : -1;
}

int dyad_node_down(const struct dyad_conf* c, uid_t uid, gid_t gid, const char* dir, char* out,
                   size_t n) {
    char dyad[DYAD_PATH_MAX];
    dyad_tool_of(c, dyad, sizeof dyad);
    char* args[] = {dyad, "job", "node-down", "--dir", (char*)dir, "--timeout", "10", NULL};
    int rc = run_as_user(uid, gid, dyad, args, NULL, 20, out, n);
    if (rc == DYAD_EXIT_DOES_NOT_END || rc == -1) {
        if (!out[0]) snprintf(out, n, "`dyad job node-down` did not end within 20 s");
        return DYAD_RUN_NODE_FAULT;
    }
    return rc == 0 ? 0 : -1;
}

/* LIB beside the installation: the plugin's own directory (a build tree's
 * lib/), its parent (<libdir>/slurm-wlm), or lib/ beside dyadd's bin/. */
static int find_lib(const struct dyad_conf* c, const char* lib, char* out, size_t n) {
    char dirs[3][DYAD_PATH_MAX];
    int k = 0;
    Dl_info info;
    char self[DYAD_PATH_MAX];
    if (dladdr((void*)find_lib, &info) && info.dli_fname && realpath(info.dli_fname, self)) {
        char* slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            snprintf(dirs[k++], DYAD_PATH_MAX, "%s", self);
            slash = strrchr(self, '/');
            if (slash && slash != self) {
                *slash = 0;
                snprintf(dirs[k++], DYAD_PATH_MAX, "%s", self);
            }
        }
    }
    const char* bin = strrchr(c->dyadd, '/');
    if (bin) {
        char up[DYAD_PATH_MAX];
        snprintf(up, sizeof up, "%.*s", (int)(bin - c->dyadd), c->dyadd);
        char* slash = strrchr(up, '/');
        if (slash) {
            *slash = 0;
            snprintf(dirs[k++], DYAD_PATH_MAX, "%.4000s/lib", up);
        }
    }
    for (int i = 0; i < k; ++i) {
        snprintf(out, n, "%s/%s", dirs[i], lib);
        if (access(out, R_OK) == 0) return 0;
    }
    return -1;
}

void dyad_task_env(spank_t sp, const struct dyad_conf* c, const struct dyad_user* u, uint32_t jobid,
                   const char* dir) {
    char v[DYAD_PATH_MAX + 32];
    snprintf(v, sizeof v, "unix:%s/dyadd.sock", dir);
    spank_setenv(sp, "DYAD_SERVICE_URI", v, 1);
    snprintf(v, sizeof v, "%s/data", dir);
    spank_setenv(sp, "DYAD_PATH_PRODUCER", v, 1);
    spank_setenv(sp, "DYAD_PATH_CONSUMER", v, 1);
    snprintf(v, sizeof v, "%s/job.key", dir);
    spank_setenv(sp, "DYAD_AUTH_KEY_FILE", v, 1);
    snprintf(v, sizeof v, "dyad-job-%u", jobid);
    spank_setenv(sp, "DYAD_KVS_NAMESPACE", v, 1);
    spank_setenv(sp, "DYAD_JOB_MANAGER", "slurm", 1);
    if (find_lib(c, "libdyad_wrapper.so", v, sizeof v) == 0) spank_setenv(sp, "DYAD_WRAPPER", v, 1);
    if (find_lib(c, "libdyad.so", v, sizeof v) == 0) spank_setenv(sp, "DYAD_LIBRARY", v, 1);
    if (u->mode[0]) spank_setenv(sp, "DYAD_DTL_MODE", u->mode, 1);
    if (u->wait[0]) spank_setenv(sp, "DYAD_WAIT_TIMEOUT", u->wait, 1);
}
