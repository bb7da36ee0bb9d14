// SPDX-License-Identifier: Apache-2.0
// `dyad doctor` inside a --dyad job: asks the dyadd of every node of the
// job (reached as `dyad job node-up` placed it: the node's address, the
// job's ports derived from its key) which metadata store it uses, and fails
// when they differ (issue 46, item 5): a node with a store of its own never
// sees the others' files, and its consumers wait until the time limit.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "common/auth.hpp"
#include "doctor_site.hpp"
#include "job/hostlist.hpp"
#include "job/slurm_conf.hpp"
#include "job/support.hpp"
#include "proto/identity.hpp"
#include "rpc/client.hpp"

namespace dyad::tools {
namespace {
using V = Finding::Verdict;

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

// What identifies a store across nodes: the dyad store's endpoint (its
// host's TCP endpoint, as its users name it), or etcd's members, sorted.
std::string store_of(const nlohmann::json& status) {
    auto it = status.find("metadata_store");
    if (it == status.end() || !it->is_object()) return "";
    const std::string backend = it->value("backend", std::string());
    const std::string ep = it->value("endpoint", std::string());
    if (backend != "etcd") return "dyad store at " + ep;
    std::vector<std::string> members;
    for (size_t pos = 0; pos <= ep.size();) {
        size_t comma = ep.find(',', pos);
        if (comma == std::string::npos) comma = ep.size();
        if (comma > pos) members.push_back(ep.substr(pos, comma - pos));
        pos = comma + 1;
    }
    std::sort(members.begin(), members.end());
    std::string out = "etcd at ";
    for (size_t i = 0; i < members.size(); ++i) out += (i ? "," : "") + members[i];
    return out;
}

// The store node `node`'s dyadd uses, asked on the job's ports; "" and
// *why when no dyadd of this job answers there.
std::string ask(const std::string& node, const job::SlurmConf* sc,
                const std::vector<unsigned>& ports, const rpc::Credentials& creds,
                std::string* why) {
    auto addr = job::detail::node_address(node, sc);
    if (!addr) {
        *why = addr.status().message();
        return "";
    }
    for (unsigned port : ports) {
        const std::string uri = "tcp://" + addr.value() + ":" + std::to_string(port);
        // A port nobody listens on is refused at once; a dyadd answering
        // a hello on a loaded node may take a while (it was 1 s: too short).
        auto c = rpc::Connection::connect(uri, Deadline::after(3), creds);
        if (!c) {
            *why = c.status().message();
            continue;
        }
        auto id = proto::Identity::parse(c.value()->peer_info());
        if (!id || id->node != node) continue;  // another node's (or not a dyadd)
        auto st = c.value()->call("dyad.status", nlohmann::json::object(), Deadline::after(5));
        if (!st) {
            *why = uri + ": " + st.status().message();
            return "";
        }
        return store_of(st.value());
    }
    if (why->empty())
        *why = "no dyadd of this job answers on " + addr.value() + " (the job's ports)";
    return "";
}
}  // namespace

std::vector<Finding> job_store_findings() {
    std::vector<Finding> f;
    const std::string nodelist = env("SLURM_JOB_NODELIST"), key_path = env("DYAD_AUTH_KEY_FILE");
    if (env("DYAD_JOB_MANAGER") != "slurm" || nodelist.empty() || key_path.empty()) return f;
    auto nodes = job::expand_hostlist(nodelist);
    auto key = auth::Key::load(key_path);
    std::ifstream kf(key_path);
    std::string key_hex;
    kf >> key_hex;
    if (!nodes || !key) return f;  // (the key's own check says why)
    const std::string conf = find_slurm_conf("");
    std::optional<job::SlurmConf> sc;
    if (!conf.empty())
        if (auto r = job::read_slurm_conf(conf)) sc = std::move(r.value());
    job::Options o;
    std::string read;
    if (PlugstackEntry e; !conf.empty() && find_plugstack_entry(conf, &e, &read)) {
        if (e.args.count("ports")) o.ports = e.args.at("ports");
        if (e.args.count("port"))
            o.port = static_cast<unsigned>(std::strtoul(e.args.at("port").c_str(), nullptr, 10));
    }
    auto ports = job::detail::candidate_ports(o, key_hex);
    if (!ports) return f;
    rpc::Credentials creds;
    creds.key = key.value();
    std::map<std::string, std::vector<std::string>> by_store;
    std::string unasked;
    for (const auto& node : nodes.value()) {
        std::string why;
        std::string store = ask(node, sc ? &*sc : nullptr, ports.value(), creds, &why);
        if (store.empty())
            unasked += (unasked.empty() ? "" : "; ") + node + ": " + why;
        else
            by_store[store].push_back(node);
    }
    if (!unasked.empty()) f.push_back({"job's stores", V::warn, "could not ask " + unasked, ""});
    if (by_store.size() == 1)
        f.push_back({"job's stores", V::ok,
                     "every node's dyadd (" + std::to_string(by_store.begin()->second.size()) +
                         ") uses the same metadata store: " + by_store.begin()->first,
                     ""});
    if (by_store.size() > 1) {
        std::string split;
        for (const auto& [store, which] : by_store) {
            std::string list;
            for (const auto& n : which) list += (list.empty() ? "" : ",") + n;
            split += (split.empty() ? "" : "; ") + list + " use " + store;
        }
        f.push_back({"job's stores", V::fail,
                     "the nodes' dyadds use different metadata stores (" + split +
                         "): files produced under one store are never seen under another, and "
                         "their consumers wait",
                     "the job prolog must start DYAD on every node at allocation: ask the "
                     "administrators to set PrologFlags=Alloc (`dyad doctor --site` on a node "
                     "checks it), then submit the job again"});
    }
    return f;
}

}  // namespace dyad::tools
