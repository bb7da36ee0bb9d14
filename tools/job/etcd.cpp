// SPDX-License-Identifier: Apache-2.0
// The job's own etcd (etcd.hpp): which nodes run a member, on which ports,
// starting and stopping a member, and waiting until the cluster serves with
// its auth on.
#include "job/etcd.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <thread>

#include "common/auth.hpp"
#include "common/fd.hpp"
#include "common/seconds.hpp"
#include "job/support.hpp"

extern char** environ;

namespace dyad::job::detail {
namespace fs = std::filesystem;

namespace {

std::string tls(const Options& o, const char* f) {
    return o.dir + "/" + kEtcdTls + "/" + f;
}

// The first port derived under `label` that none of `taken` is.
unsigned pick_port(const Options& o, const std::string& key_hex, const char* label,
                   const std::vector<unsigned>& taken) {
    for (unsigned p : derived_ports(o, key_hex, label))
        if (std::find(taken.begin(), taken.end(), p) == taken.end()) return p;
    return 0;
}

Status write_file(const std::string& path, const std::string& text) {
    ::unlink(path.c_str());
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd.valid() ||
        ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
        return Status(DYAD_RC_SYSFAIL, "cannot write " + path, errno);
    return Status::ok();
}

std::string url(const std::string& addr, unsigned port) {
    return "https://" + addr + ":" + std::to_string(port);
}

}  // namespace

kvs::etcd::Security etcd_security(const Options& o) {
    kvs::etcd::Security s;
    s.ca_file = tls(o, "ca.crt");
    s.cert_file = tls(o, "node.crt");
    s.key_file = tls(o, "node.key");
    s.server_name = kEtcdServerName;
    s.user = kEtcdUser;
    s.password_file = o.dir + "/" + kEtcdPassword;
    s.owner = o.from_prolog ? "slurm" : "job";
    return s;
}

std::vector<std::string> etcd_endpoints(const EtcdPlan& p) {
    std::vector<std::string> eps;
    for (const auto& a : p.addrs) eps.push_back(a + ":" + std::to_string(p.client_port));
    return eps;
}

Result<std::optional<EtcdPlan>> etcd_plan(const Options& o, const std::vector<std::string>& nodes,
                                          const std::string& key_hex, const SlurmConf* sc) {
    const std::string store = o.store.empty() ? "auto" : o.store;
    if (store != "auto" && store != "etcd" && store != "embedded")
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "--store '" + store + "' is not auto, etcd or embedded", EINVAL);
    if (!o.kvs.empty() || store == "embedded") return std::optional<EtcdPlan>();
    if (nodes.size() < kEtcdMembers) {
        if (store == "etcd")
            return Status(DYAD_RC_BAD_CLI_PARSE,
                          "--store etcd needs 3 nodes or more (the job has " +
                              std::to_string(nodes.size()) + ")",
                          EINVAL);
        return std::optional<EtcdPlan>();
    }
    EtcdPlan p;
    for (size_t i = 0; i < kEtcdMembers; ++i) {
        auto a = node_address(nodes[i], sc);
        if (!a) return a.status();
        p.members.push_back(nodes[i]);
        p.addrs.push_back(a.value());
        if (nodes[i] == o.node) p.me = static_cast<int>(i);
    }
    auto dyadd_ports = candidate_ports(o, key_hex);
    if (!dyadd_ports) return dyadd_ports.status();
    std::vector<unsigned> taken = dyadd_ports.value();
    p.client_port = pick_port(o, key_hex, "dyad-job-etcd-client-v1", taken);
    taken.push_back(p.client_port);
    p.peer_port = pick_port(o, key_hex, "dyad-job-etcd-peer-v1", taken);
    if (!p.client_port || !p.peer_port)
        return Status(
            DYAD_RC_BAD_CLI_PARSE,
            "--ports " + o.ports + " leaves no ports for the job's etcd: give a wider range",
            EINVAL);
    return std::optional<EtcdPlan>(std::move(p));
}

Status write_etcd_files(const Options& o, const std::string& key_hex, const std::string& addr) {
    auto t = derive_tls(key_hex, o.node, addr);
    if (!t) return t.status();
    const std::string d = o.dir + "/" + kEtcdTls;
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST)
        return Status(DYAD_RC_SYSFAIL, "cannot create " + d, errno);
    for (auto [f, text] : {std::pair{"ca.crt", &t->ca}, std::pair{"node.crt", &t->cert},
                           std::pair{"node.key", &t->key}})
        if (Status s = write_file(tls(o, f), *text); !s) return s;
    std::string pw = derive_etcd_password(key_hex);
    Status s = write_file(o.dir + "/" + kEtcdPassword, pw + "\n");
    std::fill(pw.begin(), pw.end(), '\0');
    return s;
}

namespace {
// etcd's last "error" in its log (JSON lines), else its last line.
std::string last_error(const std::string& log) {
    std::ifstream in(log);
    std::string line, found, last;
    while (std::getline(in, line)) {
        last = line;
        size_t at = line.rfind("\"error\":\"");
        if (at == std::string::npos) continue;
        at += 9;
        found = line.substr(at, line.find('"', at) - at);
    }
    found = found.empty() ? last : found;
    return found.size() > 300 ? found.substr(0, 300) + "..." : found;
}

// This node's member (our child) ended during the start: cannot run etcd
// (the job cannot have its store here: an error), or anything else (a
// port held: the job goes on with the other two, said on stderr).
Status member_ended(const Options& o, pid_t pid, int status) {
    const std::string log = o.dir + "/" + kEtcdLog;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        return Status(DYAD_RC_SYSFAIL,
                      "cannot run etcd (" +
                          (o.etcd.empty() ? std::string("etcd in PATH") : o.etcd) +
                          ") for the job's metadata store: install etcd 3.4 or later on every "
                          "node (Debian: etcd-server), or use the embedded store (plugstack.conf "
                          "store=embedded; dyad job start --store embedded): " +
                          last_error(log),
                      ENOENT);
    std::fprintf(stderr,
                 "%s: %s: this node's etcd member (pid %d) ended during its start (%s; see %s): "
                 "the job goes on with the other two members, and no longer survives the loss "
                 "of another node\n",
                 g_cmd.c_str(), o.node.c_str(), static_cast<int>(pid), last_error(log).c_str(),
                 log.c_str());
    return Status::ok();
}
}  // namespace

namespace {
// In a forked child: a session of its own (a job step's signals do not
// reach it), stdin from /dev/null, stdout and stderr to `logfd`.
void detach_child(int logfd) {
    ::setsid();
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    ::dup2(logfd, 1);
    ::dup2(logfd, 2);
}

// Part of the cluster token (on etcd's command line, which every user sees):
// a MAC of its own, so that it reveals nothing of the password.
std::string cluster_token_mac(const std::string& key_hex) {
    auto key = auth::Key::from_secret(key_hex);
    return key ? key->proof("dyad-job-etcd-cluster-token-v1", {}).substr(0, 16) : "";
}
}  // namespace

Result<pid_t> start_etcd_member(const Options& o, const EtcdPlan& p, const std::string& key_hex) {
    const std::string me = p.members[static_cast<size_t>(p.me)];
    const std::string addr = p.addrs[static_cast<size_t>(p.me)];
    std::string cluster;
    for (size_t i = 0; i < p.members.size(); ++i)
        cluster += (i ? "," : "") + p.members[i] + "=" + url(p.addrs[i], p.peer_port);
    // The token names the job and its key: another job's members (another
    // key) can never join this cluster, even at the same addresses.
    const std::string token = "dyad-job-" + o.job_id + "-" + cluster_token_mac(key_hex);
    std::vector<std::string> argv = {
        o.etcd.empty() ? "etcd" : o.etcd, "--name", me, "--data-dir", o.dir + "/" + kEtcdData,
        "--listen-client-urls", url(addr, p.client_port), "--advertise-client-urls",
        url(addr, p.client_port), "--listen-peer-urls", url(addr, p.peer_port),
        "--initial-advertise-peer-urls", url(addr, p.peer_port), "--initial-cluster", cluster,
        "--initial-cluster-token", token, "--initial-cluster-state", "new", "--client-cert-auth",
        "--trusted-ca-file", tls(o, "ca.crt"), "--cert-file", tls(o, "node.crt"), "--key-file",
        tls(o, "node.key"), "--peer-client-cert-auth", "--peer-trusted-ca-file", tls(o, "ca.crt"),
        "--peer-cert-file", tls(o, "node.crt"), "--peer-key-file", tls(o, "node.key"),
        // A job's nodes are on one network: elect within half a second.
        "--heartbeat-interval", "50", "--election-timeout", "500",
        // Tokens outlive any pause of a dyadd (it authenticates again anyway).
        "--auth-token", "simple", "--auth-token-ttl", "86400",
        // The password is 256 random bits: bcrypt's cost adds nothing to
        // it, and would cost every authentication tens of milliseconds.
        "--bcrypt-cost", "4", "--logger", "zap", "--log-outputs", "stderr"};
    const std::string log = o.dir + "/" + kEtcdLog;
    UniqueFd logfd(::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (!logfd.valid()) return Status(DYAD_RC_SYSFAIL, "cannot create " + log, errno);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    // Whether etcd could be run at all, known at once: the child writes
    // exec's errno here; a successful exec closes it empty.
    int report[2];
    if (::pipe2(report, O_CLOEXEC) != 0) return Status(DYAD_RC_SYSFAIL, "pipe", errno);
    UniqueFd rd(report[0]), wr(report[1]);
    pid_t pid = ::fork();
    if (pid < 0) return Status(DYAD_RC_SYSFAIL, "fork", errno);
    if (pid == 0) {
        detach_child(logfd.get());
        // etcd refuses ETCD_* variables that shadow its flags.
        std::vector<std::string> drop;
        for (char** e = environ; *e; ++e)
            if (std::strncmp(*e, "ETCD_", 5) == 0)
                drop.push_back(std::string(*e).substr(0, std::string(*e).find('=')));
        for (const auto& v : drop) ::unsetenv(v.c_str());
        ::execvp(args[0], args.data());
        const int e = errno;
        std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(e));
        (void)!::write(wr.get(), &e, sizeof e);
        ::_exit(127);
    }
    wr.reset();
    int e = 0;
    ssize_t n;
    while ((n = ::read(rd.get(), &e, sizeof e)) < 0 && errno == EINTR) {
    }
    if (n > 0) {
        int status = 0;
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        Status ended = member_ended(o, pid, status);  // (exit code 127: an error)
        if (!ended) return ended;
        return Status(DYAD_RC_SYSFAIL, std::string("cannot run etcd: ") + std::strerror(e), e);
    }
    std::ofstream(o.dir + "/" + kEtcdPid) << pid << "\n";
    return pid;
}

Status start_etcd_auth(const Options& o, const EtcdPlan& p, const std::string& key_hex,
                       pid_t member, const std::string& log) {
    UniqueFd logfd(::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (!logfd.valid()) return Status(DYAD_RC_SYSFAIL, "cannot create " + log, errno);
    std::string members, addrs;
    for (size_t i = 0; i < p.members.size(); ++i) {
        members += (i ? "," : "") + p.members[i];
        addrs += (i ? "," : "") + p.addrs[i];
    }
    std::vector<std::string> argv = {
        (fs::path(self_exe()).parent_path() / "dyad-etcd-auth").string(),
        "--dir",
        o.dir,
        "--node",
        o.node,
        "--members",
        members,
        "--addrs",
        addrs,
        "--client-port",
        std::to_string(p.client_port),
        "--me",
        std::to_string(p.me),
        "--member",
        std::to_string(member)};
    if (o.from_prolog) argv.push_back("--from-prolog");
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    // The key on its stdin (a pipe of one line: it fits the pipe's buffer).
    int in[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return Status(DYAD_RC_SYSFAIL, "pipe", errno);
    UniqueFd rd(in[0]), wr(in[1]);
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return Status(DYAD_RC_SYSFAIL, "fork", errno);
    if (pid == 0) {
        detach_child(logfd.get());
        ::dup2(rd.get(), 0);
        for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::signal(sig, SIG_DFL);
        ::execv(args[0], args.data());
        std::fprintf(stderr, "%s: cannot run %s: %s\n", g_cmd.c_str(), args[0],
                     std::strerror(errno));
        ::_exit(127);
    }
    rd.reset();
    const std::string line = key_hex + "\n";
    if (::write(wr.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size()))
        return Status(DYAD_RC_SYSFAIL, "cannot give the etcd auth helper the job key", errno);
    std::ofstream(o.dir + "/" + kEtcdAuthPid) << pid << "\n";
    return Status::ok();
}

Status check_member(const Options& o, pid_t member, const Deadline& d) {
    for (;;) {
        int status = 0;
        if (::waitpid(member, &status, WNOHANG) == member) return member_ended(o, member, status);
        if (d.expired()) return Status::ok();
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

std::string etcd_kvs_uri(const Options& o, const EtcdPlan& p) {
    auto s = etcd_security(o);
    std::string uri = "etcd://";
    for (const auto& e : etcd_endpoints(p)) uri += (uri.size() > 7 ? "," : "") + e;
    return uri + "?tls-ca=" + s.ca_file + "&tls-cert=" + s.cert_file + "&tls-key=" + s.key_file +
           "&tls-name=" + s.server_name + "&auth-user=" + s.user +
           "&password-file=" + s.password_file + "&managed-by=" + s.owner;
}

namespace {
// Processes of this user whose command line has `arg` as one argument (or,
// with `part`, anywhere) and, when `comm` is given, that name.
std::vector<pid_t> processes_with(const std::string& arg, bool part, const char* comm) {
    std::vector<pid_t> found;
    const std::string whole = std::string(1, '\0') + arg + std::string(1, '\0');
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc", ec)) {
        const std::string name = e.path().filename().string();
        if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
        struct stat st;
        if (::stat(e.path().c_str(), &st) != 0 || st.st_uid != ::getuid()) continue;
        std::ifstream in(e.path() / "cmdline", std::ios::binary);
        std::string line((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        line.push_back('\0');
        if ((part ? line.find(arg) : line.find(whole)) == std::string::npos) continue;
        if (comm) {
            std::ifstream c(e.path() / "comm");
            std::string cn;
            std::getline(c, cn);
            if (cn != comm) continue;
        }
        const pid_t pid = static_cast<pid_t>(std::stol(name));
        if (pid != ::getpid()) found.push_back(pid);
    }
    return found;
}

// SIGKILLs them; whether all are gone within 5 s.
bool kill_all(const std::vector<pid_t>& pids) {
    for (pid_t p : pids) ::kill(p, SIGKILL);
    bool gone = true;
    for (pid_t p : pids) gone = wait_gone(p, Deadline::after(5)) && gone;
    return gone;
}
}  // namespace

bool stop_etcd(const std::string& dir, double timeout) {
    // First what starts the member (it may be about to), then the auth
    // helper: found by their command lines, which name the job directory.
    kill_all(processes_with(dir, false, kEtcdStarter));
    kill_all(processes_with(dir, false, "dyad-etcd-auth"));
    std::ifstream in(dir + "/" + kEtcdPid);
    long pid = 0;
    std::ifstream cmd;
    if (in >> pid && pid > 1)
        cmd.open("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
    std::string line((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (cmd && line.find(dir + "/" + kEtcdData) != std::string::npos && timeout > 0) {
        ::kill(static_cast<pid_t>(pid), SIGTERM);
        wait_gone(static_cast<pid_t>(pid), Deadline::after(timeout));
    }
    // Then every member of this directory (its pid file may not be written
    // yet, if the starter was stopped right after starting it).
    return kill_all(processes_with(dir + "/" + kEtcdData, false, nullptr));
}

}  // namespace dyad::job::detail
