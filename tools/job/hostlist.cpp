// SPDX-License-Identifier: Apache-2.0
#include "job/hostlist.hpp"

#include <cerrno>
#include <fstream>
#include <set>
#include <sstream>

namespace dyad::job {
namespace {

constexpr size_t kMaxHosts = 100000;

Status bad(const std::string& expr, const std::string& why) {
    return Status(DYAD_RC_BAD_CLI_PARSE, "hostlist '" + expr + "': " + why, EINVAL);
}

bool all_digits(const std::string& s) {
    if (s.empty()) return false;
    for (char c : s)
        if (c < '0' || c > '9') return false;
    return true;
}

// "1-3,07" -> {"1","2","3","07"}
Status expand_range(const std::string& expr, const std::string& body,
                    std::vector<std::string>* out) {
    std::stringstream ss(body);
    std::string part;
    bool any = false;
    while (std::getline(ss, part, ',')) {
        any = true;
        size_t dash = part.find('-');
        std::string lo = part.substr(0, dash);
        std::string hi = dash == std::string::npos ? lo : part.substr(dash + 1);
        if (!all_digits(lo) || !all_digits(hi) || lo.size() > 18 || hi.size() > 18)
            return bad(expr, "'" + part + "' is not a number or a range A-B");
        unsigned long long a = std::stoull(lo), b = std::stoull(hi);
        if (b < a) return bad(expr, "range '" + part + "' ends before it starts");
        if (b - a >= kMaxHosts) return bad(expr, "range '" + part + "' is too long");
        size_t width = lo.size() > 1 && lo[0] == '0' ? lo.size() : 0;
        for (unsigned long long v = a; v <= b; ++v) {
            std::string n = std::to_string(v);
            if (n.size() < width) n.insert(0, width - n.size(), '0');
            out->push_back(n);
        }
    }
    if (!any) return bad(expr, "empty brackets");
    return Status::ok();
}

// One expression without top-level commas: "r[1-2]n[1,3]x".
Status expand_one(const std::string& expr, const std::string& one, std::vector<std::string>* out) {
    std::vector<std::string> acc{""};
    size_t i = 0;
    while (i < one.size()) {
        size_t open = one.find('[', i);
        std::string lit = one.substr(i, open == std::string::npos ? std::string::npos : open - i);
        if (lit.find(']') != std::string::npos) return bad(expr, "']' without '['");
        for (auto& a : acc) a += lit;
        if (open == std::string::npos) break;
        size_t close = one.find(']', open);
        if (close == std::string::npos) return bad(expr, "'[' without ']'");
        std::vector<std::string> values;
        if (Status s = expand_range(expr, one.substr(open + 1, close - open - 1), &values); !s)
            return s;
        if (acc.size() * values.size() > kMaxHosts) return bad(expr, "more than 100000 hosts");
        std::vector<std::string> next;
        next.reserve(acc.size() * values.size());
        for (const auto& a : acc)
            for (const auto& v : values) next.push_back(a + v);
        acc = std::move(next);
        i = close + 1;
    }
    for (auto& a : acc) out->push_back(std::move(a));
    return Status::ok();
}

std::vector<std::string> unique(std::vector<std::string> v) {
    std::set<std::string> seen;
    std::vector<std::string> out;
    for (auto& h : v)
        if (seen.insert(h).second) out.push_back(std::move(h));
    return out;
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(const std::string& expr) {
    std::vector<std::string> hosts;
    std::string cur;
    int depth = 0;
    auto flush = [&]() -> Status {
        if (cur.empty()) return Status::ok();
        Status s = expand_one(expr, cur, &hosts);
        cur.clear();
        if (s && hosts.size() > kMaxHosts) return bad(expr, "more than 100000 hosts");
        return s;
    };
    for (char c : expr) {
        if (c == '[') ++depth;
        if (c == ']') --depth;
        if (depth < 0) return bad(expr, "']' without '['");
        if (depth == 0 && (c == ',' || c == ' ' || c == '\n' || c == '\t')) {
            if (Status s = flush(); !s) return s;
            continue;
        }
        cur += c;
    }
    if (depth != 0) return bad(expr, "'[' without ']'");
    if (Status s = flush(); !s) return s;
    if (hosts.empty()) return bad(expr, "no host");
    return unique(std::move(hosts));
}

Result<std::vector<std::string>> read_hostfile(const std::string& path) {
    std::ifstream in(path);
    if (!in)
        return Status(DYAD_RC_BAD_CLI_PARSE, "cannot read host file " + path,
                      errno ? errno : ENOENT);
    std::vector<std::string> hosts;
    std::string line;
    while (std::getline(in, line)) {
        size_t hash = line.find('#');
        if (hash != std::string::npos) line.erase(hash);
        std::stringstream ss(line);
        std::string word;
        if (ss >> word) hosts.push_back(word);
    }
    if (hosts.empty())
        return Status(DYAD_RC_BAD_CLI_PARSE, "host file " + path + " names no host", EINVAL);
    return unique(std::move(hosts));
}

}  // namespace dyad::job
