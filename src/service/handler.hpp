// SPDX-License-Identifier: Apache-2.0
// The preamble every request handler of the service's parts shares: the
// request's arguments as the message M (rpc::args_as, rpc/handler.hpp: every field
// checked), its path (M::upath) normalized (normalize_upath). On failure
// the request is answered at once and nullopt comes back:
//
//     auto req = take_args<proto::PublishRequest>(*r);
//     if (!req) return;
#pragma once

#include <optional>

#include "common/paths.hpp"
#include "rpc/handler.hpp"
#include "rpc/server.hpp"

namespace dyad::service {

template <typename M>
std::optional<M> take_args(rpc::Request& r) {
    auto m = rpc::args_as<M>(r);
    if (!m) return std::nullopt;
    auto up = normalize_upath(m->upath);
    if (!up) {
        r.fail(up.status());
        return std::nullopt;
    }
    m->upath = std::move(up.value());
    return m;
}

// Requests only another service makes (proving it with the job's key):
// that service's id, or the request answered EPERM and "".
std::string from_other_service(rpc::Request& r, const std::string& self);

}  // namespace dyad::service
