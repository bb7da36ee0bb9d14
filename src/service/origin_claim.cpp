// SPDX-License-Identifier: Apache-2.0
// dyad.origin_claim (proto/origin_claim.hpp): a claim of an origin file is
// a record of this service under the file's key in the claims namespace
// (proto::claims_namespace). The store keeps a key for its first writer, so
// of several nodes claiming one file at once exactly one holds it; the
// others are told who does and wait for its publish (client/origin_claim.cpp).
#include <cerrno>

#include "common/json_text.hpp"
#include "common/keygen.hpp"
#include "common/paths.hpp"
#include "kvs/record.hpp"
#include "proto/origin_claim.hpp"
#include "handler.hpp"
#include "publisher.hpp"

namespace dyad::service {
namespace {
constexpr double kClaimStoreTimeout = 25.0;  // within the client's 30 s
}  // namespace

void Publisher::on_origin_claim(std::shared_ptr<rpc::Request> r) {
    auto req = proto::OriginClaimRequest::parse(r->args());
    if (!req) return r->fail(Status(DYAD_RC_BADUNPACK, req.status().message(), EINVAL));
    auto up = normalize_upath(req->upath);
    if (!up) return r->fail(up.status());
    const std::string ns = req->ns.value_or(core_.opts.ns);
    if (ns.empty() || ns == kServicesNamespace)
        return r->fail(
            Status(DYAD_RC_BADUNPACK, "claim in namespace '" + ns + "' refused", EINVAL));
    if (auto down = core_.store->down()) return r->fail(*down);
    asio::post(core_.files, [this, r, req = std::move(req.value()), up = up.value(), ns] {
        if (r->finished()) return;
        auto res = origin_claim(req, up, ns);
        asio::post(core_.io, [r, res] {
            if (res) return r->end(res->build());
            r->fail(res.status());
        });
    });
}

Result<proto::OriginClaimAnswer> Publisher::origin_claim(const proto::OriginClaimRequest& req,
                                                         const std::string& up,
                                                         const std::string& ns) {
    auto key =
        gen_path_key(up, static_cast<unsigned>(req.key_depth), static_cast<unsigned>(req.key_bins));
    if (!key) return key.status();
    const std::string cns = proto::claims_namespace(ns);
    const Deadline until = Deadline::after(kClaimStoreTimeout);
    proto::OriginClaimAnswer a;
    if (req.release) {
        // Only this service's own claim goes; one already gone is no error.
        Status s = core_.store->remove(cns, key.value(), core_.id, until);
        if (!s && s.rc() != DYAD_RC_NOTFOUND && s.rc() != DYAD_RC_NOAUTH)
            return Status(s).wrap("cannot release the claim of '" + up + "'");
        return a;
    }
    kvs::Record rec = own_record(up);  // (no file: no size, mtime, inode)
    auto v =
        core_.store->put(cns, key.value(), rec.to_json().dump(-1, ' ', false, kBadUtf8Replaced),
                         core_.id, req.takes, until);
    if (v) {
        a.held = true;
        a.holder = core_.id;
        a.version = v.value();
        return a;
    }
    if (v.status().err() != EEXIST) return Status(v.status()).wrap("cannot claim '" + up + "'");
    // Another service's claim: who holds it, and which version.
    auto e = core_.store->get(cns, key.value(), until);
    if (!e) return Status(e.status()).wrap("cannot read the claim of '" + up + "'");
    a.holder = proto::record_owner(e->value).value_or("");
    a.version = e->version;
    return a;
}

}  // namespace dyad::service
