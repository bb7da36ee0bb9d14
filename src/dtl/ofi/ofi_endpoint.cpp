// SPDX-License-Identifier: Apache-2.0
#include <poll.h>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/config.hpp"
#include "dtl/options.hpp"
#include "ofi.hpp"

namespace dyad::dtl::ofi {
namespace {

constexpr uint32_t kApi = FI_VERSION(1, 9);

// Our defaults for provider settings libfabric reads from the environment
// when it first initializes (the first fi_getinfo of the process); a value
// the user set wins. DYAD sends no messages over libfabric, only RMA reads,
// so ofi_rxm's bounce buffers (16 KiB x 1,024 x 4 pools by default: 68 MB
// allocated and touched, ~40 ms of every consumer's start) can be small.
void set_provider_defaults() {
    static std::once_flag once;
    std::call_once(once, [] { ::setenv("FI_OFI_RXM_BUFFER_SIZE", "4096", /*overwrite=*/0); });
}

struct InfoDeleter {
    void operator()(fi_info* i) const { fi_freeinfo(i); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// RDM endpoints that can read remote memory; every memory-registration mode
// we know how to honour is offered, the provider keeps what it needs.
InfoPtr hints_for(const Protocol& p) {
    InfoPtr h(fi_allocinfo());
    if (!h) return h;
    h->caps = FI_RMA | FI_READ | FI_REMOTE_READ;
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    h->ep_attr->type = FI_EP_RDM;
    h->fabric_attr->prov_name = strdup(p.provider);
    h->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    h->domain_attr->threading = FI_THREAD_SAFE;
    return h;
}

Result<InfoPtr> get_info(const Protocol& p, const char* node, bool strict = false) {
    set_provider_defaults();
    InfoPtr h = hints_for(p);
    if (!h) return Status(DYAD_RC_SYSFAIL, "fi_allocinfo failed", ENOMEM);
    fi_info* out = nullptr;
    int ret = fi_getinfo(kApi, node, nullptr, node ? FI_SOURCE : 0, h.get(), &out);
    // Some providers take no source address; only shared memory may then
    // go unbound where the service's policy names an address.
    bool may_unbind = !strict || std::strncmp(p.provider, "shm", 3) == 0;
    if (ret != 0 && node && !may_unbind)
        return fi_error(DYAD_RC_MARGO_BAD_PROTO,
                        std::string("fi_getinfo for ") + p.name + " (provider " + p.provider +
                            ") bound to " + node +
                            " (the service's listen address; a keyless dyadd serves loopback "
                            "only): this provider cannot listen there; choose another "
                            "DYAD_MARGO_PROTO or --listen",
                        ret);
    if (ret != 0 && node) ret = fi_getinfo(kApi, nullptr, nullptr, 0, h.get(), &out);
    if (ret != 0)
        return fi_error(DYAD_RC_MARGO_BAD_PROTO,
                        std::string("fi_getinfo for ") + p.name + " (provider " + p.provider + ")",
                        ret);
    return InfoPtr(out);
}

}  // namespace

Status fi_error(dyad_rc_t rc, const std::string& what, long ret) {
    long e = ret < 0 ? -ret : ret;
    return Status(rc, what + ": " + fi_strerror(static_cast<int>(e)), EIO);
}

const std::vector<Protocol>& protocols() {
    static const std::vector<Protocol> table = {
        {"ofi+tcp", "tcp;ofi_rxm"},     {"ofi+sockets", "sockets"}, {"ofi+shm", "shm"},
        {"ofi+verbs", "verbs;ofi_rxm"}, {"ofi+cxi", "cxi"},
    };
    return table;
}

std::vector<std::string> available_protocols() {
    std::vector<std::string> out;
    for (const auto& p : protocols())
        if (get_info(p, nullptr)) out.push_back(p.name);
    return out;
}

static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? "none" : s;
}

Result<const Protocol*> validate_protocol(const std::string& name) {
    const Protocol* found = nullptr;
    for (const auto& p : protocols())
        if (name == p.name || name == std::string("ofi+") + p.provider) found = &p;
    if (!found) {
        std::vector<std::string> known;
        for (const auto& p : protocols()) known.push_back(p.name);
        std::string mercury = mercury_only_advice(name);
        return Status(DYAD_RC_MARGO_BAD_PROTO,
                      "DYAD_MARGO_PROTO='" + name + "' is " +
                          (mercury.empty() ? "not a protocol DYAD knows" : mercury) +
                          " (DYAD's libfabric protocols: " + join(known) +
                          "; Mercury's sm, na+sm, tcp and ofi+tcp;ofi_rxm are taken too); "
                          "available on this machine: " +
                          join(available_protocols()),
                      EINVAL);
    }
    auto info = get_info(*found, nullptr);
    if (!info)
        return Status(DYAD_RC_MARGO_BAD_PROTO,
                      "DYAD_MARGO_PROTO='" + name + "' is not available on this machine (" +
                          info.status().message() + "); available: " + join(available_protocols()),
                      ENOTSUP);
    return found;
}

std::string library_version() {
    uint32_t v = fi_version();
    return std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
}

Result<std::unique_ptr<Endpoint>> Endpoint::open(const Protocol& p, const char* node, bool strict) {
    auto info = get_info(p, node, strict);
    if (!info) return info.status();
    std::unique_ptr<Endpoint> e(new Endpoint());
    e->proto_ = &p;
    e->info_ = info.value().release();
    e->manual_ = e->info_->domain_attr->data_progress == FI_PROGRESS_MANUAL;
    const std::string what = std::string(p.name) + ": ";
    int ret = fi_fabric(e->info_->fabric_attr, &e->fabric_, nullptr);
    if (ret) return fi_error(DYAD_RC_MARGO_BAD_PROTO, what + "fi_fabric", ret);
    ret = fi_domain(e->fabric_, e->info_, &e->domain_, nullptr);
    if (ret) return fi_error(DYAD_RC_MARGO_BAD_PROTO, what + "fi_domain", ret);
    fi_cq_attr cqa;
    std::memset(&cqa, 0, sizeof cqa);
    cqa.size = 256;
    cqa.format = FI_CQ_FORMAT_CONTEXT;
    // A file descriptor to sleep on; providers without one (shm would
    // only offer a sched_yield loop) get no wait object at all.
    cqa.wait_obj = FI_WAIT_FD;
    ret = fi_cq_open(e->domain_, &cqa, &e->cq_, nullptr);
    e->can_wait_ = ret == 0;
    if (ret) {  // a provider without wait objects: the CQ is read, not waited on
        cqa.wait_obj = FI_WAIT_NONE;
        ret = fi_cq_open(e->domain_, &cqa, &e->cq_, nullptr);
    }
    if (ret) return fi_error(DYAD_RC_MARGO_BAD_PROTO, what + "fi_cq_open", ret);
    if (e->can_wait_ && fi_control(&e->cq_->fid, FI_GETWAIT, &e->wait_fd_) != 0) e->wait_fd_ = -1;
    fi_av_attr ava;
    std::memset(&ava, 0, sizeof ava);
    ava.type = FI_AV_UNSPEC;
    ret = fi_av_open(e->domain_, &ava, &e->av_, nullptr);
    if (ret) return fi_error(DYAD_RC_MARGO_BAD_PROTO, what + "fi_av_open", ret);
    ret = fi_endpoint(e->domain_, e->info_, &e->ep_, nullptr);
    if (ret) return fi_error(DYAD_RC_MARGO_BAD_PROTO, what + "fi_endpoint", ret);
    ret = fi_ep_bind(e->ep_, &e->av_->fid, 0);
    if (ret) return fi_error(DYAD_RC_MARGO_BAD_PROTO, what + "fi_ep_bind(av)", ret);
    ret = fi_ep_bind(e->ep_, &e->cq_->fid, FI_TRANSMIT | FI_RECV);
    if (ret) return fi_error(DYAD_RC_MARGO_BAD_PROTO, what + "fi_ep_bind(cq)", ret);
    ret = fi_enable(e->ep_);
    if (ret) return fi_error(DYAD_RC_MARGO_BAD_PROTO, what + "fi_enable", ret);
    char buf[512];
    size_t len = sizeof buf;
    ret = fi_getname(&e->ep_->fid, buf, &len);
    if (ret) return fi_error(DYAD_RC_MARGO_BAD_PROTO, what + "fi_getname", ret);
    e->addr_.assign(buf, len);
    return e;
}

bool Endpoint::sockaddr_format() const {
    switch (info_->addr_format) {
        case FI_SOCKADDR:
        case FI_SOCKADDR_IN:
        case FI_SOCKADDR_IN6:
            return true;
        default:
            return false;
    }
}

Endpoint::~Endpoint() {
    if (ep_) fi_close(&ep_->fid);
    if (av_) fi_close(&av_->fid);
    if (cq_) fi_close(&cq_->fid);
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    if (info_) fi_freeinfo(info_);
}

Result<Region> Endpoint::register_memory(void* p, size_t n, uint64_t access) {
    Region r;
    uint64_t mode = info_->domain_attr->mr_mode;
    int ret = fi_mr_reg(domain_, p, n, access, 0, next_key_++, 0, &r.mr, nullptr);
    if (ret) return fi_error(DYAD_RC_MARGO_BAD_PROTO, "fi_mr_reg", ret);
    if (mode & FI_MR_ENDPOINT) {
        ret = fi_mr_bind(r.mr, &ep_->fid, 0);
        if (!ret) ret = fi_mr_enable(r.mr);
        if (ret) {
            fi_close(&r.mr->fid);
            return fi_error(DYAD_RC_MARGO_BAD_PROTO, "fi_mr_bind/fi_mr_enable", ret);
        }
    }
    r.desc = fi_mr_desc(r.mr);
    r.key = fi_mr_key(r.mr);
    r.base = (mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(p) : 0;
    return r;
}

void Endpoint::release(Region& r) {
    if (r.mr) fi_close(&r.mr->fid);
    r.mr = nullptr;
}

void Endpoint::sleep(int timeout_ms) {
    if (wait_fd_ < 0) return;
    struct fid* f = &cq_->fid;
    if (fi_trywait(fabric_, &f, 1) != FI_SUCCESS) return;  // something to read already
    struct pollfd pf = {wait_fd_, POLLIN, 0};
    ::poll(&pf, 1, timeout_ms);
}

}  // namespace dyad::dtl::ofi
