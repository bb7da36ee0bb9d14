// SPDX-License-Identifier: Apache-2.0
// The UCX transport's shared pieces and its row of the table of backends.
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "common/config.hpp"
#include "common/log.hpp"
#include "ucx.hpp"

namespace dyad::dtl {
namespace ucx {

Attributes ucx_attributes() {
    Attributes a;
    a.name = "UCX";
    a.latency_us = 160;
    a.bandwidth_gbps = 1.0;
    a.rma_native = false;  // this backend moves bytes by tagged messages
    a.max_message = kUcxChunk;
    unsigned maj = 0, min = 0, rel = 0;
    ucp_get_version(&maj, &min, &rel);
    const char* tls = std::getenv("UCX_TLS");  // UCX's own variable
    a.info = "UCX " + std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel) +
             ", UCX_TLS=" + (tls ? tls : "all");
    return a;
}

namespace {

std::string join(const std::set<std::string>& names) {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
    return out;
}

// RDMA ports as UCX names them ("mlx5_0:1"): they listen on no TCP port.
std::set<std::string> rdma_devices() {
    std::set<std::string> out;
    const std::string root = "/sys/class/infiniband";
    DIR* d = ::opendir(root.c_str());
    if (!d) return out;
    while (struct dirent* e = ::readdir(d)) {
        std::string dev = e->d_name;
        if (dev == "." || dev == "..") continue;
        DIR* p = ::opendir((root + "/" + dev + "/ports").c_str());
        if (!p) continue;
        while (struct dirent* q = ::readdir(p))
            if (q->d_name[0] != '.') out.insert(dev + ":" + q->d_name);
        ::closedir(p);
    }
    ::closedir(d);
    return out;
}

}  // namespace

Result<std::string> ucx_service_net_devices(const ServiceBind& bind, const char* env) {
    if (bind.host.empty()) return std::string();
    // The addresses of the bind host (a name such as localhost resolves).
    std::vector<std::pair<int, std::string>> want;  // family, raw address
    struct addrinfo hints {};
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo* res = nullptr;
    std::string host = bind.host;
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res)
        return Status(DYAD_RC_UCXINIT_FAIL,
                      "UCX: cannot resolve the service's listen address '" + bind.host +
                          "' to find its network interface",
                      EINVAL);
    bool loopback = false;
    for (auto* a = res; a; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
            want.emplace_back(AF_INET,
                              std::string(reinterpret_cast<const char*>(&in->sin_addr), 4));
            loopback = loopback || (ntohl(in->sin_addr.s_addr) >> 24) == 127;
        } else if (a->ai_family == AF_INET6) {
            auto* in = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
            want.emplace_back(AF_INET6,
                              std::string(reinterpret_cast<const char*>(&in->sin6_addr), 16));
            loopback = loopback || IN6_IS_ADDR_LOOPBACK(&in->sin6_addr);
        }
    }
    ::freeaddrinfo(res);
    std::set<std::string> found;
    struct ifaddrs* ifs = nullptr;
    if (::getifaddrs(&ifs) != 0)
        return Status(DYAD_RC_UCXINIT_FAIL, "UCX: cannot list the network interfaces", errno);
    for (auto* i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || !i->ifa_name) continue;
        // Every loopback address is the loopback interface's.
        if (loopback && (i->ifa_flags & IFF_LOOPBACK)) {
            found.insert(i->ifa_name);
            continue;
        }
        for (const auto& [fam, raw] : want) {
            if (i->ifa_addr->sa_family != fam) continue;
            const void* have =
                fam == AF_INET
                    ? static_cast<const void*>(
                          &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr)
                    : static_cast<const void*>(
                          &reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr);
            if (std::memcmp(have, raw.data(), raw.size()) == 0) found.insert(i->ifa_name);
        }
    }
    ::freeifaddrs(ifs);
    if (found.empty())
        return Status(DYAD_RC_UCXINIT_FAIL,
                      "UCX: no network interface holds the service's listen address '" + bind.host +
                          "': the service's UCX listeners could not be kept to it; give "
                          "--listen an address of this machine, or serve without UCX "
                          "(--transports)",
                      EADDRNOTAVAIL);
    std::string user = env ? env : "";
    if (bind.loopback_only) {
        if (!user.empty() && user != "all" && user != join(found))
            DYAD_WARN(kSub,
                      "UCX_NET_DEVICES=%s ignored by this dyadd: without a key it serves loopback "
                      "only, and its UCX worker uses %s",
                      user.c_str(), join(found).c_str());
        return join(found);
    }
    // The user's own choice of devices stands where the service has a key.
    if (!user.empty() && user != "all") return user;
    for (const auto& d : rdma_devices()) found.insert(d);
    return join(found);
}

std::string process_identity() {
    std::string start = "0";
    std::ifstream f("/proc/self/stat");
    std::string line;
    if (std::getline(f, line)) {
        size_t rp = line.rfind(')');
        if (rp != std::string::npos) {
            std::string rest = line.substr(rp + 2);
            size_t field = 3, pos = 0;  // rest starts at field 3 (state)
            while (field < 22 && pos != std::string::npos) {
                pos = rest.find(' ', pos);
                if (pos != std::string::npos) ++pos;
                ++field;
            }
            if (pos != std::string::npos) start = rest.substr(pos, rest.find(' ', pos) - pos);
        }
    }
    return hostname() + "/" + std::to_string(::getpid()) + "/" + start;
}

}  // namespace ucx

Backend ucx_backend() {
    return {"UCX", {}, ucx::ucx_attributes, ucx::make_receiver, ucx::make_sender, ucx::warmup};
}

}  // namespace dyad::dtl
