// SPDX-License-Identifier: Apache-2.0
// libfabric plumbing shared by the OFI transport (DYAD_DTL_MODE=MARGO, alias
// OFI) and its raw-bandwidth benchmark: protocols with Mercury's names mapped
// to providers, validation with fi_getinfo, and one RDM endpoint with its
// address vector, completion queue and memory registrations. Every call is
// checked and reported with fi_strerror; nothing asserts.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace dyad::dtl::ofi {

struct Protocol {
    const char* name;      // DYAD_MARGO_PROTO value (Mercury's name)
    const char* provider;  // libfabric provider (layered: "core;utility")
};
// Every protocol DYAD knows, available here or not.
const std::vector<Protocol>& protocols();
// The protocols whose provider fi_getinfo finds here (RDM, RMA read).
std::vector<std::string> available_protocols();
// A known protocol that works here, or MARGO_BAD_PROTO naming the available ones.
Result<const Protocol*> validate_protocol(const std::string& name);
std::string library_version();

Status fi_error(dyad_rc_t rc, const std::string& what, long ret);

struct Region {
    struct fid_mr* mr = nullptr;
    void* desc = nullptr;  // local descriptor (FI_MR_LOCAL providers)
    uint64_t key = 0;
    uint64_t base = 0;  // what the peer uses as address of byte 0
};

// One RDM endpoint: fabric, domain, CQ, AV and endpoint, closed in order.
class Endpoint {
  public:
    // `node` binds tcp-like providers to that address (the service's); null
    // lets the provider choose. `strict`: a provider that cannot bind there
    // is an error (the service's listen policy), except shared memory, which
    // listens on no network.
    static Result<std::unique_ptr<Endpoint>> open(const Protocol& p, const char* node,
                                                  bool strict = false);
    ~Endpoint();
    Endpoint(const Endpoint&) = delete;
    Endpoint& operator=(const Endpoint&) = delete;

    const std::string& address() const { return addr_; }
    // Whether this endpoint's addresses are struct sockaddr (family first).
    bool sockaddr_format() const;
    const Protocol& protocol() const { return *proto_; }
    struct fid_ep* ep() const {
        return ep_;
    }
    struct fid_cq* cq() const {
        return cq_;
    }
    struct fid_av* av() const {
        return av_;
    }
    bool can_wait() const { return can_wait_; }
    // Sleeps until the CQ may have something (or timeout_ms): fi_trywait,
    // then poll(2) on the CQ's wait fd. Returns at once when events are
    // already pending or the CQ has no fd.
    void sleep(int timeout_ms);
    bool manual_progress() const { return manual_; }

    Result<Region> register_memory(void* p, size_t n, uint64_t access);
    void release(Region& r);

  private:
    Endpoint() = default;
    const Protocol* proto_ = nullptr;
    struct fi_info* info_ = nullptr;
    struct fid_fabric* fabric_ = nullptr;
    struct fid_domain* domain_ = nullptr;
    struct fid_cq* cq_ = nullptr;
    struct fid_av* av_ = nullptr;
    struct fid_ep* ep_ = nullptr;
    std::string addr_;
    bool can_wait_ = false;  // the CQ has a wait object (fi_cq_sread works)
    int wait_fd_ = -1;       // that object's fd, when the provider gives one
    bool manual_ = false;    // data progress is driven by CQ reads
    uint64_t next_key_ = 1;  // for providers that take the key from us
};

}  // namespace dyad::dtl::ofi
