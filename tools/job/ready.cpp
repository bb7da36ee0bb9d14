// SPDX-License-Identifier: Apache-2.0
// node-up's network side: this node's address (Slurm's NodeAddr, else the
// name resolved), the job's candidate ports (derived from the job key: no
// other user can predict them), a port someone else holds skipped, and
// readiness proven by a hello with the job key (a listener that is not
// this job's dyadd never passes for it).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "common/auth.hpp"
#include "common/fd.hpp"
#include "job/slurm_conf.hpp"
#include "job/support.hpp"
#include "proto/identity.hpp"
#include "rpc/client.hpp"

namespace dyad::job::detail {

constexpr unsigned kCandidates = 8;

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
                      "cannot resolve node name '" + host + "': " + ::gai_strerror(rc) +
                          " (inside Slurm, NodeAddr of slurm.conf is used: give --slurm-conf)",
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

Result<std::string> node_address(const std::string& node, const SlurmConf* conf) {
    if (conf) {
        auto it = conf->node_addr.find(node);
        if (it != conf->node_addr.end()) {
            const std::string& a = it->second;
            in6_addr six;
            in_addr four;
            if (::inet_pton(AF_INET, a.c_str(), &four) == 1) return a;
            if (::inet_pton(AF_INET6, a.c_str(), &six) == 1) return "[" + a + "]";
            return resolve(a);  // NodeAddr may be a host name
        }
    }
    return resolve(node);
}

namespace {
Status port_range(const Options& o, unsigned* lo, unsigned* hi) {
    *lo = 20000;
    *hi = 29999;
    if (o.ports.empty()) return Status::ok();
    unsigned a = 0, b = 0;
    char extra = 0;
    int n = std::sscanf(o.ports.c_str(), "%u-%u%c", &a, &b, &extra);
    if (n != 2 || a == 0 || b > 65535 || b < a)
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "--ports '" + o.ports + "' is not LOW-HIGH (1-65535, LOW <= HIGH)", EINVAL);
    *lo = a;
    *hi = b;
    return Status::ok();
}
}  // namespace

std::vector<unsigned> derived_ports(const Options& o, const std::string& key_hex,
                                    const char* label) {
    unsigned lo = 0, hi = 0;
    if (!port_range(o, &lo, &hi)) return {};
    auto key = auth::Key::from_secret(key_hex);
    std::vector<unsigned> out;
    const unsigned span = hi - lo + 1;
    for (unsigned i = 0; out.size() < std::min(kCandidates, span) && i < 64 * kCandidates; ++i) {
        std::string p = key->proof(label, {std::to_string(i)});
        unsigned port = lo + static_cast<unsigned>(std::stoul(p.substr(0, 8), nullptr, 16) % span);
        if (std::find(out.begin(), out.end(), port) == out.end()) out.push_back(port);
    }
    return out;
}

Result<std::vector<unsigned>> candidate_ports(const Options& o, const std::string& key_hex) {
    if (o.port) return std::vector<unsigned>{o.port};
    unsigned lo = 0, hi = 0;
    if (Status s = port_range(o, &lo, &hi); !s) return s;
    return derived_ports(o, key_hex, "dyad-job-port-v1");
}

namespace {
bool fill_addr(const std::string& addr, unsigned port, sockaddr_storage* ss, socklen_t* len) {
    std::string host = addr;
    *ss = {};
    if (!host.empty() && host.front() == '[') {
        host = host.substr(1, host.size() - 2);
        auto* a = reinterpret_cast<sockaddr_in6*>(ss);
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(static_cast<uint16_t>(port));
        *len = sizeof *a;
        return ::inet_pton(AF_INET6, host.c_str(), &a->sin6_addr) == 1;
    }
    auto* a = reinterpret_cast<sockaddr_in*>(ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    *len = sizeof *a;
    return ::inet_pton(AF_INET, host.c_str(), &a->sin_addr) == 1;
}
}  // namespace

bool port_free(const std::string& addr, unsigned port) {
    sockaddr_storage ss;
    socklen_t len = 0;
    if (!fill_addr(addr, port, &ss, &len)) return false;
    UniqueFd s(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return false;
    int one = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    return ::bind(s.get(), reinterpret_cast<sockaddr*>(&ss), len) == 0;
}

Result<UniqueFd> bind_listening(const std::string& addr, unsigned port) {
    sockaddr_storage ss;
    socklen_t len = 0;
    if (!fill_addr(addr, port, &ss, &len))
        return Status(DYAD_RC_CONNFAIL, "'" + addr + "' is not an address", EINVAL);
    UniqueFd s(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return Status(DYAD_RC_SYSFAIL, "socket", errno);
    int one = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 ||
        ::listen(s.get(), SOMAXCONN) != 0)
        return Status(
            DYAD_RC_CONNFAIL,
            "cannot listen on " + addr + ":" + std::to_string(port) + ": " + std::strerror(errno),
            errno);
    return s;
}

Result<UniqueFd> bind_unix_listening(const std::string& path) {
    sockaddr_un sa = {};
    sa.sun_family = AF_UNIX;
    if (path.size() >= sizeof sa.sun_path)
        return Status(DYAD_RC_SYSFAIL, "the socket path " + path + " is too long", ENAMETOOLONG);
    std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(path.c_str());
    UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return Status(DYAD_RC_SYSFAIL, "socket", errno);
    // Bound, not listening: dyadd listens (a Unix socket's peer credentials
    // are those of the process that called listen(), and clients check that
    // it is the service that answers them); till then connecting is refused
    // and clients try again for a while (rpc/client.cpp).
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
        return Status(DYAD_RC_SYSFAIL, "cannot bind " + path + ": " + std::strerror(errno), errno);
    return s;
}

Hello hello(const std::string& addr, unsigned port, const std::string& key_path,
            const std::string& node, const Deadline& deadline) {
    Hello h;
    auto key = auth::Key::load(key_path);
    if (!key) {
        h.error = key.status().message();
        return h;
    }
    rpc::Credentials creds;
    creds.key = key.value();
    const std::string uri = "tcp://" + addr + ":" + std::to_string(port);
    auto c = rpc::Connection::connect(uri, deadline, creds);
    if (!c) {
        h.error = c.status().message();
        // Something answered, and not as this job's dyadd: another key, or
        // bytes that are not DYAD. (Silence or a close may be our dyadd not
        // serving yet: tried again.)
        h.foreign = c.status().rc() == DYAD_RC_NOAUTH ||
                    c.status().message().find("instead of a DYAD frame") != std::string::npos;
        return h;
    }
    auto id = proto::Identity::parse(c.value()->peer_info());
    if (!id || id->node != node) {
        h.foreign = true;
        h.error = uri + " holds the job key but is not the dyadd of node " + node;
        return h;
    }
    h.ok = true;
    h.pid = static_cast<pid_t>(id->pid);
    return h;
}

Result<unsigned> find_store(const Options& o, const std::string& first_addr,
                            const std::vector<unsigned>& ports, const std::string& key_path,
                            const Deadline& deadline, const std::string& log) {
    std::set<unsigned> foreign;
    while (true) {
        for (unsigned p : ports) {
            if (foreign.count(p)) continue;
            Deadline one = deadline.min(Deadline::after(0.5));
            Hello h = hello(first_addr, p, key_path, o.first, one);
            if (h.ok) return p;
            if (h.foreign) foreign.insert(p);
        }
        if (deadline.expired())
            return Status(DYAD_RC_CONNFAIL,
                          "the store on the first node " + o.first + " (" + first_addr +
                              ", the job's ports) did not answer with the job key within " +
                              std::to_string(int(o.timeout)) + " s; see that node's " + log,
                          ETIMEDOUT);
        ::usleep(5000);
    }
}

}  // namespace dyad::job::detail
