// SPDX-License-Identifier: Apache-2.0
// What a service says in its hello once it admits a peer (docs/wire-protocol.md,
// section 4: "hello {identity, "auth": ...}"): its identity (identity.hpp)
// and its authentication scheme. The client reads its node's service from
// it (where the store is, the namespace, the producer directory); a service
// that probes another reads whom it reached. And what a dyadd writes in the
// lock file of its producer directory: who holds it.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.hpp"
#include "proto/identity.hpp"

namespace dyad::proto {

// The value of Identity::kvs that says "ask me": the service serves the
// store's topics itself (its own embedded store, or its connection to the
// store's host or etcd).
inline constexpr const char* kStoreHere = "local";

struct Hello {
    Identity service;  // service_id and endpoints required; the rest as far as present

    // Whether the service's clients ask it for the store (kStoreHere).
    bool store_here() const { return service.kvs.empty() || service.kvs == kStoreHere; }

    nlohmann::json build() const { return service.build(); }
    // The hello's meta of an admitted connection. Absent fields read as an
    // older service left them out: namespace kDefaultNamespace (common/config.hpp), kvs
    // kStoreHere. Anything of the wrong type fails the parse, naming it.
    static Result<Hello> parse(const nlohmann::json& j);
};

// The lock file of a producer directory (<dir>/.dyad/service.lock): the
// service that holds it and its pid.
struct DirHolder {
    std::string service_id;
    int64_t pid = 0;
    nlohmann::json build() const;
    // Both fields required (a file another program wrote, or a torn one,
    // fails the parse: the holder is then "another dyadd").
    static Result<DirHolder> parse(const nlohmann::json& j);
};

}  // namespace dyad::proto
