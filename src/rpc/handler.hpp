// SPDX-License-Identifier: Apache-2.0
// The one preamble of a request handler (the service's parts, the store's
// topics): the request's arguments as the message M (M::parse, which checks
// every field), or the request answered with why not (EINVAL,
// DYAD_RC_BADUNPACK: arguments it cannot be served with) and nullopt.
//
//     auto a = rpc::args_as<proto::kvs::PutArgs>(*r);
//     if (!a) return;
#pragma once

#include <cerrno>
#include <optional>
#include <utility>

#include "rpc/server.hpp"

namespace dyad::rpc {

template <typename M>
std::optional<M> args_as(Request& r) {
    auto m = M::parse(r.args());
    if (m) return std::move(m.value());
    r.error(EINVAL, m.status().message(), DYAD_RC_BADUNPACK);
    return std::nullopt;
}

}  // namespace dyad::rpc
