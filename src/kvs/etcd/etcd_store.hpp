// SPDX-License-Identifier: Apache-2.0
// The etcd backend of the metadata store (dyadd --kvs etcd://HOST:PORT[,...]),
// over etcd's v3 gRPC API. Built into dyadd only: gRPC never enters
// libdyad.so, which is loaded into arbitrary programs.
//
// Key layout (docs/design.md, "Metadata on etcd"), under a root (/dyad):
//   <root>/ns/<ns>/files/<key>    a file's record (the DYAD key); its etcd
//                                 mod_revision is the file's generation
//   <root>/services/<id>          a service's registration, bound to the
//                                 service's lease (gone when it stops or dies)
//   <root>/ranks/by-id/<id>       the dense rank the store gave a service
//   <root>/ranks/claim/<n>        which service holds rank n
// <ns> and <id> are escaped (% and / as %25 and %2F), so no name can reach
// into another's keys.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kvs/etcd/etcd_security.hpp"
#include "kvs/service_store.hpp"

namespace dyad::kvs::etcd {

struct Options {
    std::vector<std::string> endpoints;  // HOST:PORT, in the order to try them
    double lease_ttl = 10;               // seconds (dyadd --lease-ttl)
    std::string root = "/dyad";
    StoreLimits limits;  // key and value sizes, records per namespace
    Security security;   // TLS and auth (the URI's parameters)
};

// "etcd://h1:p1,h2:p2[?PARAMS]" -> endpoints; errors name what is wrong.
Result<std::vector<std::string>> parse_uri(const std::string& uri);
// The URI's parameters (after '?': tls-ca=, tls-cert=, tls-key=, tls-name=,
// auth-user=, password-file=, managed-by=) into *s.
Status parse_uri_security(const std::string& uri, Security* s);

// Connects (waiting up to `connect` seconds for a first answer) and returns
// the store. Errors say which endpoints were tried.
Result<std::shared_ptr<ServiceStore>> connect(const Options& o, double connect_seconds);

// Escapes % and / of a namespace or service id for use in a key.
std::string escape(const std::string& s);

}  // namespace dyad::kvs::etcd
