/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "spank_options.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <slurm/spank.h>

static int copy(char* dst, size_t n, const char* src) {
    if (strlen(src) >= n) return -1;
    strcpy(dst, src);
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

/* An absolute path without "." or ".." components nor "//". */
static int clean_path(const char* p) {
    if (p[0] != '/' || strstr(p, "//") || strstr(p, "/./") || strstr(p, "/../")) return 0;
    size_t n = strlen(p);
    if (n >= 2 && strcmp(p + n - 2, "/.") == 0) return 0;
    if (n >= 3 && strcmp(p + n - 3, "/..") == 0) return 0;
    for (const char* q = p; *q; ++q)
        if (*q == '\n' || *q == '\r' || *q == ',') return 0;
    return 1;
}

static int valid_ports(const char* s) {
    unsigned a = 0, b = 0;
    char extra;
    int n = sscanf(s, "%u-%u%c", &a, &b, &extra);
    if (n == 1) return a > 0 && a <= 65535;
    return n == 2 && a > 0 && b <= 65535 && a <= b;
}

int dyad_parse_conf(int ac, char** av, struct dyad_conf* c) {
    memset(c, 0, sizeof *c);
    snprintf(c->parent, sizeof c->parent, "/tmp/dyad");
    c->timeout = 60;
    for (int i = 0; i < ac; ++i) {
        const char* a = av[i];
        int bad = 0;
        if (strncmp(a, "dyadd=", 6) == 0)
            bad = copy(c->dyadd, sizeof c->dyadd, a + 6);
        else if (strncmp(a, "parent=", 7) == 0)
            bad = copy(c->parent, sizeof c->parent, a + 7) || !clean_path(a + 7) ||
                  strcmp(a + 7, "/") == 0 || strlen(a + 7) > 64;
        else if (strncmp(a, "kvs=", 4) == 0)
            bad = copy(c->kvs, sizeof c->kvs, a + 4);
        else if (strncmp(a, "site_key=", 9) == 0)
            bad = copy(c->site_key, sizeof c->site_key, a + 9);
        else if (strncmp(a, "transports=", 11) == 0)
            bad = copy(c->transports, sizeof c->transports, a + 11);
        else if (strncmp(a, "ports=", 6) == 0 || strncmp(a, "port=", 5) == 0)
            bad = copy(c->ports, sizeof c->ports, strchr(a, '=') + 1) ||
                  !valid_ports(strchr(a, '=') + 1);
        else if (strncmp(a, "store=", 6) == 0)
            bad = copy(c->store, sizeof c->store, a + 6) ||
                  (strcmp(a + 6, "auto") != 0 && strcmp(a + 6, "etcd") != 0 &&
                   strcmp(a + 6, "embedded") != 0);
        else if (strncmp(a, "etcd=", 5) == 0)
            bad = copy(c->etcd, sizeof c->etcd, a + 5) || a[5] != '/';
        else if (strncmp(a, "timeout=", 8) == 0)
            bad = (c->timeout = atoi(a + 8)) <= 0;
        else if (strcmp(a, "user_dir=yes") == 0)
            c->user_dir = 1;
        else
            bad = 1;
        if (bad) {
            slurm_error("dyad: plugstack.conf argument '%s' is not known or not valid%s", a,
                        strncmp(a, "dir=", 4) == 0
                            ? " (dir=TEMPLATE is now parent=DIR: job directories are "
                              "DIR/UID/JOBID)"
                            : "");
            return -1;
        }
    }
    if (!c->dyadd[0]) find_dyadd(c->dyadd, sizeof c->dyadd);
    return 0;
}

/* "30", "2.5", "90s", "10m", "1h" (as `dyad consume --timeout`): seconds. */
static int parse_duration(const char* text, double* seconds) {
    if (!*text) return -1;
    char* end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno != 0 || !(v >= 0) || !isfinite(v)) return -1;
    double scale = 0;
    if (!*end || strcasecmp(end, "s") == 0 || strcasecmp(end, "sec") == 0)
        scale = 1;
    else if (strcasecmp(end, "m") == 0 || strcasecmp(end, "min") == 0)
        scale = 60;
    else if (strcasecmp(end, "h") == 0)
        scale = 3600;
    else
        return -1;
    *seconds = v * scale;
    return isfinite(*seconds) ? 0 : -1;
}

static const char* const kModes[] = {"AUTO", "LOCAL", "FLUX_RPC", "STREAM",
                                     "UCX",  "MARGO", "OFI",      NULL};

static int one_option(const char* tok, const struct dyad_conf* c, struct dyad_user* u, char* err,
                      size_t errlen) {
    if (strncmp(tok, "mode=", 5) == 0) {
        for (int i = 0; kModes[i]; ++i)
            if (strcasecmp(tok + 5, kModes[i]) == 0)
                return copy(u->mode, sizeof u->mode, kModes[i]);
        snprintf(err, errlen,
                 "mode '%s' is not a transport: use AUTO, LOCAL, STREAM (FLUX_RPC), UCX or MARGO "
                 "(OFI)",
                 tok + 5);
        return -1;
    }
    if (strncmp(tok, "wait=", 5) == 0) {
        double s = 0;
        if (parse_duration(tok + 5, &s) != 0) {
            snprintf(err, errlen,
                     "wait '%s' is not a duration: give seconds (30, 2.5) or 90s, 10m, 1h, as "
                     "`dyad consume --timeout` takes",
                     tok + 5);
            return -1;
        }
        snprintf(u->wait, sizeof u->wait, "%.15g", s);
        return 0;
    }
    if (strncmp(tok, "dir=", 4) == 0) {
        const char* t = tok + 4;
        if (!c->user_dir) {
            snprintf(err, errlen,
                     "dir= is not allowed on this cluster (its administrators have not set "
                     "user_dir=yes for dyad_spank.so): leave it out, the job directory is %s/UID/"
                     "JOBID on every node",
                     c->parent);
            return -1;
        }
        if (!clean_path(t) || !strstr(t, "{jobid}") || strlen(t) > 512) {
            snprintf(err, errlen,
                     "dir '%s' must be an absolute path holding {jobid} (e.g. "
                     "/scratch/{uid}/dyad-{jobid}), without '.', '..' or '//' components",
                     t);
            return -1;
        }
        return copy(u->dir_template, sizeof u->dir_template, t);
    }
    snprintf(err, errlen, "'%s' is not mode=TRANSPORT, wait=DURATION or dir=/PATH", tok);
    return -1;
}

int dyad_parse_user(const char* arg, const struct dyad_conf* c, struct dyad_user* u, char* err,
                    size_t errlen) {
    char buf[1024];
    memset(u, 0, sizeof *u);
    err[0] = 0;
    /* --dyad without OPTIONS reaches the job's steps as "(null)" (sbatch
     * exports the option as SLURM_SPANK__SLURM_SPANK_OPTION_dyad_dyad). */
    if (!arg || !*arg || strcmp(arg, "(null)") == 0) return 0;
    if (copy(buf, sizeof buf, arg) != 0) {
        snprintf(err, errlen, "longer than %zu characters", sizeof buf - 1);
        return -1;
    }
    char* save = NULL;
    for (char* tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (one_option(tok, c, u, err, errlen) != 0) {
            if (!err[0]) snprintf(err, errlen, "'%s' is too long", tok);
            return -1;
        }
    return 0;
}

void dyad_job_dir(const struct dyad_conf* c, const struct dyad_user* u, uint32_t jobid, uid_t uid,
                  char* out, size_t n) {
    if (!u->dir_template[0]) {
        snprintf(out, n, "%s/%u/%u", c->parent, (unsigned)uid, jobid);
        return;
    }
    const char* t = u->dir_template;
    size_t o = 0;
    char idbuf[16], uidbuf[16];
    snprintf(idbuf, sizeof idbuf, "%u", jobid);
    snprintf(uidbuf, sizeof uidbuf, "%u", (unsigned)uid);
    while (*t && o + 1 < n) {
        const char* sub = NULL;
        size_t skip = 0;
        if (strncmp(t, "{jobid}", 7) == 0) sub = idbuf, skip = 7;
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
