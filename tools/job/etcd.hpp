// SPDX-License-Identifier: Apache-2.0
// A job's own etcd (docs/user-guide.md, "The job's metadata store"): with 3
// nodes or more, the job's first three nodes each run an etcd member next
// to their dyadd, in the job directory, as the job's user; every dyadd of
// the job keeps its metadata there and fails over between the members, so
// the job survives the loss of any one node. Mutual TLS with certificates
// derived from the job key on the client and the peer port, etcd's
// password auth with a password derived from it, ports derived from it.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/deadline.hpp"
#include "common/status.hpp"
#include "job/job.hpp"
#include "kvs/etcd/etcd_security.hpp"
#include "job/slurm_conf.hpp"

namespace dyad::job::detail {

inline constexpr const char* kEtcdServerName = "dyad-job-etcd";
inline constexpr const char* kEtcdUser = "root";
inline constexpr size_t kEtcdMembers = 3;
// In the job directory.
inline constexpr const char* kEtcdData = "etcd";
inline constexpr const char* kEtcdLog = "etcd.log";
inline constexpr const char* kEtcdPid = "etcd.pid";
inline constexpr const char* kEtcdAuthPid = "etcd-auth.pid";
// The process that starts this node's member once the prolog is over (its
// comm, and its pid's file).
inline constexpr const char* kEtcdStarter = "dyad-etcd-start";
inline constexpr const char* kEtcdStarterPid = "etcd-start.pid";
inline constexpr const char* kEtcdTls = "etcd-tls";
inline constexpr const char* kEtcdPassword = "etcd.password";

struct TlsFiles {
    std::string ca, cert, key;  // PEM
};
// The job's CA (derived from the key: the same on every node) and this
// node's certificate and key, for `addr` (this node's address).
Result<TlsFiles> derive_tls(const std::string& key_hex, const std::string& node,
                            const std::string& addr);
// etcd's root password of the job (hex of a MAC of the job key).
std::string derive_etcd_password(const std::string& key_hex);

struct EtcdPlan {
    std::vector<std::string> members;  // node names
    std::vector<std::string> addrs;    // their addresses
    unsigned client_port = 0, peer_port = 0;
    int me = -1;  // this node's index among the members, -1: not one
};

// The job's own etcd, if it has one: --store etcd, or auto with 3 nodes or
// more and no --kvs. `nodes`: the job's nodes in order.
Result<std::optional<EtcdPlan>> etcd_plan(const Options& o, const std::vector<std::string>& nodes,
                                          const std::string& key_hex, const SlurmConf* sc);
// Writes the TLS files and the password into the job directory.
Status write_etcd_files(const Options& o, const std::string& key_hex, const std::string& addr);
// Starts this node's member (detached). Its pid, or why not (then the job
// goes on with the other two: the logs say why).
Result<pid_t> start_etcd_member(const Options& o, const EtcdPlan& p, const std::string& key_hex);
// The job's etcd client settings (TLS files, user, password file) and its
// members' client endpoints (dyadd's --kvs, the auth helper).
kvs::etcd::Security etcd_security(const Options& o);
std::vector<std::string> etcd_endpoints(const EtcdPlan& p);
// On a member's node: the helper that turns the job's etcd auth on
// (dyad-etcd-auth, beside this program: job/etcd_auth.cpp, the key on its
// stdin), detached (its lines to `log`, its pid in the job directory):
// node-up does not wait for the election; the job's dyadds are ready before
// their store answers (dyadd --store-late). It ends once the job's etcd
// serves, or once this node's member (`member`) is gone; stop_etcd ends it.
Status start_etcd_auth(const Options& o, const EtcdPlan& p, const std::string& key_hex,
                       pid_t member, const std::string& log);
// This node's member (our child) ended by `d` (at once: only whether it has):
// an error when etcd cannot run at all, else said on stderr (the job goes on
// with the other two members; member_ended).
Status check_member(const Options& o, pid_t member, const Deadline& d);
// dyadd's --kvs for the job's etcd.
std::string etcd_kvs_uri(const Options& o, const EtcdPlan& p);
// Stops this node's member and its auth helper (node-down): SIGTERM, SIGKILL after `timeout`
// seconds (at once with 0); false when it does not end.
bool stop_etcd(const std::string& dir, double timeout);

}  // namespace dyad::job::detail
