// SPDX-License-Identifier: Apache-2.0
// The per-node halves of `dyad job`: node-up starts this node's dyadd (and
// waits until it accepts connections), node-down stops it and removes what
// it left.
#include "job/support.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
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
#include <utility>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/deadline.hpp"
#include "common/fd.hpp"
#include "job/etcd.hpp"
#include "job/hostlist.hpp"

extern char** environ;

namespace dyad::job::detail {
namespace {
namespace fs = std::filesystem;
using clock = std::chrono::steady_clock;
}  // namespace

// ---- node-up ------------------------------------------------------------

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
Status write_key_from_stdin(const std::string& path, std::string* key_hex) {
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
    *key_hex = text;
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
    if (o.node.empty() || o.dir.empty() || o.job_id.empty())
        return fail("--node, --dir and --job-id are required (`dyad job start` gives them)");
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

// The store of this node's dyadd: its --kvs ("": this dyadd hosts it);
// late: the job's own etcd, reached once dyadd is ready (dyadd --store-late).
struct JobStore {
    std::string kvs;
    std::optional<EtcdPlan> etcd;  // the job's own (dyadd --store-late)
};

// dyadd's command line for this node, listening on addr:port.
std::vector<std::string> dyadd_argv(const Options& o, const std::string& addr, unsigned port,
                                    const std::string& key, const JobStore& store) {
    const std::string& kvs = store.kvs;
    std::vector<std::string> argv = {
        o.dyadd.empty() ? default_dyadd() : o.dyadd,
        "--node",
        o.node,
        "--rank",
        std::to_string(o.rank),
        "--listen",
        addr + ":" + std::to_string(port),
        "--socket",
        o.dir + "/" + kSocketName,
        "--auth-key",
        key,
        "--namespace",
        o.kvs_namespace.empty() ? "dyad-job-" + o.job_id : o.kvs_namespace,
        "--state-dir",
        o.dir + "/state"};
    if (!kvs.empty()) argv.insert(argv.end(), {"--kvs", kvs});
    if (store.etcd) argv.push_back("--store-late");
    argv.insert(argv.end(), o.dyadd_args.begin(), o.dyadd_args.end());
    argv.push_back(o.dir + "/" + kDataName);
    return argv;
}

// Starts dyadd (its output to the log, in a session of its own with
// --detach). Its pid.
Result<pid_t> spawn_dyadd(const Options& o, const std::vector<std::string>& argv,
                          const std::string& log, std::vector<std::pair<int, int>> pass) {
    UniqueFd logfd(::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (!logfd.valid())
        return Status(DYAD_RC_SYSFAIL, "cannot create " + log + ": " + std::strerror(errno));
    UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    ExecPlan plan;
    plan.argv = argv;
    plan.in = devnull.get();
    plan.out = logfd.get();
    plan.err = logfd.get();
    plan.group = o.detach ? ExecPlan::Group::session : ExecPlan::Group::inherit;
    plan.pass = std::move(pass);
    // The job's settings are its arguments, not the caller's DYAD_* variables.
    plan.unset = {"DYAD_AUTH_KEY_FILE", "DYAD_KVS_NAMESPACE", "DYAD_NODE_ID",
                  "DYAD_NODE_RANK",     "DYAD_PATH_PRODUCER", "DYAD_SERVICE_URI"};
    return fork_exec(plan);
}

// Stays dyadd's parent (the launcher's process, an srun step, lives as long
// as the service; a signal to us goes on to it). Its exit code.
int stay_parent(pid_t pid) {
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

// Slurm's configuration, checked when the plugin's prolog runs us.
Result<std::optional<SlurmConf>> slurm_conf_of(const Options& o) {
    if (o.slurm_conf.empty()) return std::optional<SlurmConf>();
    auto c = read_slurm_conf(o.slurm_conf);
    if (!c) return c.status();
    if (o.from_prolog && !c->prolog_alloc())
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "slurm.conf (" + o.slurm_conf + ") has no PrologFlags=Alloc: without it " +
                          "the job prolog does not run on every node at allocation and each " +
                          "node would start a DYAD of its own; ask the administrators to set " +
                          "PrologFlags=Alloc (docs/user-guide.md, \"Slurm: for administrators\")",
                      EINVAL);
    return std::optional<SlurmConf>(std::move(c.value()));
}

// How long the prolog waits for dyadd's own start once node-up has bound
// its sockets and it runs: connections made meanwhile wait in the sockets'
// backlog, so the job need not wait. A dyadd that fails later says why in
// its log and its clients say where that is (docs/design.md, "A job's
// start without waiting for dyadd"). `dyad job start` waits until ready.
constexpr double kPrologReadyWait = 0.03;

// dyadd started on this node.
struct Started {
    pid_t pid = -1;
    unsigned port = 0;
    UniqueFd ready;  // its ready pipe (--ready-fd): a byte once it is ready
};

// Waits until dyadd `pid` says it is ready, or has exited (the log says
// why), or `wait` has passed: still starting, fine with `starting_ok` (its
// sockets queue connections), else it is killed.
Status wait_started(pid_t pid, int ready, const Deadline& wait, bool starting_ok,
                    const std::string& log) {
    UniqueFd pfd(pidfd_open(pid));
    auto ended = [&](bool block) -> std::optional<Status> {
        int status = 0;
        if (::waitpid(pid, &status, block ? 0 : WNOHANG) != pid) return std::nullopt;
        std::string how = WIFEXITED(status)
                              ? "exited with " + std::to_string(WEXITSTATUS(status))
                              : "was killed by signal " + std::to_string(WTERMSIG(status));
        return Status(DYAD_RC_SYSFAIL, "dyadd " + how + " during its start; last lines of " + log +
                                           ":\n" + last_lines(log));
    };
    while (true) {
        struct pollfd p[2] = {{ready, POLLIN, 0}, {pfd.get(), POLLIN, 0}};
        int r = ::poll(
            p, pfd.valid() ? 2 : 1,
            pfd.valid() ? wait.poll_ms() : std::min(wait.poll_ms() < 0 ? 10 : wait.poll_ms(), 10));
        if (r < 0 && errno == EINTR) continue;
        if (p[0].revents) {
            char b = 0;
            ssize_t n;
            while ((n = ::read(ready, &b, 1)) < 0 && errno == EINTR) {
            }
            if (n == 1) return Status::ok();
            // Closed without a word: dyadd is ending.
            if (auto e = ended(true)) return *e;
            return Status(DYAD_RC_SYSFAIL, "dyadd closed its ready pipe; see " + log);
        }
        if (auto e = ended(false)) return *e;
        if (r == 0 && wait.expired()) {
            if (starting_ok) return Status::ok();
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
            return Status(
                DYAD_RC_TIMEOUT,
                "dyadd was not ready in time; last lines of " + log + ":\n" + last_lines(log),
                ETIMEDOUT);
        }
    }
}

// Starts dyadd on the first of `ports` no one else holds, its sockets bound
// here and handed over (--listen-fd, --socket-fd), and waits for it up to
// `wait`. `spawned`: called once, right after dyadd is started, with its
// ready pipe (what overlaps its start).
Result<Started> start_on_a_port(const Options& o, const std::string& addr,
                                const std::vector<unsigned>& ports, const std::string& key,
                                const JobStore& kvs, const Deadline& wait, const std::string& log,
                                std::function<void(int)> spawned) {
    auto unix_sock = bind_unix_listening(o.dir + "/" + kSocketName);
    if (!unix_sock) return unix_sock.status();
    std::string skipped;
    for (unsigned port : ports) {
        auto tcp = bind_listening(addr, port);
        if (!tcp && tcp.status().err() == EADDRINUSE) {
            skipped += (skipped.empty() ? "" : ", ") + std::to_string(port);
            continue;
        }
        if (!tcp) return tcp.status();
        int rp[2];
        if (::pipe2(rp, O_CLOEXEC) != 0) return Status(DYAD_RC_SYSFAIL, "pipe", errno);
        Started st;
        st.port = port;
        st.ready.reset(rp[0]);
        UniqueFd ready_wr(rp[1]);
        auto argv = dyadd_argv(o, addr, port, key, kvs);
        argv.insert(argv.end() - 1, {"--listen-fd", "3", "--socket-fd", "4", "--ready-fd", "5"});
        auto pid = spawn_dyadd(o, argv, log,
                               {{tcp->get(), 3}, {unix_sock->get(), 4}, {ready_wr.get(), 5}});
        if (!pid) return pid.status();
        ready_wr.reset();
        st.pid = pid.value();
        g_child = st.pid;
        if (spawned) spawned(st.ready.get());
        if (Status s = wait_started(st.pid, st.ready.get(), wait, o.from_prolog, log); !s) {
            g_child = -1;
            return s;
        }
        if (!skipped.empty())
            std::fprintf(stderr, "%s: %s: port%s %s of %s held by another program: skipped\n",
                         g_cmd.c_str(), o.node.c_str(),
                         skipped.find(',') == std::string::npos ? "" : "s", skipped.c_str(),
                         addr.c_str());
        return st;
    }
    return Status(DYAD_RC_CONNFAIL,
                  "every port of the job on " + addr + " is held by another program (" + skipped +
                      "); see `ss -tlnp` on " + o.node,
                  EADDRINUSE);
}

// The store of this node's dyadd: the job's own etcd (its files written;
// its member starts once dyadd is ready: start_member), the --kvs given, the
// first node's dyadd (found at the job's ports), or "" (this dyadd hosts it).
Result<JobStore> job_store(const Options& o, const std::string& key_hex, const SlurmConf* sc,
                           const std::string& addr, const std::vector<unsigned>& ports,
                           const Deadline& deadline) {
    std::vector<std::string> nodes;
    if (!o.nodes.empty()) {
        auto all = expand_hostlist(o.nodes);
        if (!all) return all.status();
        nodes = all.value();
    }
    auto plan = etcd_plan(o, nodes, key_hex, sc);
    if (!plan) return plan.status();
    JobStore js;
    if (plan->has_value()) {
        if (Status s = write_etcd_files(o, key_hex, addr); !s) return s;
        js.kvs = etcd_kvs_uri(o, **plan);
        js.etcd = std::move(**plan);
        return js;
    }
    if (!o.kvs.empty() || o.first.empty() || o.first == o.node) {
        js.kvs = o.kvs;
        return js;
    }
    auto first = node_address(o.first, sc);
    if (!first) return first.status();
    auto port = find_store(o, first.value(), ports, o.dir + "/" + kKeyName, deadline,
                           o.dir + "/" + kLogName);
    if (!port) return port.status();
    js.kvs = "tcp://" + first.value() + ":" + std::to_string(port.value());
    return js;
}

// This node's etcd member and the helper that turns the job's etcd auth on
// (etcd.hpp). An error when etcd cannot run at all; a member that ended at
// once (a port held) is said, the job goes on with the other two.
Status start_member(const Options& o, const EtcdPlan& p, const std::string& key_hex,
                    const std::string& addr) {
    const bool held = !port_free(addr, p.client_port) || !port_free(addr, p.peer_port);
    auto pid = start_etcd_member(o, p, key_hex);
    if (!pid) return pid.status();
    if (Status a = start_etcd_auth(o, p, key_hex, pid.value(), o.dir + "/" + kLogName); !a)
        return a;
    return check_member(o, pid.value(), Deadline::after(held ? 5 : 0));
}

// Whether etcd can be run here (--etcd, else etcd in PATH): else the
// member is started at once, so that "cannot run etcd" fails the prolog.
bool etcd_found(const Options& o) {
    if (!o.etcd.empty()) return ::access(o.etcd.c_str(), X_OK) == 0;
    const char* path = std::getenv("PATH");
    std::stringstream in(path ? path : "/usr/bin:/bin");
    for (std::string d; std::getline(in, d, ':');)
        if (!d.empty() && ::access((d + "/etcd").c_str(), X_OK) == 0) return true;
    return false;
}

// This node's etcd member, started by a process of its own (comm
// kEtcdStarter) once node-up has succeeded (a byte on `go`; its end closed
// without one: node-up failed, nothing is started) and this node's dyadd is
// ready (its ready pipe speaks or closes): the job's start does not wait
// for the member, nor share the CPU with it (docs/design.md, "A job's start
// without waiting for dyadd"). What goes wrong goes to the job's log (the
// member then ends, the job goes on with the other two). The write end of
// `go`.
Result<UniqueFd> start_member_later(const Options& o, const EtcdPlan& p, const std::string& key_hex,
                                    const std::string& addr, int ready) {
    int go[2];
    if (::pipe2(go, O_CLOEXEC) != 0) return Status(DYAD_RC_SYSFAIL, "pipe", errno);
    UniqueFd go_rd(go[0]), go_wr(go[1]);
    UniqueFd logfd(
        ::open((o.dir + "/" + kLogName).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (!logfd.valid())
        return Status(DYAD_RC_SYSFAIL, "cannot open " + o.dir + "/" + kLogName, errno);
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return Status(DYAD_RC_SYSFAIL, "fork", errno);
    if (pid == 0) {
        ::prctl(PR_SET_NAME, kEtcdStarter);
        ::setsid();
        int devnull = ::open("/dev/null", O_RDONLY);
        ::dup2(devnull, 0);
        ::dup2(logfd.get(), 1);
        ::dup2(logfd.get(), 2);
        // Nothing else of node-up's (dyadd's sockets above all) stays open.
        for (int fd = 3; fd < 1024; ++fd)
            if (fd != go_rd.get() && fd != ready) ::close(fd);
        char b = 0;
        ssize_t n;
        while ((n = ::read(go_rd.get(), &b, 1)) < 0 && errno == EINTR) {
        }
        if (n != 1) ::_exit(0);
        struct pollfd r = {ready, POLLIN, 0};
        while (::poll(&r, 1, static_cast<int>(o.timeout * 1000)) < 0 && errno == EINTR) {
        }
        Status s = start_member(o, p, key_hex, addr);
        if (!s)
            std::fprintf(stderr, "%s: %s: %s\n", g_cmd.c_str(), o.node.c_str(),
                         s.message().c_str());
        std::fflush(nullptr);
        ::_exit(s ? 0 : 1);
    }
    std::ofstream(o.dir + "/" + kEtcdStarterPid) << pid << "\n";
    return go_wr;
}

int node_up_checked(const Options& o, const std::string& where) {
    ::umask(077);
    if (pid_t old = read_pid(o.dir); old > 0 && ::kill(old, 0) == 0 && is_job_dyadd(old, o.dir)) {
        std::printf("running %s pid %d\n", o.node.c_str(), old);
        std::fflush(stdout);
        fail(where + ": a dyadd of this job runs already (pid " + std::to_string(old) + ")");
        return kAlreadyRunning;
    }
    if (Status s = make_job_dir(o.dir); !s) return fail(where + ": " + s.message());
    const std::string key = o.dir + "/" + kKeyName, log = o.dir + "/" + kLogName;
    std::string key_hex;
    if (Status s = write_key_from_stdin(key, &key_hex); !s) return fail(where + ": " + s.message());
    auto failed = [&](const Status& s) {  // a failed start leaves the log only
        ::unlink(key.c_str());
        std::error_code ec;
        fs::remove_all(o.dir + "/" + kDataName, ec);
        fs::remove_all(o.dir + "/state", ec);
        ::unlink((o.dir + "/" + kSocketName).c_str());
        stop_etcd(o.dir, 0);
        for (const char* f :
             {kEtcdData, kEtcdTls, kEtcdPassword, kEtcdPid, kEtcdAuthPid, kEtcdStarterPid})
            fs::remove_all(o.dir + "/" + f, ec);
        return fail(where + ": " + s.message());
    };
    auto conf = slurm_conf_of(o);
    if (!conf) return failed(conf.status());
    const SlurmConf* sc = conf->has_value() ? &conf->value() : nullptr;
    auto addr = node_address(o.node, sc);
    if (!addr) return failed(addr.status());
    auto ports = candidate_ports(o, key_hex);
    if (!ports) return failed(ports.status());
    const Deadline deadline = Deadline::after(o.timeout);
    auto kvs = job_store(o, key_hex, sc, addr.value(), ports.value(), deadline);
    if (!kvs) return failed(kvs.status());
    // This node's etcd member starts once the prolog is over and dyadd is
    // ready (dyadd does not wait for it: --store-late), unless a port of
    // it is held or etcd is not found: then at once, so that the prolog
    // says so.
    Status member = Status::ok();
    UniqueFd go;
    const bool member_here = kvs->etcd && kvs->etcd->me >= 0;
    const bool member_now =
        member_here && (!port_free(addr.value(), kvs->etcd->client_port) ||
                        !port_free(addr.value(), kvs->etcd->peer_port) || !etcd_found(o));
    const Deadline wait =
        o.from_prolog ? deadline.min(Deadline::after(kPrologReadyWait)) : deadline;
    auto up = start_on_a_port(
        o, addr.value(), ports.value(), key, kvs.value(), wait, log, [&](int ready) {
            if (member_now) {
                member = start_member(o, *kvs->etcd, key_hex, addr.value());
            } else if (member_here) {
                auto g = start_member_later(o, *kvs->etcd, key_hex, addr.value(), ready);
                if (g)
                    go = std::move(g.value());
                else
                    member = g.status();
            }
        });
    if (up && !member) ::kill(up->pid, SIGKILL);
    if (!member) return failed(member);
    if (!up) return failed(up.status());
    const pid_t pid = up->pid;
    {
        std::ofstream pf(o.dir + "/" + kPidName);
        pf << pid << "\n";
    }
    std::printf("ready %s %s:%u pid %d\n", o.node.c_str(), addr.value().c_str(), up->port, pid);
    std::fflush(stdout);
    if (go.valid()) {  // (the member's turn)
        const char g = 'g';
        (void)!::write(go.get(), &g, 1);
        go.reset();
    }
    int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::close(devnull);
    return o.detach ? 0 : stay_parent(pid);
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
                fail(o.dir + ": dyadd (pid " + std::to_string(pid) + ") does not end");
                rc = kDoesNotEnd;
            }
        }
    }
    if (pid > 0) remove_shm_of(pid);
    // Its data goes with the job directory: nothing to stop cleanly for (a
    // leader's SIGTERM waits to hand over to members that stop too).
    if (!stop_etcd(o.dir, 0)) {
        fail(o.dir + ": the job's etcd member does not end");
        rc = kDoesNotEnd;
    }
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

}  // namespace dyad::job::detail
