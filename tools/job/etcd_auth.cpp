// SPDX-License-Identifier: Apache-2.0
// dyad-etcd-auth: the helper that turns the job's etcd auth on (root with
// the password derived from the job key, the root role, auth on) and ends
// once the job's etcd serves with it, or once this node's member is gone.
// node-up starts it detached on a member's node (start_etcd_auth) and does
// not wait for it. A program of its own so that `dyad`, which every job's
// prolog runs, links no gRPC: with the etcd client linked in, `dyad`
// started in 11.5 ms instead of 3.2 ms (docs/design.md, "A job's start with
// its own etcd"). The job key comes on standard input, never on the
// command line.
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "common/deadline.hpp"
#include "common/seconds.hpp"
#include "job/etcd.hpp"
#include "job/support.hpp"
#include "kvs/etcd/etcd_client.hpp"

namespace dyad::job::detail {
namespace {
namespace pb = kvs::etcd::pb;

// One round of enabling auth (root with the derived password, the root
// role, auth on). Errors are for the caller to try again: a member that
// enabled it meanwhile refuses the rest, which is fine.
void enable_auth(kvs::etcd::Client& c, const std::string& password, const Deadline& d) {
    auto ctx_for = [&](grpc::ClientContext* ctx) {
        kvs::etcd::Client::prepare(ctx, d.min(Deadline::after(2)));
    };
    {
        pb::AuthUserAddRequest q;
        q.set_name(kEtcdUser);
        q.set_password(password);
        pb::AuthUserAddResponse a;
        grpc::ClientContext ctx;
        ctx_for(&ctx);
        grpc::Status s = c.auth().UserAdd(&ctx, q, &a);
        if (!s.ok() && s.error_message().find("already exists") == std::string::npos) return;
    }
    {
        pb::AuthUserGrantRoleRequest q;
        q.set_user(kEtcdUser);
        q.set_role("root");
        pb::AuthUserGrantRoleResponse a;
        grpc::ClientContext ctx;
        ctx_for(&ctx);
        if (!c.auth().UserGrantRole(&ctx, q, &a).ok()) return;
    }
    pb::AuthEnableRequest q;
    pb::AuthEnableResponse a;
    grpc::ClientContext ctx;
    ctx_for(&ctx);
    (void)c.auth().AuthEnable(&ctx, q, &a);
}

// Process `pid` is this job's etcd member (not a recycled pid, not a zombie).
bool is_member(const std::string& dir, pid_t pid) {
    std::ifstream cmd("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
    std::string line((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    return line.find(dir + "/" + kEtcdData) != std::string::npos;
}

// Until the job's etcd has a leader and its auth on (this member enables
// it; idempotent), or `d`, or this node's member is gone (the job ended
// before its etcd served: the helper must not outlive it).
Status etcd_ready(const Options& o, const EtcdPlan& p, const std::string& key_hex, pid_t member,
                  const Deadline& d) {
    auto c = kvs::etcd::Client::open(etcd_endpoints(p), etcd_security(o));
    if (!c) return c.status();
    std::string password = derive_etcd_password(key_hex);
    std::string last;
    while (true) {
        pb::AuthenticateRequest q;
        q.set_name(kEtcdUser);
        q.set_password(password);
        pb::AuthenticateResponse a;
        grpc::ClientContext ctx;
        kvs::etcd::Client::prepare(&ctx, d.min(Deadline::after(0.25)));
        grpc::Status s = c.value()->auth().Authenticate(&ctx, q, &a);
        if (s.ok()) break;
        last = s.error_message();
        if (d.expired() || !is_member(o.dir, member)) {
            std::fill(password.begin(), password.end(), '\0');
            std::string on;
            for (size_t i = 0; i < p.members.size(); ++i) on += (i ? ", " : "") + p.members[i];
            return Status(DYAD_RC_TIMEOUT,
                          "the job's etcd (members on " + on + ") did not serve (" + last +
                              "); see " + kEtcdLog + " in the job directory of those nodes",
                          ETIMEDOUT);
        }
        if (p.me >= 0 && s.error_code() == grpc::StatusCode::FAILED_PRECONDITION)
            enable_auth(*c.value(), password, d);
        else
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::fill(password.begin(), password.end(), '\0');
    return Status::ok();
}

// The helper's life: until the job's etcd serves with its auth on, or this
// node's member is gone. Its exit code.
int enable_auth_until_served(const Options& o, const EtcdPlan& p, const std::string& key_hex,
                             pid_t member) {
    const auto t0 = std::chrono::steady_clock::now();
    for (double gap = 5;; gap = std::min(gap * 2, 600.0)) {
        Status s = etcd_ready(o, p, key_hex, member, Deadline::after(gap));
        if (s) {
            std::fprintf(stderr,
                         "%s: %s: the job's etcd serves, its auth on, %.3f s after this node's "
                         "member started\n",
                         g_cmd.c_str(), o.node.c_str(), seconds_since(t0));
            return 0;
        }
        if (!is_member(o.dir, member)) {
            std::fprintf(stderr,
                         "%s: %s: this node's etcd member (pid %d) is gone before the job's etcd "
                         "served (%s); see %s\n",
                         g_cmd.c_str(), o.node.c_str(), static_cast<int>(member),
                         s.message().c_str(), kEtcdLog);
            return 1;
        }
        std::fprintf(stderr, "%s: %s: the job's etcd does not serve yet after %.0f s (%s)\n",
                     g_cmd.c_str(), o.node.c_str(), seconds_since(t0), s.message().c_str());
    }
}

std::vector<std::string> split_commas(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream in(s);
    for (std::string part; std::getline(in, part, ',');)
        if (!part.empty()) out.push_back(part);
    return out;
}
}  // namespace
}  // namespace dyad::job::detail

int main(int argc, char** argv) {
    using namespace dyad::job;
    using namespace dyad::job::detail;
    g_cmd = "dyad-etcd-auth";
    Options o;
    EtcdPlan p;
    std::string members, addrs;
    int member = -1;
    CLI::App app{
        "Turns the job's etcd auth on (started by `dyad job node-up`; the job key on stdin)"};
    app.add_option("--dir", o.dir, "the node's job directory")->required();
    app.add_option("--node", o.node, "this node's name")->required();
    app.add_option("--members", members, "the members' node names, comma-separated")->required();
    app.add_option("--addrs", addrs, "their addresses, comma-separated")->required();
    app.add_option("--client-port", p.client_port, "the members' client port")->required();
    app.add_option("--me", p.me, "this node's index among the members")->required();
    app.add_option("--member", member, "this node's member's pid")->required();
    app.add_flag("--from-prolog", o.from_prolog, "run by the SPANK plugin's prolog");
    CLI11_PARSE(app, argc, argv);
    p.members = split_commas(members);
    p.addrs = split_commas(addrs);
    std::string key_hex;
    std::getline(std::cin, key_hex);
    if (p.addrs.empty() || p.addrs.size() != p.members.size() || key_hex.empty()) {
        std::fprintf(stderr,
                     "%s: --members and --addrs must name the same nodes, and the job key "
                     "come on standard input\n",
                     g_cmd.c_str());
        return 2;
    }
    return enable_auth_until_served(o, p, key_hex, static_cast<pid_t>(member));
}
