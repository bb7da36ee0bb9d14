// SPDX-License-Identifier: Apache-2.0
#include "job/slurm_conf.hpp"

#include <strings.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <vector>

#include "job/hostlist.hpp"

namespace dyad::job {
namespace {

constexpr int kMaxDepth = 8;

std::string lower(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

// "Key=Value" words of a line (a value may be quoted), keys lowercased.
std::vector<std::pair<std::string, std::string>> words(const std::string& line) {
    std::vector<std::pair<std::string, std::string>> out;
    std::string cur;
    bool quoted = false;
    auto flush = [&] {
        size_t eq = cur.find('=');
        if (eq != std::string::npos) out.emplace_back(lower(cur.substr(0, eq)), cur.substr(eq + 1));
        cur.clear();
    };
    for (char c : line) {
        if (c == '"') {
            quoted = !quoted;
        } else if (!quoted && (c == ' ' || c == '\t')) {
            flush();
        } else {
            cur += c;
        }
    }
    flush();
    return out;
}

Status node_line(const std::string& path, const std::vector<std::pair<std::string, std::string>>& w,
                 SlurmConf* conf) {
    std::string names, addrs, hostnames;
    for (const auto& [k, v] : w) {
        if (k == "nodename") names = v;
        if (k == "nodeaddr") addrs = v;
        if (k == "nodehostname") hostnames = v;
    }
    if (names.empty() || strcasecmp(names.c_str(), "DEFAULT") == 0) return Status::ok();
    auto n = expand_hostlist(names);
    if (!n) return Status(n.status()).wrap(path + ": NodeName=" + names);
    std::string given = !addrs.empty() ? addrs : hostnames;
    std::vector<std::string> a;
    if (!given.empty()) {
        auto e = expand_hostlist(given);
        if (!e) return Status(e.status()).wrap(path + ": NodeAddr=" + given);
        a = std::move(e.value());
        if (a.size() != n->size())
            return Status(DYAD_RC_BAD_CLI_PARSE,
                          path + ": NodeName=" + names + " names " + std::to_string(n->size()) +
                              " nodes but its NodeAddr " + std::to_string(a.size()),
                          EINVAL);
    }
    for (size_t i = 0; i < n->size(); ++i) conf->node_addr[(*n)[i]] = a.empty() ? (*n)[i] : a[i];
    return Status::ok();
}

Status read_into(const std::string& path, SlurmConf* conf, int depth) {
    if (depth > kMaxDepth)
        return Status(DYAD_RC_BAD_CLI_PARSE, path + ": Include nested too deep", ELOOP);
    std::ifstream in(path);
    if (!in) return Status(DYAD_RC_SYSFAIL, "cannot read Slurm's configuration " + path, errno);
    const std::string dir = path.substr(0, path.rfind('/') + 1);
    std::string line;
    while (std::getline(in, line)) {
        if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
        std::istringstream ls(line);
        std::string first;
        if (!(ls >> first)) continue;
        if (strcasecmp(first.c_str(), "include") == 0) {
            std::string inc;
            ls >> inc;
            if (inc.empty()) continue;
            if (inc.front() != '/') inc = dir + inc;
            if (Status s = read_into(inc, conf, depth + 1); !s) return s;
            continue;
        }
        auto w = words(line);
        if (w.empty()) continue;
        if (w.front().first == "nodename") {
            if (Status s = node_line(path, w, conf); !s) return s;
        } else {
            for (const auto& [k, v] : w)
                if (k == "prologflags") conf->prolog_flags = v;
        }
    }
    return Status::ok();
}

}  // namespace

bool SlurmConf::prolog_alloc() const {
    std::stringstream ss(lower(prolog_flags));
    std::string f;
    while (std::getline(ss, f, ','))
        if (f == "alloc" || f == "contain") return true;
    return false;
}

Result<SlurmConf> read_slurm_conf(const std::string& path) {
    SlurmConf conf;
    conf.path = path;
    if (Status s = read_into(path, &conf, 0); !s) return s;
    return conf;
}

}  // namespace dyad::job
