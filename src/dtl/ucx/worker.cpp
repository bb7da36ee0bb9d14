// SPDX-License-Identifier: Apache-2.0
// The UCX transport's shared pieces and its row of the table of backends.
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <vector>

#include "common/config.hpp"
#include "common/log.hpp"
#include "common/settings.hpp"
#include "ucx.hpp"

namespace dyad::dtl {
namespace ucx {

Attributes ucx_attributes() {
    Attributes a;
    a.name = name_of(Kind::ucx);
    a.latency_us = 160;
    a.bandwidth_gbps = 1.0;
    a.rma_native = false;  // this backend moves bytes by tagged messages
    a.max_message = kUcxChunk;
    unsigned maj = 0, min = 0, rel = 0;
    ucp_get_version(&maj, &min, &rel);
    auto tls = settings::foreign("UCX_TLS");  // UCX's own variable
    a.info = "UCX " + std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel) +
             ", UCX_TLS=" + tls.value_or("all");
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

// The transports UCX finds on this machine (what `ucx_info -d` lists), for
// an error naming UCX_TLS's choices.
std::set<std::string> transports_here() {
    std::set<std::string> out;
    uct_component_h* comps = nullptr;
    unsigned ncomps = 0;
    if (uct_query_components(&comps, &ncomps) != UCS_OK) return out;
    for (unsigned i = 0; i < ncomps; ++i) {
        uct_component_attr_t ca;
        std::memset(&ca, 0, sizeof ca);
        ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
        if (uct_component_query(comps[i], &ca) != UCS_OK || ca.md_resource_count == 0) continue;
        std::vector<uct_md_resource_desc_t> mds(ca.md_resource_count);
        ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
        ca.md_resources = mds.data();
        if (uct_component_query(comps[i], &ca) != UCS_OK) continue;
        for (const auto& mdr : mds) {
            uct_md_config_t* cfg = nullptr;
            if (uct_md_config_read(comps[i], nullptr, nullptr, &cfg) != UCS_OK) continue;
            uct_md_h md = nullptr;
            ucs_status_t s = uct_md_open(comps[i], mdr.md_name, cfg, &md);
            uct_config_release(cfg);
            if (s != UCS_OK) continue;
            uct_tl_resource_desc_t* tls = nullptr;
            unsigned ntls = 0;
            if (uct_md_query_tl_resources(md, &tls, &ntls) == UCS_OK) {
                for (unsigned t = 0; t < ntls; ++t) out.insert(tls[t].tl_name);
                uct_release_tl_resource_list(tls);
            }
            uct_md_close(md);
        }
    }
    uct_release_component_list(comps);
    return out;
}

// ucp_init failed: where the user chose UCX's transports or devices, the
// error names those settings and the transports UCX has here.
Status init_failed(ucs_status_t s) {
    auto tls = settings::foreign("UCX_TLS");
    auto devs = settings::foreign("UCX_NET_DEVICES");
    if (!tls && !devs) return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_init", s);
    std::string set = tls ? "UCX_TLS='" + *tls + "'" : "";
    if (devs) set += (set.empty() ? "" : " and ") + ("UCX_NET_DEVICES='" + *devs + "'");
    std::set<std::string> here = transports_here();
    return Status(DYAD_RC_UCXINIT_FAIL,
                  "UCX cannot start with " + set + " (ucp_init: " + ucs_text(s) +
                      "): UCX's transports on this machine are " +
                      (here.empty() ? std::string("none") : join(here)) +
                      " (`ucx_info -d` lists them with their devices); set UCX_TLS to some of "
                      "them, or unset it and UCX_NET_DEVICES to let UCX choose",
                  ENODEV);
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

namespace {

// One change to UCX's configuration, checked.
Status modify(ucp_config_t* cfg, const char* key, const std::string& value) {
    ucs_status_t s = ucp_config_modify(cfg, key, value.c_str());
    if (s != UCS_OK)
        return ucx_error(DYAD_RC_UCXINIT_FAIL,
                         "ucp_config_modify(" + std::string(key) + "=" + value + ")", s);
    return Status::ok();
}

// A service worker's configuration: no unified mode; no shared memory
// toward consumers (peer_address.hpp) unless the operator says every key
// holder may have it; listeners where the service's policy says, nowhere
// else. Sets `tls_used` to the transports the worker may use.
Status configure_service(ucp_config_t* cfg, const WorkerOptions& o, std::string* tls_used) {
    Status st = modify(cfg, "UNIFIED_MODE", "n");
    if (!st) return st;
    auto env_tls = settings::foreign("UCX_TLS");
    auto tls = o.shared_memory ? Result<std::string>(env_tls.value_or("all"))
                               : ucx_service_tls(env_tls ? env_tls->c_str() : nullptr);
    if (!tls) return tls.status();
    *tls_used = tls.value();
    st = modify(cfg, "TLS", tls.value());
    if (!st || !o.bind) return st;
    auto user = settings::foreign("UCX_NET_DEVICES");
    auto devs = ucx_service_net_devices(*o.bind, user ? user->c_str() : nullptr);
    if (!devs) return devs.status();
    if (devs->empty()) return Status::ok();
    st = modify(cfg, "NET_DEVICES", devs.value());
    if (st) DYAD_INFO(kSub, "the service's UCX worker uses the network devices %s", devs->c_str());
    return st;
}

// UCX's TCP tuning (kTcpTuning), where TCP may be used and the user did not
// set the variable (UCX warns of settings no transport took).
Status tune_tcp(ucp_config_t* cfg, const std::string& tls_used) {
    if (!ucx_tls_may_use_tcp(tls_used)) return Status::ok();
    for (const TcpTuning& t : kTcpTuning) {
        if (settings::foreign(t.env)) continue;  // the user's word
        Status st = modify(cfg, t.key, t.value);
        if (!st) return st;
    }
    return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Worker>> Worker::create(const WorkerOptions& o) {
    std::unique_ptr<Worker> w(new Worker());
    std::string tls_used = settings::foreign("UCX_TLS").value_or("");
    ucp_config_t* cfg = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg);
    if (s != UCS_OK) return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_config_read", s);
    Status st = o.service ? configure_service(cfg, o, &tls_used) : Status::ok();
    if (st) st = tune_tcp(cfg, tls_used);
    if (!st) {
        ucp_config_release(cfg);
        return st;
    }
    ucp_params_t p;
    std::memset(&p, 0, sizeof p);
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = o.shared_context ? 1 : 0;
    s = ucp_init(&p, cfg, &w->ctx_);
    ucp_config_release(cfg);
    if (s != UCS_OK) return init_failed(s);
    st = w->make_worker();
    if (!st) return st;
    return w;
}

Result<std::unique_ptr<Worker>> Worker::sibling(const Worker& parent) {
    std::unique_ptr<Worker> w(new Worker());
    w->ctx_ = parent.ctx_;
    w->owns_ctx_ = false;
    Status st = w->make_worker();
    if (!st) return st;
    return w;
}

// A worker on ctx_ used by one thread at a time, with its event fd and
// address.
Status Worker::make_worker() {
    ucp_worker_params_t wp;
    std::memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucs_status_t s = ucp_worker_create(ctx_, &wp, &worker_);
    if (s != UCS_OK) return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_worker_create", s);
    s = ucp_worker_get_efd(worker_, &efd_);
    if (s != UCS_OK) return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_worker_get_efd", s);
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    s = ucp_worker_get_address(worker_, &addr, &len);
    if (s != UCS_OK) return ucx_error(DYAD_RC_UCXINIT_FAIL, "ucp_worker_get_address", s);
    address_.assign(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address(worker_, addr);
    return Status::ok();
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
    return {name_of(Kind::ucx),
            aliases_of(Kind::ucx),
            ucx::ucx_attributes,
            ucx::make_receiver,
            [](asio::io_context& io, const ServiceBind& bind) -> Result<std::unique_ptr<Sender>> {
                auto o = UcxServiceOptions::from_settings();
                if (!o) return o.status();
                return ucx::make_sender(io, bind, o.value());
            },
            ucx::warmup};
}

}  // namespace dyad::dtl
