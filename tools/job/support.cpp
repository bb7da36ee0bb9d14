// SPDX-License-Identifier: Apache-2.0
// What every part of `dyad job` shares: messages, the job's names (nodes,
// id, directory, port, namespace), launchers and child processes.
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
#include "job/hostlist.hpp"

extern char** environ;

extern char** environ;

namespace dyad::job::detail {

namespace fs = std::filesystem;

std::string g_cmd = "dyad job";

int fail(const std::string& msg) {
    std::fprintf(stderr, "%s: %s\n", g_cmd.c_str(), msg.c_str());
    return 1;
}

std::string env_or(const char* name, const std::string& fallback) {
    const char* v = std::getenv(name);  // the job's context: not DYAD_* settings
    return v && *v ? v : fallback;
}

std::string self_exe() {
    std::error_code ec;
    fs::path p = fs::read_symlink("/proc/self/exe", ec);
    return ec ? "dyad" : p.string();
}

std::string default_dyadd() {
    return (fs::path(self_exe()).parent_path() / "dyadd").string();
}

std::string last_lines(const std::string& path, size_t n) {
    std::ifstream in(path);
    std::deque<std::string> lines;
    std::string l;
    while (std::getline(in, l)) {
        lines.push_back(l);
        if (lines.size() > n) lines.pop_front();
    }
    std::string out;
    for (auto& x : lines) out += "  " + x + "\n";
    return out;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
        s.replace(at, from.size(), to);
}

std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

// ---- the job: nodes, id, directory, port --------------------------------

Result<std::vector<std::string>> job_nodes(const Options& o) {
    if (!o.hostfile.empty()) return read_hostfile(o.hostfile);
    std::string list = !o.nodes.empty() ? o.nodes : env_or("SLURM_JOB_NODELIST");
    if (list.empty())
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "no nodes: run inside a Slurm allocation (SLURM_JOB_NODELIST), or give "
                      "--nodes HOSTLIST or --hostfile FILE",
                      EINVAL);
    return expand_hostlist(list);
}

std::string job_id(const Options& o) {
    if (!o.job_id.empty()) return o.job_id;
    for (const char* v : {"SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "COBALT_JOBID"})
        if (std::string id = env_or(v); !id.empty()) return id;
    return "";
}

bool safe_id(const std::string& id) {
    if (id.empty() || id.size() > 64) return false;
    for (char c : id)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_')
            return false;
    return id != "." && id != "..";
}

// ${TMPDIR:-/tmp}/dyad-{jobid}, expanded here (on the node that starts the
// job: the path must be the same on every node).
std::string job_dir(const Options& o, const std::string& id) {
    std::string t = o.dir_template.empty() ? "${TMPDIR:-/tmp}/dyad-{jobid}" : o.dir_template;
    replace_all(t, "${TMPDIR:-/tmp}", env_or("TMPDIR", "/tmp"));
    replace_all(t, "{jobid}", id);
    replace_all(t, "{uid}", std::to_string(::getuid()));
    return fs::path(t).lexically_normal().string();
}

std::string job_namespace(const Options& o, const std::string& id) {
    return o.kvs_namespace.empty() ? "dyad-job-" + id : o.kvs_namespace;
}

// ---- processes ----------------------------------------------------------

// Words of a launcher template, {host} replaced; single and double quotes
// group words (no other shell syntax).
Result<std::vector<std::string>> launcher_words(const std::string& tmpl, const std::string& host) {
    std::vector<std::string> words;
    std::string cur;
    bool in_word = false;
    char quote = 0;
    for (char c : tmpl) {
        if (quote) {
            if (c == quote)
                quote = 0;
            else
                cur += c;
        } else if (c == '\'' || c == '"') {
            quote = c;
            in_word = true;
        } else if (c == ' ' || c == '\t' || c == '\n') {
            if (in_word) words.push_back(cur);
            cur.clear();
            in_word = false;
        } else {
            cur += c;
            in_word = true;
        }
    }
    if (quote)
        return Status(DYAD_RC_BAD_CLI_PARSE, "--launcher '" + tmpl + "': unclosed quote", EINVAL);
    if (in_word) words.push_back(cur);
    bool has_host = false;
    for (auto& w : words) {
        if (w.find("{host}") != std::string::npos) has_host = true;
        replace_all(w, "{host}", host);
    }
    if (words.empty() || !has_host)
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "--launcher '" + tmpl + "' must name the node as {host}", EINVAL);
    return words;
}

Result<std::vector<std::string>> launcher_for(const Options& o, const std::string& host) {
    if (!o.launcher.empty()) return launcher_words(o.launcher, host);
    if (env_or("SLURM_JOB_ID").empty())
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "outside Slurm, say how to run a command on a node: --launcher "
                      "'ssh -o BatchMode=yes {host}' (or any command line with {host})",
                      EINVAL);
    return std::vector<std::string>{"srun",
                                    "--overlap",
                                    "-N1",
                                    "-n1",
                                    "-w",
                                    host,
                                    "--quiet",
                                    "--job-name=dyad",
                                    "--kill-on-bad-exit=0"};
}

Result<pid_t> fork_exec(const ExecPlan& plan) {
    if (plan.argv.empty()) return Status(DYAD_RC_SYSFAIL, "nothing to run", EINVAL);
    std::vector<char*> args;
    for (const auto& a : plan.argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return Status(DYAD_RC_SYSFAIL, "fork", errno);
    if (pid > 0) return pid;
    if (plan.group == ExecPlan::Group::process_group) ::setpgid(0, 0);
    if (plan.group == ExecPlan::Group::session) ::setsid();
    if (plan.in >= 0) ::dup2(plan.in, 0);
    if (plan.out >= 0) ::dup2(plan.out, 1);
    if (plan.err >= 0) ::dup2(plan.err, 2);
    if (plan.default_sigpipe) ::signal(SIGPIPE, SIG_DFL);
    // Each above every target first (a source may be another's target),
    // then into place (dup2 clears close-on-exec).
    std::vector<int> high;
    for (const auto& [fd, as] : plan.pass) high.push_back(::fcntl(fd, F_DUPFD_CLOEXEC, 64));
    for (size_t i = 0; i < plan.pass.size(); ++i)
        if (high[i] < 0 || ::dup2(high[i], plan.pass[i].second) < 0) ::_exit(126);
    for (const char* v : plan.unset) ::unsetenv(v);
    if (plan.search_path)
        ::execvp(args[0], args.data());
    else
        ::execv(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
}

// Starts argv in a process group of its own, stdin and stdout pipes to us,
// stderr to `err_path` (or inherited when empty).
Result<Child> spawn(const std::vector<std::string>& argv, const std::string& err_path) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return Status(DYAD_RC_SYSFAIL, "pipe", errno);
    if (::pipe2(out, O_CLOEXEC) != 0) {
        ::close(in[0]);
        ::close(in[1]);
        return Status(DYAD_RC_SYSFAIL, "pipe", errno);
    }
    int err = -1;
    if (!err_path.empty()) {
        err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (err < 0) {
            for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
            return Status(DYAD_RC_SYSFAIL, "cannot create " + err_path, errno);
        }
    }
    ExecPlan plan;
    plan.argv = argv;
    plan.in = in[0];
    plan.out = out[1];
    plan.err = err;
    plan.group = ExecPlan::Group::process_group;
    plan.search_path = true;
    plan.default_sigpipe = true;
    auto pid = fork_exec(plan);
    ::close(in[0]);
    ::close(out[1]);
    if (err >= 0) ::close(err);
    if (!pid) {
        ::close(in[1]);
        ::close(out[0]);
        return pid.status();
    }
    Child c;
    c.pid = pid.value();
    c.in.reset(in[1]);
    c.out.reset(out[0]);
    return c;
}

int pidfd_open(pid_t pid) {
    return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

// Waits until process `pid` (any process of ours to signal) has ended, at
// most until `d`. True when it has.
bool wait_gone(pid_t pid, const Deadline& d) {
    UniqueFd pfd(pidfd_open(pid));
    if (!pfd.valid()) return errno == ESRCH;
    struct pollfd p = {pfd.get(), POLLIN, 0};
    while (true) {
        int r = ::poll(&p, 1, d.poll_ms());
        if (r > 0) return true;
        if (r == 0) return false;
        if (errno != EINTR) return false;
    }
}

}  // namespace dyad::job::detail
