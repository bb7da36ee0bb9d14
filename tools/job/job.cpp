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

namespace dyad::job {
namespace {

namespace fs = std::filesystem;
using clock = std::chrono::steady_clock;

std::string g_cmd = "dyad job";

int fail(const std::string& msg) {
    std::fprintf(stderr, "%s: %s\n", g_cmd.c_str(), msg.c_str());
    return 1;
}

std::string env_or(const char* name, const std::string& fallback = "") {
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

std::string last_lines(const std::string& path, size_t n = 8) {
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

unsigned job_port(const Options& o, const std::string& id) {
    if (o.port) return o.port;
    unsigned long long h = 0;
    bool numeric = !id.empty();
    for (char c : id) numeric = numeric && c >= '0' && c <= '9';
    if (numeric && id.size() < 18)
        h = std::stoull(id);
    else
        for (char c : id) h = h * 131 + static_cast<unsigned char>(c);
    return 20000 + static_cast<unsigned>(h % 10000);
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

struct Child {
    pid_t pid = -1;
    UniqueFd in;   // our end of its stdin
    UniqueFd out;  // our end of its stdout
};

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
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid == 0) {
        ::setpgid(0, 0);
        ::dup2(in[0], 0);
        ::dup2(out[1], 1);
        if (err >= 0) ::dup2(err, 2);
        ::signal(SIGPIPE, SIG_DFL);
        ::execvp(args[0], args.data());
        std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
        ::_exit(127);
    }
    int e = errno;
    ::close(in[0]);
    ::close(out[1]);
    if (err >= 0) ::close(err);
    if (pid < 0) {
        ::close(in[1]);
        ::close(out[0]);
        return Status(DYAD_RC_SYSFAIL, "fork", e);
    }
    Child c;
    c.pid = pid;
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

// ---- node-up ------------------------------------------------------------

Result<std::string> resolve(const std::string& host) {
    struct addrinfo hints = {};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
    if (rc != 0) {
        hints.ai_family = AF_UNSPEC;
        rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
    }
    if (rc != 0 || !res)
        return Status(DYAD_RC_CONNFAIL,
                      "cannot resolve node name '" + host + "': " + ::gai_strerror(rc),
                      EHOSTUNREACH);
    char buf[INET6_ADDRSTRLEN] = {};
    std::string out;
    if (res->ai_family == AF_INET) {
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf,
                    sizeof buf);
        out = buf;
    } else {
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr, buf,
                    sizeof buf);
        out = std::string("[") + buf + "]";
    }
    ::freeaddrinfo(res);
    return out;
}

bool can_connect(const std::string& addr, unsigned port) {
    std::string host = addr;
    int family = AF_INET;
    if (!host.empty() && host.front() == '[') {
        host = host.substr(1, host.size() - 2);
        family = AF_INET6;
    }
    UniqueFd s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return false;
    if (family == AF_INET) {
        sockaddr_in a = {};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(port));
        ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
        return ::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    }
    sockaddr_in6 a = {};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET6, host.c_str(), &a.sin6_addr);
    return ::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
}

// The job directory: created 0700 (or taken over from a crashed run of the
// same job), owned by us, with no access for anyone else.
Status make_job_dir(const std::string& dir) {
    if (dir.empty() || dir.front() != '/')
        return Status(DYAD_RC_BAD_CLI_PARSE, "--dir '" + dir + "' is not an absolute path", EINVAL);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
        return Status(DYAD_RC_SYSFAIL, "cannot create " + dir, errno);
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0) return Status(DYAD_RC_SYSFAIL, "cannot stat " + dir, errno);
    if (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid())
        return Status(DYAD_RC_SYSFAIL, dir + " exists and is not a directory of this user", EEXIST);
    if ((st.st_mode & 07777) != 0700 && ::chmod(dir.c_str(), 0700) != 0)
        return Status(DYAD_RC_SYSFAIL, "cannot make " + dir + " mode 0700", errno);
    std::string data = dir + "/" + kDataName, state = dir + "/state";
    for (const auto& d : {data, state})
        if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST)
            return Status(DYAD_RC_SYSFAIL, "cannot create " + d, errno);
    return Status::ok();
}

// The key, as 64 (or more) hex digits on standard input; never an argument.
Status write_key_from_stdin(const std::string& path) {
    std::string text;
    char buf[256];
    while (text.size() < 4096) {
        ssize_t n = ::read(0, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        text.append(buf, static_cast<size_t>(n));
        if (text.find('\n') != std::string::npos) break;
    }
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    bool hex = text.size() >= 64;
    for (char c : text) hex = hex && std::isxdigit(static_cast<unsigned char>(c));
    if (!hex)
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "no job key on standard input (64 hex digits expected; `dyad job start` and "
                      "the SPANK plugin write it there)",
                      EINVAL);
    ::unlink(path.c_str());  // a crashed run's
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd.valid()) return Status(DYAD_RC_SYSFAIL, "cannot create " + path, errno);
    text += "\n";
    if (::fchmod(fd.get(), 0600) != 0 ||
        ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
        return Status(DYAD_RC_SYSFAIL, "cannot write " + path, errno);
    return Status::ok();
}

pid_t read_pid(const std::string& dir) {
    std::ifstream in(dir + "/" + kPidName);
    long pid = 0;
    if (!(in >> pid) || pid <= 1) return -1;
    return static_cast<pid_t>(pid);
}

// Process `pid` is this job's dyadd (not a recycled pid): its command line
// names the job directory's socket.
bool is_job_dyadd(pid_t pid, const std::string& dir) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return cmd.find(dir + "/" + kSocketName) != std::string::npos;
}

volatile sig_atomic_t g_child = -1;

int node_up_checked(const Options& o, const std::string& where);

int node_up(const Options& o) {
    g_cmd = "dyad job node-up";
    if (o.node.empty() || o.dir.empty() || o.job_id.empty() || !o.port)
        return fail(
            "--node, --dir, --job-id and --port are required (`dyad job start` gives them)");
    const std::string where = o.node + " (" + o.dir + ")";
    Options opt = o;
    if (opt.first.empty() && !opt.nodes.empty()) {  // the SPANK plugin gives the job's hostlist
        auto all = expand_hostlist(opt.nodes);
        if (!all) return fail(where + ": " + all.status().message());
        auto at = std::find(all->begin(), all->end(), opt.node);
        if (at == all->end()) return fail(where + ": " + opt.node + " is not in " + opt.nodes);
        opt.first = all->front();
        opt.rank = static_cast<unsigned>(at - all->begin());
    }
    return node_up_checked(opt, where);
}

int node_up_checked(const Options& o, const std::string& where) {
    ::umask(077);
    if (pid_t old = read_pid(o.dir); old > 0 && ::kill(old, 0) == 0 && is_job_dyadd(old, o.dir))
        return fail(where + ": a dyadd of this job runs already (pid " + std::to_string(old) + ")");
    if (Status s = make_job_dir(o.dir); !s) return fail(where + ": " + s.message());
    const std::string key = o.dir + "/" + kKeyName, log = o.dir + "/" + kLogName;
    if (Status s = write_key_from_stdin(key); !s) return fail(where + ": " + s.message());
    auto cleanup = [&] {  // a failed start leaves the log only
        ::unlink(key.c_str());
        std::error_code ec;
        fs::remove_all(o.dir + "/" + kDataName, ec);
        fs::remove_all(o.dir + "/state", ec);
        ::unlink((o.dir + "/" + kSocketName).c_str());
    };
    auto addr = resolve(o.node);
    if (!addr) return cleanup(), fail(where + ": " + addr.status().message());
    const Deadline deadline = Deadline::after(o.timeout);

    std::vector<std::string> argv = {
        o.dyadd.empty() ? default_dyadd() : o.dyadd,
        "--node",
        o.node,
        "--rank",
        std::to_string(o.rank),
        "--listen",
        addr.value() + ":" + std::to_string(o.port),
        "--socket",
        o.dir + "/" + kSocketName,
        "--auth-key",
        key,
        "--namespace",
        o.kvs_namespace.empty() ? "dyad-job-" + o.job_id : o.kvs_namespace,
        "--state-dir",
        o.dir + "/state"};
    if (!o.kvs.empty()) {
        argv.insert(argv.end(), {"--kvs", o.kvs});
    } else if (!o.first.empty() && o.first != o.node) {
        // The first node's dyadd hosts the store: wait until it listens.
        auto first = resolve(o.first);
        if (!first) return cleanup(), fail(where + ": " + first.status().message());
        while (!can_connect(first.value(), o.port)) {
            if (deadline.expired())
                return cleanup(), fail(where + ": the store on the first node " + o.first + " (" +
                                       first.value() + ":" + std::to_string(o.port) +
                                       ") did not answer within " + std::to_string(int(o.timeout)) +
                                       " s; see that node's " + log);
            ::usleep(10000);  // a remote port: nothing to block on but a retry
        }
        argv.insert(argv.end(), {"--kvs", "tcp://" + first.value() + ":" + std::to_string(o.port)});
    }
    argv.insert(argv.end(), o.dyadd_args.begin(), o.dyadd_args.end());
    argv.push_back(o.dir + "/" + kDataName);

    UniqueFd logfd(::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (!logfd.valid())
        return cleanup(), fail(where + ": cannot create " + log + ": " + std::strerror(errno));
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return cleanup(), fail(where + ": fork: " + std::strerror(errno));
    if (pid == 0) {
        if (o.detach) ::setsid();
        int devnull = ::open("/dev/null", O_RDONLY);
        ::dup2(devnull, 0);
        ::dup2(logfd.get(), 1);
        ::dup2(logfd.get(), 2);
        // The job's settings are its arguments, not the caller's DYAD_* variables.
        for (const char* v : {"DYAD_AUTH_KEY_FILE", "DYAD_KVS_NAMESPACE", "DYAD_NODE_ID",
                              "DYAD_NODE_RANK", "DYAD_PATH_PRODUCER", "DYAD_SERVICE_URI"})
            ::unsetenv(v);
        ::execv(args[0], args.data());
        std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
        ::_exit(127);
    }
    g_child = pid;
    UniqueFd pfd(pidfd_open(pid));
    // Ready: its TCP port accepts connections (dyadd listens once it has
    // registered in the store); exited: the log says why.
    bool ready = false;
    while (!ready) {
        struct pollfd p = {pfd.get(), POLLIN, 0};
        int r = pfd.valid() ? ::poll(&p, 1, 10) : (::usleep(10000), 0);
        int status = 0;
        if (r > 0 || ::waitpid(pid, &status, WNOHANG) == pid) {
            if (r > 0) ::waitpid(pid, &status, 0);
            std::string how = WIFEXITED(status)
                                  ? "exited with " + std::to_string(WEXITSTATUS(status))
                                  : "was killed by signal " + std::to_string(WTERMSIG(status));
            cleanup();
            return fail(where + ": dyadd " + how + " during its start; last lines of " + log +
                        ":\n" + last_lines(log));
        }
        ready = can_connect(addr.value(), o.port);
        if (!ready && deadline.expired()) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
            cleanup();
            return fail(where + ": dyadd was not ready within " + std::to_string(int(o.timeout)) +
                        " s; last lines of " + log + ":\n" + last_lines(log));
        }
    }
    {
        std::ofstream pf(o.dir + "/" + kPidName);
        pf << pid << "\n";
    }
    std::printf("ready %s %s:%u pid %d\n", o.node.c_str(), addr.value().c_str(), o.port, pid);
    std::fflush(stdout);
    int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::close(devnull);
    if (o.detach) return 0;
    // Stay its parent: the launcher's process (an srun step) lives as long
    // as the service; a signal to us goes on to it.
    struct sigaction sa = {};
    sa.sa_handler = [](int sig) {
        if (g_child > 0) ::kill(static_cast<pid_t>(g_child), sig);
    };
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &sa, nullptr);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// ---- node-down ----------------------------------------------------------

// Files of /dev/shm that dyadd `pid` made (libfabric's shm regions are named
// "PID:..."; a SIGKILLed dyadd could not remove them) and that we own.
void remove_shm_of(pid_t pid) {
    std::error_code ec;
    const std::string p = std::to_string(pid);
    for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
        std::string name = e.path().filename().string();
        bool ours = name.rfind(p + ":", 0) == 0 || name.rfind(p + "_", 0) == 0 ||
                    name.find("_" + p + "_") != std::string::npos ||
                    name.find("-" + p + "-") != std::string::npos;
        struct stat st;
        if (ours && ::lstat(e.path().c_str(), &st) == 0 && st.st_uid == ::getuid())
            ::unlink(e.path().c_str());
    }
}

int node_down(const Options& o) {
    g_cmd = "dyad job node-down";
    if (o.dir.empty() || o.dir.front() != '/') return fail("--dir must be an absolute path");
    struct stat st;
    if (::lstat(o.dir.c_str(), &st) != 0) return 0;  // nothing here (stopped already)
    if (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid())
        return fail(o.dir + " is not a directory of this user: left alone");
    int rc = 0;
    pid_t pid = read_pid(o.dir);
    if (pid > 0 && ::kill(pid, 0) == 0 && is_job_dyadd(pid, o.dir)) {
        ::kill(pid, SIGTERM);
        if (!wait_gone(pid, Deadline::after(o.timeout < 10 ? o.timeout : 10))) {
            ::kill(pid, SIGKILL);
            if (!wait_gone(pid, Deadline::after(5))) {
                rc = fail(o.dir + ": dyadd (pid " + std::to_string(pid) + ") does not end");
            }
        }
    }
    if (pid > 0) remove_shm_of(pid);
    ::unlink((o.dir + "/" + kKeyName).c_str());
    std::error_code ec;
    if (o.keep || o.keep_log) {
        for (const auto& e : fs::directory_iterator(o.dir, ec)) {
            std::string n = e.path().filename().string();
            if (o.keep ? n == kSocketName || n == kPidName : n != kLogName)
                fs::remove_all(e.path(), ec);
        }
    } else {
        fs::remove_all(o.dir, ec);
        if (ec) rc = fail("cannot remove " + o.dir + ": " + ec.message());
    }
    return rc;
}

// ---- start / stop ------------------------------------------------------

struct Job {
    std::vector<std::string> nodes;
    std::string id, dir, kvs_namespace;
    unsigned port = 0;
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
    j.port = job_port(o, j.id);
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

int start(const Options& o) {
    g_cmd = "dyad job start";
    const auto t0 = clock::now();
    auto job = describe(o);
    if (!job) return fail(job.status().message());
    const Job& j = job.value();
    const std::string key = random_key_hex();
    if (key.empty()) return fail(std::string("cannot make a key: ") + std::strerror(errno));
    const std::string self = self_exe();
    auto cmd = [&](size_t i) {
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
                                      "--port",
                                      std::to_string(j.port),
                                      "--namespace",
                                      j.kvs_namespace,
                                      "--timeout",
                                      std::to_string(o.timeout)};
        if (!o.kvs.empty()) a.insert(a.end(), {"--kvs", o.kvs});
        if (!o.dyadd.empty()) a.insert(a.end(), {"--dyadd", o.dyadd});
        for (const auto& x : o.dyadd_args) a.push_back("--dyadd-arg=" + x);
        return a;
    };
    // The key reaches each node on the launcher's standard input: never an
    // argument (visible in ps) nor a variable (inherited by the launcher's
    // other processes), and no shared file system is needed.
    auto out = run_everywhere(o, j, cmd, key + "\n", true, Deadline::after(o.timeout + 5));
    std::vector<std::string> failed;
    for (size_t i = 0; i < out.size(); ++i)
        if (!out[i].ok)
            failed.push_back("node " + j.nodes[i] + ": dyadd not ready (its log: " + j.dir + "/" +
                             kLogName + " on " + j.nodes[i] + ")" + why(out[i]));
    if (!failed.empty()) {
        for (auto& f : failed) std::fprintf(stderr, "%s: %s\n", g_cmd.c_str(), f.c_str());
        for (auto& x : out)
            if (x.child.pid > 0) ::kill(-x.child.pid, SIGTERM);
        std::fprintf(stderr,
                     "%s: stopping the job's other services (their logs stay in %s; `dyad job "
                     "stop` removes them)\n",
                     g_cmd.c_str(), j.dir.c_str());
        stop_all(o, j, true);
        return 4;
    }
    const double took = std::chrono::duration<double>(clock::now() - t0).count();
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
                     job->nodes.size(), job->nodes.size() == 1 ? "" : "s",
                     std::chrono::duration<double>(clock::now() - t0).count());
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
    c->add_option("--port", o.port, "TCP port of every dyadd (default 20000 + job id % 10000)")
        ->check(CLI::Range(1u, 65535u));
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

    c.node_up = c.job->add_subcommand("node-up", "(run by `dyad job start` on each node)");
    c.node_up->group("");
    c.node_up->add_option("--node", o.node)->required();
    c.node_up->add_option("--first", o.first);
    c.node_up->add_option("--nodes", o.nodes);
    c.node_up->add_option("--rank", o.rank);
    c.node_up->add_option("--dir", o.dir)->required();
    c.node_up->add_option("--job-id", o.job_id)->required();
    c.node_up->add_option("--port", o.port)->required();
    c.node_up->add_option("--namespace", o.kvs_namespace);
    c.node_up->add_option("--kvs", o.kvs);
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
    return 1;
}

}  // namespace dyad::job
