// SPDX-License-Identifier: Apache-2.0
// `dyad doctor --site`: on one node, every requirement of the SPANK plugin
// an administrator must meet, each with pass/fail and the fix (issue 46,
// item 5): PrologFlags=Alloc, the plugstack line, node names or NodeAddr
// that resolve, the job port range free here and open between nodes, the
// site secret and its mode, dyadd and dyad of this build. Read-only; no
// job is needed (docs/user-guide.md, "Slurm: for administrators").
#include "doctor_site.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <glob.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include <dyad/dyad_version.h>
#include <nlohmann/json.hpp>

#include "common/fd.hpp"
#include "common/json_text.hpp"
#include "job/slurm_conf.hpp"
#include "job/support.hpp"

namespace dyad::tools {
namespace {

const char* word(Finding::Verdict v) {
    static const char* words[] = {"ok", "note", "warn", "FAIL"};
    return words[v];
}

std::string lower(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string dir_of(const std::string& path) {
    size_t slash = path.rfind('/');
    return slash == std::string::npos ? "." : path.substr(0, slash);
}

// PlugStackConfig of slurm.conf (the file itself only), or "".
std::string plugstack_of(const std::string& slurm_conf) {
    std::ifstream in(slurm_conf);
    std::string line, found;
    while (std::getline(in, line)) {
        if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
        std::istringstream ws(line);
        for (std::string w; ws >> w;)
            if (lower(w.substr(0, 16)) == "plugstackconfig=") found = w.substr(16);
    }
    return found;
}

// Reads one plugstack file (and its includes, at most 4 deep).
bool scan_plugstack(const std::string& path, int depth, PlugstackEntry* out, std::string* read) {
    std::ifstream in(path);
    if (!in) return false;
    *read += (read->empty() ? "" : ", ") + path;
    std::string line;
    while (std::getline(in, line)) {
        if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
        std::istringstream ws(line);
        std::string kind, plugin;
        if (!(ws >> kind)) continue;
        if (lower(kind) == "include" && depth < 4) {
            std::string pattern;
            ws >> pattern;
            if (!pattern.empty() && pattern.front() != '/') pattern = dir_of(path) + "/" + pattern;
            glob_t g = {};
            if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
                for (size_t i = 0; i < g.gl_pathc; ++i)
                    if (scan_plugstack(g.gl_pathv[i], depth + 1, out, read)) {
                        ::globfree(&g);
                        return true;
                    }
            ::globfree(&g);
            continue;
        }
        if (!(ws >> plugin) || plugin.find("dyad_spank") == std::string::npos) continue;
        out->file = path;
        out->plugin = plugin;
        out->required = lower(kind) == "required";
        for (std::string a; ws >> a;)
            if (size_t eq = a.find('='); eq != std::string::npos)
                out->args[a.substr(0, eq)] = a.substr(eq + 1);
        return true;
    }
    return false;
}

std::string mode_text(mode_t m) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
    return buf;
}

bool readable(const std::string& p) {
    return !p.empty() && ::access(p.c_str(), R_OK) == 0;
}

// The first line `prog --version` prints (within 5 s), or "" .
std::string version_of(const std::string& prog) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return "";
    pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(fds[1], 1);
        ::execl(prog.c_str(), prog.c_str(), "--version", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    ::close(fds[1]);
    std::string out;
    char buf[256];
    struct pollfd p = {fds[0], POLLIN, 0};
    while (pid > 0 && ::poll(&p, 1, 5000) > 0) {
        ssize_t n = ::read(fds[0], buf, sizeof buf);
        if (n <= 0) break;
        out.append(buf, static_cast<size_t>(n));
    }
    ::close(fds[0]);
    if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
    }
    return out.substr(0, out.find('\n'));
}
}  // namespace

int print_findings(const std::vector<Finding>& f, bool json) {
    bool failed = false;
    for (const auto& c : f) failed = failed || c.verdict == Finding::fail;
    if (json) {
        nlohmann::json list = nlohmann::json::array();
        for (const auto& c : f)
            list.push_back({{"check", c.name},
                            {"verdict", word(c.verdict)},
                            {"detail", c.detail},
                            {"fix", c.fix}});
        std::cout << nlohmann::json({{"ok", !failed}, {"checks", list}})
                         .dump(2, ' ', false, kBadUtf8Replaced)
                  << "\n";
        return failed ? 1 : 0;
    }
    for (const auto& c : f) {
        std::printf("%-5s %-18s %s\n", word(c.verdict), c.name.c_str(), c.detail.c_str());
        if (!c.fix.empty()) std::printf("      %-18s fix: %s\n", "", c.fix.c_str());
    }
    std::printf("%s\n",
                failed ? "Something above needs fixing (FAIL)." : "Nothing blocks DYAD here.");
    return failed ? 1 : 0;
}

std::string find_slurm_conf(const std::string& given) {
    if (!given.empty()) return readable(given) ? given : "";
    if (const char* e = std::getenv("SLURM_CONF"); e && readable(e)) return e;
    for (const char* p : {"/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf"})
        if (readable(p)) return p;
    return "";
}

bool find_plugstack_entry(const std::string& slurm_conf, PlugstackEntry* out, std::string* where) {
    std::string ps = plugstack_of(slurm_conf);
    if (ps.empty()) ps = dir_of(slurm_conf) + "/plugstack.conf";
    where->clear();
    if (scan_plugstack(ps, 0, out, where)) return true;
    if (where->empty()) *where = ps + " (not readable)";
    return false;
}

namespace {
using V = Finding::Verdict;

void check_prolog_flags(std::vector<Finding>& f, const job::SlurmConf& sc) {
    if (sc.prolog_alloc()) {
        f.push_back(
            {"PrologFlags", V::ok, "PrologFlags=" + sc.prolog_flags + " (" + sc.path + ")", ""});
        return;
    }
    f.push_back(
        {"PrologFlags", V::fail,
         sc.path + " has " +
             (sc.prolog_flags.empty() ? "no PrologFlags" : "PrologFlags=" + sc.prolog_flags) +
             ": without Alloc the job prolog does not run on every node at allocation, and "
             "--dyad jobs fail at once",
         "add PrologFlags=Alloc to slurm.conf on every node and the controller, then "
         "`scontrol reconfigure` (check: scontrol show config | grep -i PrologFlags)"});
}

// The plugin's line: the .so present, dyadd and dyad beside it of this build.
void check_plugin(std::vector<Finding>& f, const PlugstackEntry& e) {
    f.push_back(
        {"plugstack", V::ok, e.file + ": " + (e.required ? "required " : "optional ") + e.plugin,
         e.required ? ""
                    : "(optional: a node where the plugin cannot load runs jobs without DYAD)"});
    if (!readable(e.plugin)) {
        f.push_back(
            {"plugin", V::fail, e.plugin + " is not readable on this node",
             "install DYAD on every node at the same path, or correct the path in " + e.file});
        return;
    }
    std::string dyadd = e.args.count("dyadd") ? e.args.at("dyadd") : "";
    if (dyadd.empty()) {  // bin/dyadd of the nearest ancestor of the plugin's directory
        std::string d = dir_of(e.plugin);
        for (int up = 0; up < 4 && dyadd.empty() && d.size() > 1; ++up, d = dir_of(d))
            if (::access((dir_of(d) + "/bin/dyadd").c_str(), X_OK) == 0)
                dyadd = dir_of(d) + "/bin/dyadd";
    }
    if (dyadd.empty() || ::access(dyadd.c_str(), X_OK) != 0) {
        f.push_back(
            {"dyadd", V::fail,
             "no dyadd program " + (dyadd.empty() ? "beside " + e.plugin : "at " + dyadd),
             "install dyadd and dyad beside the plugin (PREFIX/bin), or give dyadd=PATH in " +
                 e.file});
        return;
    }
    const std::string mine = std::string("dyadd ") + dyad_version();
    const std::string theirs = version_of(dyadd);
    const std::string tool = dir_of(dyadd) + "/dyad";
    if (theirs != mine)
        f.push_back({"dyadd", V::fail,
                     dyadd + " says '" + theirs + "', this dyad is " + dyad_version(),
                     "install the plugin, dyadd and dyad of one build on every node"});
    else if (::access(tool.c_str(), X_OK) != 0)
        f.push_back({"dyadd", V::fail,
                     "no dyad program beside " + dyadd + " (the prolog runs " + tool + ")",
                     "install dyad beside dyadd"});
    else
        f.push_back({"dyadd", V::ok, dyadd + " and " + tool + ", " + theirs, ""});
}

// The site secret: root's, no group or other access, 32 bytes or more.
void check_site_key(std::vector<Finding>& f, const PlugstackEntry& e) {
    std::string path = e.args.count("site_key") ? e.args.at("site_key") : "/etc/dyad/slurm.key";
    struct stat st;
    if (!e.args.count("site_key") && ::stat(path.c_str(), &st) != 0 &&
        ::stat("/etc/munge/munge.key", &st) == 0)
        path = "/etc/munge/munge.key";
    const std::string make = "dyad keygen " + path + " && chmod 0400 " + path +
                             " as root, and copy the same file to every node (check: ls -l " +
                             path + ")";
    if (::lstat(path.c_str(), &st) != 0) {
        f.push_back({"site key", V::fail, path + ": " + std::strerror(errno), make});
        return;
    }
    if (!S_ISREG(st.st_mode))
        f.push_back({"site key", V::fail, path + " is not a regular file", make});
    else if (st.st_mode & 077)
        f.push_back({"site key", V::fail,
                     path + " has mode " + mode_text(st.st_mode) +
                         ": group or others can read it (the plugin refuses it; anyone could "
                         "derive every job's key)",
                     "chmod 0400 " + path});
    else if (st.st_uid != 0)
        f.push_back({"site key", V::fail, path + " is not root's", "chown root: " + path});
    else if (st.st_size < 32)
        f.push_back({"site key", V::fail, path + " holds fewer than 32 bytes", make});
    else
        f.push_back({"site key", V::ok,
                     path + " (root's, mode " + mode_text(st.st_mode) + ", " +
                         std::to_string(st.st_size) + " bytes); every node needs the same file",
                     ""});
}

// Every NodeName of slurm.conf has an address (NodeAddr, or its name
// resolved): `dyad job node-up` needs it. Their addresses, by node.
std::map<std::string, std::string> check_nodes(std::vector<Finding>& f, const job::SlurmConf& sc) {
    std::map<std::string, std::string> addrs;
    std::string bad;
    for (const auto& [node, given] : sc.node_addr) {
        auto a = job::detail::node_address(node, &sc);
        if (a)
            addrs[node] = a.value();
        else if (bad.size() < 400)
            bad += (bad.empty() ? "" : "; ") + a.status().message();
    }
    if (sc.node_addr.empty())
        f.push_back({"node names", V::warn, sc.path + " names no node (NodeName=)", ""});
    else if (!bad.empty())
        f.push_back({"node names", V::fail, bad,
                     "give NodeAddr= for those nodes in slurm.conf, or make their names resolve on "
                     "every node (DNS or /etc/hosts; check: getent hosts NAME)"});
    else
        f.push_back({"node names", V::ok,
                     std::to_string(addrs.size()) +
                         " nodes, each with an address (NodeAddr or its name resolved)",
                     ""});
    return addrs;
}

struct Ports {
    unsigned lo = 20000, hi = 29999;
};

Ports ports_of(const PlugstackEntry& e) {
    Ports p;
    unsigned a = 0, b = 0;
    if (e.args.count("port") && std::sscanf(e.args.at("port").c_str(), "%u", &a) == 1)
        p.lo = p.hi = a;
    if (e.args.count("ports") && std::sscanf(e.args.at("ports").c_str(), "%u-%u", &a, &b) == 2 &&
        a <= b)
        p = {a, b};
    return p;
}

// Ports of [lo, hi] something listens on here (/proc/net/tcp and tcp6).
unsigned listened(const Ports& p) {
    unsigned n = 0;
    for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
        std::ifstream in(file);
        std::string line;
        std::getline(in, line);  // the header
        while (std::getline(in, line)) {
            std::istringstream ws(line);
            std::string slot, local, remote, state;
            if (!(ws >> slot >> local >> remote >> state) || state != "0A") continue;
            size_t colon = local.rfind(':');
            if (colon == std::string::npos) continue;
            unsigned port =
                static_cast<unsigned>(std::strtoul(local.c_str() + colon + 1, nullptr, 16));
            if (port >= p.lo && port <= p.hi) ++n;
        }
    }
    return n;
}

// Whether addr:port answers from here (connected, or refused: nothing
// filters it), within the deadline; all at once.
std::vector<std::string> unreachable(const std::map<std::string, std::string>& addrs,
                                     unsigned port) {
    std::vector<std::pair<std::string, UniqueFd>> socks;
    std::vector<std::string> out;
    for (const auto& [node, addr] : addrs) {
        std::string host = addr;
        sockaddr_storage ss = {};
        socklen_t len = 0;
        if (!host.empty() && host.front() == '[') {
            auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
            a6->sin6_family = AF_INET6;
            a6->sin6_port = htons(static_cast<uint16_t>(port));
            if (::inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a6->sin6_addr) != 1)
                continue;
            len = sizeof *a6;
        } else {
            auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
            a4->sin_family = AF_INET;
            a4->sin_port = htons(static_cast<uint16_t>(port));
            if (::inet_pton(AF_INET, host.c_str(), &a4->sin_addr) != 1) continue;
            len = sizeof *a4;
        }
        UniqueFd s(::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (!s.valid()) continue;
        int rc = ::connect(s.get(), reinterpret_cast<sockaddr*>(&ss), len);
        if (rc == 0 || errno == ECONNREFUSED) continue;
        if (errno != EINPROGRESS) {
            out.push_back(node + " (" + addr + ": " + std::strerror(errno) + ")");
            continue;
        }
        socks.emplace_back(node + " (" + addr + ")", std::move(s));
    }
    std::vector<struct pollfd> p;
    for (auto& [name, s] : socks) p.push_back({s.get(), POLLOUT, 0});
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!p.empty() && std::chrono::steady_clock::now() < until) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            until - std::chrono::steady_clock::now());
        if (::poll(p.data(), p.size(), static_cast<int>(left.count()) + 1) <= 0) break;
        for (auto& q : p)
            if (q.revents) q.fd = -q.fd - 1;  // answered: done (poll skips negative fds)
    }
    for (size_t i = 0; i < p.size(); ++i) {
        int err = 0;
        socklen_t l = sizeof err;
        if (p[i].fd >= 0)
            out.push_back(socks[i].first + ": no answer within 2 s");
        else if (::getsockopt(socks[i].second.get(), SOL_SOCKET, SO_ERROR, &err, &l) == 0 && err &&
                 err != ECONNREFUSED)
            out.push_back(socks[i].first + ": " + std::strerror(err));
    }
    return out;
}

void check_ports(std::vector<Finding>& f, const Ports& p,
                 const std::map<std::string, std::string>& addrs) {
    const std::string range = std::to_string(p.lo) + "-" + std::to_string(p.hi);
    const unsigned span = p.hi - p.lo + 1, held = listened(p);
    if (held >= span)
        f.push_back({"ports", V::fail, "every port of " + range + " is held on this node",
                     "free them, or give the plugin another range (ports=LOW-HIGH in "
                     "plugstack.conf; check: ss -tln)"});
    else
        f.push_back({"ports", held ? V::note : V::ok,
                     range + ": " + std::to_string(held) + " of " + std::to_string(span) +
                         " held here (a job skips a held port)",
                     ""});
    std::ifstream eph("/proc/sys/net/ipv4/ip_local_port_range");
    unsigned elo = 0, ehi = 0;
    if (eph >> elo >> ehi && elo <= p.hi && ehi >= p.lo)
        f.push_back({"ports", V::warn,
                     range + " overlaps the kernel's ephemeral ports (" + std::to_string(elo) +
                         "-" + std::to_string(ehi) +
                         "): outgoing connections may take a job's port",
                     "give the plugin a range outside it (ports=LOW-HIGH), or set "
                     "net.ipv4.ip_local_reserved_ports=" +
                         range});
    auto bad = unreachable(addrs, p.lo);
    std::string list;
    for (const auto& b : bad) list += (list.empty() ? "" : "; ") + b;
    if (!bad.empty())
        f.push_back({"ports reachable", V::fail,
                     "port " + std::to_string(p.lo) +
                         " of the job range does not answer from here on " + list,
                     "open TCP " + range +
                         " between the nodes (firewall), or give the plugin a range that is "
                         "open (check: nc -zv NODE " +
                         std::to_string(p.lo) + " says refused or open, not a timeout)"});
    else if (!addrs.empty())
        f.push_back({"ports reachable", V::ok,
                     "port " + std::to_string(p.lo) +
                         " answers (open or refused, not filtered) on " +
                         std::to_string(addrs.size()) + " nodes",
                     ""});
}
}  // namespace

int doctor_site(const std::string& given, bool json) {
    std::vector<Finding> f;
    const std::string conf = find_slurm_conf(given);
    if (conf.empty()) {
        f.push_back({"slurm.conf", V::fail,
                     given.empty() ? "no readable slurm.conf ($SLURM_CONF, /etc/slurm/slurm.conf)"
                                   : given + " is not readable",
                     "run it on a node of the cluster, or give --slurm-conf PATH"});
        return print_findings(f, json);
    }
    auto sc = job::read_slurm_conf(conf);
    if (!sc) {
        f.push_back({"slurm.conf", V::fail, sc.status().message(), "correct slurm.conf"});
        return print_findings(f, json);
    }
    f.push_back({"slurm.conf", V::ok, conf, ""});
    check_prolog_flags(f, sc.value());
    PlugstackEntry e;
    std::string read;
    if (!find_plugstack_entry(conf, &e, &read))
        f.push_back(
            {"plugstack", V::fail, "no dyad_spank.so line in " + read,
             "add `required PREFIX/lib/dyad_spank.so` to plugstack.conf on every node and where "
             "jobs are submitted (docs/user-guide.md, \"Slurm: for administrators\")"});
    else {
        check_plugin(f, e);
        check_site_key(f, e);
    }
    auto addrs = check_nodes(f, sc.value());
    check_ports(f, ports_of(e), addrs);
    return print_findings(f, json);
}

}  // namespace dyad::tools
