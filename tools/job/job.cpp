// SPDX-License-Identifier: Apache-2.0
// dyad job start|stop|node-up|node-down.
//
// start runs, through a launcher, `dyad job node-up` on every node of the
// job (all at once), writes the job's key into each one's standard input,
// and reads from each one's standard output the line "ready ..." that
// node-up prints once its dyadd accepts connections (it has registered in
// the store by then). node-up stays the parent of its dyadd (the launcher's
// process, e.g. an srun step, lives as long as the service) unless
// --detach. stop runs `dyad job node-down` on every node the same way.
#include "job/job.hpp"
#include "job/support.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/deadline.hpp"
#include "common/fd.hpp"
#include "common/seconds.hpp"
#include "job/hostlist.hpp"

extern char** environ;

namespace dyad::job {
using namespace detail;
namespace {

namespace fs = std::filesystem;
using clock = std::chrono::steady_clock;

// ---- start / stop ------------------------------------------------------

struct Job {
    std::vector<std::string> nodes;
    std::string id, dir, kvs_namespace;
    std::string launch_logs;  // this host: the launchers' stderr, one file per node
};

Result<Job> describe(const Options& o) {
    Job j;
    auto nodes = job_nodes(o);
    if (!nodes) return nodes.status();
    j.nodes = std::move(nodes.value());
    j.id = job_id(o);
    if (j.id.empty())
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "no job id: give --job-id ID outside a resource manager's job", EINVAL);
    if (!safe_id(j.id))
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "job id '" + j.id + "' may hold letters, digits, '.', '-' and '_' only",
                      EINVAL);
    j.dir = job_dir(o, j.id);
    if (j.dir.empty() || j.dir.front() != '/')
        return Status(DYAD_RC_BAD_CLI_PARSE, "--dir must give an absolute path", EINVAL);
    j.kvs_namespace = job_namespace(o, j.id);
    j.launch_logs =
        env_or("TMPDIR", "/tmp") + "/dyad-" + j.id + "-" + std::to_string(::getuid()) + ".launch";
    return j;
}

std::string env_text(const Job& j) {
    std::string t;
    auto line = [&](const char* k, const std::string& v) {
        t += std::string("export ") + k + "=" + shell_quote(v) + "\n";
    };
    line("DYAD_SERVICE_URI", "unix:" + j.dir + "/" + kSocketName);
    line("DYAD_PATH_PRODUCER", j.dir + "/" + kDataName);
    line("DYAD_PATH_CONSUMER", j.dir + "/" + kDataName);
    line("DYAD_AUTH_KEY_FILE", j.dir + "/" + kKeyName);
    line("DYAD_KVS_NAMESPACE", j.kvs_namespace);
    return t;
}

std::string random_key_hex() {
    unsigned char raw[32];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return "";
        got += static_cast<size_t>(n);
    }
    static const char* d = "0123456789abcdef";
    std::string hex;
    for (unsigned char c : raw) {
        hex += d[c >> 4];
        hex += d[c & 15];
    }
    ::explicit_bzero(raw, sizeof raw);
    return hex;
}

// Runs `per_node(rank, node)`'s command on every node through the launcher,
// all at once; `stdin_text` goes to each one's standard input. Returns, per
// node, the first line it printed ("" if none) and whether it ended well.
struct Outcome {
    std::string line;
    bool ok = false;
    bool ended = false;
    std::string err_path;
    Child child;
    std::string buf;
};

int stop_all(const Options& o, const Job& j, bool keep_log);

std::vector<Outcome> run_everywhere(const Options& o, const Job& j,
                                    const std::function<std::vector<std::string>(size_t)>& cmd,
                                    const std::string& stdin_text, bool until_line,
                                    const Deadline& deadline) {
    std::vector<Outcome> out(j.nodes.size());
    std::error_code ec;
    fs::create_directories(j.launch_logs, ec);
    ::chmod(j.launch_logs.c_str(), 0700);
    for (size_t i = 0; i < j.nodes.size(); ++i) {
        auto l = launcher_for(o, j.nodes[i]);
        if (!l) {
            out[i].line = l.status().message();
            out[i].ended = true;
            continue;
        }
        auto argv = l.value();
        auto rest = cmd(i);
        argv.insert(argv.end(), rest.begin(), rest.end());
        out[i].err_path = j.launch_logs + "/" + j.nodes[i] + ".err";
        auto c = spawn(argv, out[i].err_path);
        if (!c) {
            out[i].line = c.status().message();
            out[i].ended = true;
            continue;
        }
        out[i].child = std::move(c.value());
        if (!stdin_text.empty())
            (void)!::write(out[i].child.in.get(), stdin_text.data(), stdin_text.size());
        out[i].child.in.reset();
    }
    // Read each one's stdout until its first line (until_line) or its end.
    while (true) {
        std::vector<struct pollfd> fds;
        std::vector<size_t> who;
        for (size_t i = 0; i < out.size(); ++i)
            if (!out[i].ended && out[i].child.out.valid()) {
                fds.push_back({out[i].child.out.get(), POLLIN, 0});
                who.push_back(i);
            }
        if (fds.empty()) break;
        int r = ::poll(fds.data(), fds.size(), deadline.poll_ms());
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;  // the deadline
        for (size_t k = 0; k < fds.size(); ++k) {
            if (!fds[k].revents) continue;
            Outcome& x = out[who[k]];
            char b[512];
            ssize_t n = ::read(x.child.out.get(), b, sizeof b);
            if (n > 0) {
                x.buf.append(b, static_cast<size_t>(n));
                size_t nl = x.buf.find('\n');
                if (until_line && nl != std::string::npos) {
                    x.line = x.buf.substr(0, nl);
                    x.ok = x.line.rfind("ready ", 0) == 0;
                    x.ended = true;
                    x.child.out.reset();
                }
            } else {  // EOF: it ended (or closed its output)
                x.child.out.reset();
                int status = 0;
                if (::waitpid(x.child.pid, &status, 0) == x.child.pid) x.child.pid = -1;
                x.ended = true;
                x.ok = !until_line && WIFEXITED(status) && WEXITSTATUS(status) == 0;
                if (x.line.empty()) x.line = x.buf.substr(0, x.buf.find('\n'));
            }
        }
    }
    return out;
}

std::string why(const Outcome& x) {
    std::string err = last_lines(x.err_path);
    if (!err.empty()) return "\n" + err;
    if (!x.ended) return ": no answer in time";
    return x.line.empty() ? ": it ended without a word" : ": " + x.line;
}

// The command that starts node i of the job (`dyad job node-up`).
std::vector<std::string> node_up_command(const Options& o, const Job& j, const std::string& self,
                                         size_t i) {
    std::vector<std::string> a = {self,
                                  "job",
                                  "node-up",
                                  "--node",
                                  j.nodes[i],
                                  "--first",
                                  j.nodes[0],
                                  "--rank",
                                  std::to_string(i),
                                  "--dir",
                                  j.dir,
                                  "--job-id",
                                  j.id,
                                  "--namespace",
                                  j.kvs_namespace,
                                  "--timeout",
                                  std::to_string(o.timeout)};
    if (!o.kvs.empty()) a.insert(a.end(), {"--kvs", o.kvs});
    if (!o.store.empty()) a.insert(a.end(), {"--store", o.store});
    if (!o.etcd.empty()) a.insert(a.end(), {"--etcd", o.etcd});
    std::string all;
    for (const auto& n : j.nodes) all += (all.empty() ? "" : ",") + n;
    a.insert(a.end(), {"--nodes", all});
    if (o.port) a.insert(a.end(), {"--port", std::to_string(o.port)});
    if (!o.ports.empty()) a.insert(a.end(), {"--ports", o.ports});
    if (!o.dyadd.empty()) a.insert(a.end(), {"--dyadd", o.dyadd});
    for (const auto& x : o.dyadd_args) a.push_back("--dyadd-arg=" + x);
    return a;
}

// A start that failed on some node, or found the job running already:
// says so, removes what this start made, and gives the exit code.
int refuse_start(const Options& o, const Job& j, std::vector<Outcome>& out,
                 const std::vector<std::string>& failed, const std::vector<std::string>& running) {
    for (auto& f : failed) std::fprintf(stderr, "%s: %s\n", g_cmd.c_str(), f.c_str());
    for (auto& x : out)
        if (x.child.pid > 0 && x.line.rfind("running ", 0) != 0) ::kill(-x.child.pid, SIGTERM);
    if (!running.empty()) {
        std::string list;
        for (auto& r : running) list += (list.empty() ? "" : ", ") + r;
        std::fprintf(stderr,
                     "%s: job %s runs already on %s: refused, and that job is left as it "
                     "is. Stop it first (`dyad job stop` with the same --job-id and nodes), "
                     "or give another --job-id\n",
                     g_cmd.c_str(), j.id.c_str(), list.c_str());
    }
    // Clean only the nodes where this start made something.
    Job mine = j;
    mine.nodes.clear();
    for (size_t i = 0; i < out.size(); ++i)
        if (out[i].line.rfind("running ", 0) != 0) mine.nodes.push_back(j.nodes[i]);
    if (!mine.nodes.empty()) {
        std::fprintf(stderr, "%s: removing what this start made on %zu node%s\n", g_cmd.c_str(),
                     mine.nodes.size(), mine.nodes.size() == 1 ? "" : "s");
        stop_all(o, mine, false);
    }
    std::error_code ec;
    if (running.empty()) fs::remove_all(j.launch_logs, ec);  // else the running job's
    return running.empty() ? 4 : kAlreadyRunning;
}

int start(const Options& o) {
    g_cmd = "dyad job start";
    const auto t0 = clock::now();
    auto job = describe(o);
    if (!job) return fail(job.status().message());
    const Job& j = job.value();
    const std::string key = random_key_hex();
    if (key.empty()) return fail(std::string("cannot make a key: ") + std::strerror(errno));
    const std::string self = self_exe();
    auto cmd = [&](size_t i) { return node_up_command(o, j, self, i); };
    // The key reaches each node on the launcher's standard input: never an
    // argument (visible in ps) nor a variable (inherited by the launcher's
    // other processes), and no shared file system is needed.
    auto out = run_everywhere(o, j, cmd, key + "\n", true, Deadline::after(o.timeout + 5));
    std::vector<std::string> failed, running;
    for (size_t i = 0; i < out.size(); ++i) {
        if (out[i].line.rfind("running ", 0) == 0)
            running.push_back(j.nodes[i] + " (" + out[i].line.substr(8) + ")");
        else if (!out[i].ok)
            failed.push_back("node " + j.nodes[i] + ": dyadd not ready" + why(out[i]));
    }
    if (!running.empty() || !failed.empty()) return refuse_start(o, j, out, failed, running);
    const double took = seconds_since(t0);
    std::string env = env_text(j);
    if (!o.env_file.empty()) {
        std::ofstream f(o.env_file, std::ios::trunc);
        f << env;
        if (!f.flush()) return fail("cannot write " + o.env_file);
    }
    if (!o.quiet) std::fputs(env.c_str(), stdout);
    std::fprintf(stderr, "%s: %zu dyadd ready in %.3f s (job %s, %s on every node)\n",
                 g_cmd.c_str(), j.nodes.size(), took, j.id.c_str(), j.dir.c_str());
    // The launchers (and, through them, the dyadds) outlive us; `dyad job
    // stop` ends them.
    return 0;
}

int stop_all(const Options& o, const Job& j, bool keep_log) {
    const std::string self = self_exe();
    auto cmd = [&](size_t) {
        std::vector<std::string> a = {self, "job", "node-down", "--dir", j.dir};
        if (o.keep) a.push_back("--keep");
        if (keep_log) a.push_back("--keep-log");
        return a;
    };
    auto out = run_everywhere(o, j, cmd, "", false, Deadline::after(o.timeout + 5));
    int rc = 0;
    for (size_t i = 0; i < out.size(); ++i)
        if (!out[i].ok) {
            std::fprintf(stderr, "%s: node %s: %s%s\n", g_cmd.c_str(), j.nodes[i].c_str(),
                         "could not stop and clean", why(out[i]).c_str());
            rc = 4;
        }
    return rc;
}

int stop(const Options& o) {
    g_cmd = "dyad job stop";
    const auto t0 = clock::now();
    auto job = describe(o);
    if (!job) return fail(job.status().message());
    int rc = stop_all(o, job.value(), false);
    if (rc == 0) {
        std::error_code ec;
        fs::remove_all(job->launch_logs, ec);
        std::fprintf(stderr, "%s: %zu node%s stopped and cleaned in %.3f s\n", g_cmd.c_str(),
                     job->nodes.size(), job->nodes.size() == 1 ? "" : "s", seconds_since(t0));
    }
    return rc;
}

void add_job_options(CLI::App* c, Options& o) {
    auto* n = c->add_option("--nodes", o.nodes,
                            "the job's nodes as a Slurm hostlist, e.g. node[1-3,7] (default "
                            "$SLURM_JOB_NODELIST)");
    c->add_option("--hostfile", o.hostfile,
                  "a file naming the nodes, one per line (PBS_NODEFILE, mpirun --hostfile)")
        ->excludes(n);
    c->add_option("--launcher", o.launcher,
                  "how to run a command on a node, {host} standing for its name, e.g. 'ssh -o "
                  "BatchMode=yes {host}' (default inside Slurm: srun --overlap -N1 -n1 -w {host})");
    c->add_option("--job-id", o.job_id,
                  "the job's id (default $SLURM_JOB_ID, $PBS_JOBID, $LSB_JOBID, $FLUX_JOB_ID)");
    c->add_option("--dir", o.dir_template,
                  "node-local job directory, the same path on every node ({jobid}, {uid}; "
                  "default ${TMPDIR:-/tmp}/dyad-{jobid})");
    c->add_option("--port", o.port,
                  "TCP port of every dyadd (default: the first free of 8 ports derived from the "
                  "job key, in --ports)")
        ->check(CLI::Range(1u, 65535u));
    c->add_option("--ports", o.ports, "LOW-HIGH: where the job's ports lie (default 20000-29999)");
    c->add_option("--timeout", o.timeout, "seconds every node may take (default 60)")
        ->check(CLI::PositiveNumber);
}

}  // namespace

Commands add_commands(CLI::App& app, Options& o) {
    Commands c;
    c.job =
        app.add_subcommand("job", "start or stop the DYAD services of a job (one dyadd per node)");
    c.job->require_subcommand(1);
    c.start = c.job->add_subcommand(
        "start",
        "start one dyadd per node of the job, as this user, with a fresh key; print the "
        "environment of the job's tasks once every one is ready (alias: dyad start)");
    add_job_options(c.start, o);
    c.start->add_option("--kvs", o.kvs,
                        "metadata store: etcd://HOST:PORT[,...] (default: embedded in the first "
                        "node's dyadd)");
    c.start->add_option("--store", o.store,
                        "the job's own metadata store: auto (default: an etcd of the job on its "
                        "first three nodes with 3 nodes or more, else embedded in the first "
                        "node's dyadd), etcd, embedded");
    c.start->add_option("--etcd", o.etcd, "the etcd program on the nodes (default: etcd in PATH)");
    c.start->add_option("--namespace", o.kvs_namespace,
                        "metadata namespace (default dyad-job-{jobid})");
    c.start->add_option("--dyadd", o.dyadd,
                        "the dyadd program on the nodes (default: beside dyad)");
    c.start->add_option(
        "--dyadd-arg", o.dyadd_args,
        "one more argument for every dyadd (repeat it), e.g. --dyadd-arg=--transports=STREAM");
    c.start->add_option("--env-file", o.env_file,
                        "also write the environment to FILE (for `source`)");
    c.start->add_flag("--quiet", o.quiet, "do not print the environment");
    c.stop = c.job->add_subcommand(
        "stop",
        "stop every dyadd of the job and remove its key, its directories and its /dev/shm files "
        "(idempotent; alias: dyad stop)");
    add_job_options(c.stop, o);
    c.stop->add_flag("--keep", o.keep, "keep the directories (the key goes regardless)");

    c.env = c.job->add_subcommand(
        "env",
        "print the DYAD environment of this --dyad job (the SPANK plugin's) as export lines, for "
        "a shell on one of its nodes: eval \"$(dyad job env)\"");
    c.env->add_option("--job-id", o.job_id, "the job's id (default $SLURM_JOB_ID)");
    c.env->add_option("--parent", o.parent,
                      "the plugin's directory on the node (its parent=; default /tmp/dyad)");
    c.node_up = c.job->add_subcommand("node-up", "(run by `dyad job start` on each node)");
    c.node_up->group("");
    c.node_up->add_option("--node", o.node)->required();
    c.node_up->add_option("--first", o.first);
    c.node_up->add_option("--nodes", o.nodes);
    c.node_up->add_option("--rank", o.rank);
    c.node_up->add_option("--dir", o.dir)->required();
    c.node_up->add_option("--job-id", o.job_id)->required();
    c.node_up->add_option("--port", o.port);
    c.node_up->add_option("--ports", o.ports);
    c.node_up->add_option("--slurm-conf", o.slurm_conf);
    c.node_up->add_flag("--from-prolog", o.from_prolog);
    c.node_up->add_option("--namespace", o.kvs_namespace);
    c.node_up->add_option("--kvs", o.kvs);
    c.node_up->add_option("--store", o.store);
    c.node_up->add_option("--etcd", o.etcd);
    c.node_up->add_option("--dyadd", o.dyadd);
    c.node_up->add_option("--dyadd-arg", o.dyadd_args);
    c.node_up->add_option("--timeout", o.timeout);
    c.node_up->add_flag("--detach", o.detach);
    c.node_down = c.job->add_subcommand("node-down", "(run by `dyad job stop` on each node)");
    c.node_down->group("");
    c.node_down->add_option("--dir", o.dir)->required();
    c.node_down->add_flag("--keep", o.keep);
    c.node_down->add_flag("--keep-log", o.keep_log);
    c.node_down->add_option("--timeout", o.timeout);
    return c;
}

int run(const Commands& c, Options& o) {
    if (*c.start) return start(o);
    if (*c.stop) return stop(o);
    if (*c.node_up) return node_up(o);
    if (*c.node_down) return node_down(o);
    if (*c.env) return job_env(o);
    return 1;
}

}  // namespace dyad::job
