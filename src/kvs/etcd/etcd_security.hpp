// SPDX-License-Identifier: Apache-2.0
// TLS and auth of an etcd connection, from the parameters of an etcd:// URI
// (no gRPC here: dyadd's option parsing includes it).
#pragma once

#include <string>

#include "common/status.hpp"

namespace dyad::kvs::etcd {

// How to talk to etcd beyond plain gRPC (etcd://...?tls-ca=...&tls-cert=...).
struct Security {
    std::string ca_file, cert_file, key_file;  // TLS: all three, or none
    std::string server_name;          // the name the members' certificates carry (else the address)
    std::string user, password_file;  // etcd auth (TLS required: no password in clear)
    // Whose etcd it is, for what to do when it is unreachable: "" (a site's),
    // "slurm" (the job's own, started by the SPANK plugin), "job" (by `dyad
    // job start`).
    std::string owner;
    bool tls() const { return !ca_file.empty(); }
};

// The parameters after '?' of an etcd:// URI: tls-ca=, tls-cert=, tls-key=,
// tls-name=, auth-user=, password-file=, managed-by= ('&' between them).
Status parse_security(const std::string& query, Security* s);

}  // namespace dyad::kvs::etcd
