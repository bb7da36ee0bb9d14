// SPDX-License-Identifier: Apache-2.0
// Claims of origin files (DYAD_ORIGIN_PUBLISH; docs/user-guide.md, "Each
// origin file read once"): before a node reads a file from the origin it
// claims it through its dyadd (dyad.origin_claim). Of several nodes that
// want the file at once, one holds the claim and reads it; the others wait
// for its publish and fetch the file from it. A claim whose holder's
// service no longer answers is taken over at once; one held past
// DYAD_TRANSFER_TIMEOUT without a publish (its consumer died, or hangs) is
// taken over then. The taker reads the origin itself.
#include <algorithm>
#include <atomic>
#include <cerrno>

#include "client.hpp"
#include "common/keygen.hpp"
#include "common/log.hpp"
#include "proto/origin_claim.hpp"

namespace dyad::client {
namespace {
constexpr const char* kSub = "client";
constexpr double kClaimCallTimeout = 30.0;
constexpr double kHolderPing = 2.0;  // a holder's service that does not answer within: gone
constexpr double kWaitSlice = 1.0;   // between two looks at the claim
constexpr int kTakeovers = 3;        // then the origin, claimed or not
}  // namespace

Result<proto::OriginClaimAnswer> Client::claim_call(const std::string& upath,
                                                    const ServiceInfo& svc, uint64_t takes,
                                                    bool release) {
    proto::OriginClaimRequest req;
    req.upath = upath;
    req.ns = link_.ns(svc);
    req.key_depth = cfg_.key_depth;
    req.key_bins = cfg_.key_bins;
    req.takes = takes;
    req.release = release;
    auto v = link_.pool().call(cfg_.service_uri, proto::kOriginClaim, req.build(),
                               Deadline::after(kClaimCallTimeout));
    if (!v) return v.status();
    return proto::OriginClaimAnswer::parse(v.value());
}

void Client::release_claim(const std::string& upath, const ServiceInfo& svc) {
    auto r = claim_call(upath, svc, 0, true);
    if (!r)
        DYAD_DEBUG(kSub, "cannot release the claim of '%s': %s", upath.c_str(),
                   r.status().to_string().c_str());
}

bool Client::claim_holder_gone(const std::string& value, uint64_t version, const ServiceInfo& svc) {
    auto holder = Record::from_json(value, version);
    if (!holder) return true;  // not a claim this client can read: not waited for
    const std::string ep = OwnerDirectory::endpoint(holder.value(), svc);
    if (ep.empty()) return true;
    bool refused = false;
    auto v = link_.pool().call(ep, "dyad.status", nlohmann::json::object(),
                               Deadline::after(kHolderPing), 0, true, &refused);
    return !v && (refused || v.status().rc() == DYAD_RC_TIMEOUT);
}

Result<Client::ClaimWait> Client::await_holder(const std::string& upath, const ServiceInfo& svc,
                                               const proto::OriginClaimAnswer& claim) {
    auto st = link_.store();
    if (!st) return st.status();
    auto key = gen_path_key(upath, cfg_.key_depth, cfg_.key_bins);
    if (!key) return key.status();
    const std::string cns = proto::claims_namespace(link_.ns(svc));
    const double limit = cfg_.transfer_timeout > 0 ? cfg_.transfer_timeout : 60.0;
    Deadline until = Deadline::after(limit);
    uint64_t version = claim.version;
    for (;;) {
        const double slice = std::max(0.05, std::min(kWaitSlice, until.remaining()));
        auto r = lookup_upath(upath, true, Deadline::after(slice));
        if (r) return ClaimWait{r.value(), 0};
        if (r.status().rc() != DYAD_RC_TIMEOUT) return r.status();
        auto c = st.value()->get(cns, key.value(), Deadline::after(kClaimCallTimeout));
        // Released without a publish (its holder failed): claimed again.
        if (!c && c.status().rc() == DYAD_RC_NOTFOUND) return ClaimWait{std::nullopt, 0};
        if (!c) return c.status();
        if (c->version != version) {  // taken over by another node: its own time
            version = c->version;
            until = Deadline::after(limit);
            continue;
        }
        if (until.expired() || claim_holder_gone(c->value, c->version, svc))
            return ClaimWait{std::nullopt, version};
    }
}

Status Client::claim_or_wait(const std::string& upath, const Record& origin_rec,
                             const ServiceInfo& svc, ConsumeReport* rep, int lock_fd, bool* done,
                             bool* held) {
    *done = *held = false;
    uint64_t takes = 0;
    for (int round = 0; round <= kTakeovers; ++round) {
        auto a = claim_call(upath, svc, takes, false);
        if (!a) {
            static std::atomic<bool> warned{false};
            if (!warned.exchange(true))
                DYAD_WARN(kSub,
                          "cannot claim '%s' before reading it from the origin: %s; read "
                          "without a claim, other nodes may read it too (said once)",
                          upath.c_str(), a.status().to_string().c_str());
            return Status::ok();
        }
        if (a->held) {
            *held = true;
            // Published meanwhile (by the holder before this one, or by
            // another process of this node): that record, not the origin.
            // This node's own publish of an older version of the origin
            // file is what this read replaces, not a reason to skip it.
            auto r = lookup_upath(upath, false, Deadline::after(kClaimCallTimeout));
            if (!r) return Status::ok();
            if (r->owner == svc.id && !prod_.empty() &&
                Origin::published_from(prod_.join(upath)) != Origin::identity(origin_rec))
                return Status::ok();
            *done = true;
            return consume_published(upath, r.value(), svc, rep, lock_fd);
        }
        auto w = await_holder(upath, svc, a.value());
        if (!w) return w.status();
        if (w->record) {
            *done = true;
            return consume_published(upath, *w->record, svc, rep, lock_fd);
        }
        takes = w->takes;
    }
    return Status::ok();  // claimed and lost kTakeovers times: the origin itself
}

Status Client::consume_published(const std::string& upath, const Record& rec,
                                 const ServiceInfo& svc, ConsumeReport* rep, int lock_fd) {
    if (in_place(rec, svc)) {
        rep->transport = "none";
        rep->action = "in-place";
        rep->bytes = rec.size;
        return Status::ok();
    }
    return fetch(upath, rec, svc, rep, lock_fd);
}

}  // namespace dyad::client
