// SPDX-License-Identifier: Apache-2.0
#include "selector.hpp"

#include "dtl.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <fstream>

namespace dyad::dtl {
namespace {

bool reachable(const TransportRecord& r, const Placement& w, std::string* why) {
    if (r.reach == proto::kReachNode && !w.same_node) {
        *why = "needs the consumer on the owner's node";
        return false;
    }
    if (r.reach == proto::kReachHost && !w.same_host) {
        *why = "needs the consumer on the owner's machine";
        return false;
    }
    if (r.reach != proto::kReachNode && r.reach != proto::kReachHost &&
        r.reach != proto::kReachNetwork) {
        *why = "unknown reach '" + r.reach + "'";
        return false;
    }
    if (!(r.bandwidth_gbps > 0) || !(r.latency_us >= 0)) {
        *why = "no usable figures";
        return false;
    }
    return true;
}

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
    char buf[160];
    std::snprintf(buf, sizeof buf, f, a, b, c);
    return buf;
}

std::string sel_size_text(uint64_t size) {
    const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(size);
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        ++u;
    }
    char buf[48];
    if (u == 0)
        std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(size));
    else
        std::snprintf(buf, sizeof buf, "%.1f %s", v, unit[u]);
    return buf;
}

bool strcasecmp_ascii(const std::string& a, const std::string& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(a[i])) !=
            std::tolower(static_cast<unsigned char>(b[i])))
            return false;
    return true;
}

}  // namespace

Result<TransportRecord> TransportRecord::from_json(const nlohmann::json& j) {
    auto r = proto::TransportRecord::parse(j);
    if (!r) return r.status();
    TransportRecord out;
    static_cast<proto::TransportRecord&>(out) = std::move(r.value());
    return out;
}

double TransportRecord::estimate_us(uint64_t size) const {
    // bytes / (GB/s) = bytes / (1e3 bytes per microsecond * GB/s)
    return latency_us + static_cast<double>(size) / (bandwidth_gbps * 1e3);
}

Selection select_transport(uint64_t size, const Placement& where,
                           const std::vector<TransportRecord>& service,
                           const std::vector<std::string>& consumer) {
    Selection sel;
    sel.size = size;
    sel.size_class = size <= kSmallFile ? "small" : "large";
    for (const auto& r : service) {
        Scored s;
        s.name = r.name;
        s.reach = r.reach;
        if (std::find(consumer.begin(), consumer.end(), r.name) == consumer.end()) {
            s.why = "not available to this consumer";
        } else if (reachable(r, where, &s.why)) {
            s.eligible = true;
            s.estimate_us = r.estimate_us(size);
            s.why = fmt("%.0f us + size / %.2f GB/s", r.latency_us, r.bandwidth_gbps) +
                    (r.rma_native ? ", native RMA" : "") +
                    (r.detail.empty() ? "" : " (" + r.detail + ")");
        }
        sel.scored.push_back(std::move(s));
    }
    for (const auto& name : consumer)
        if (std::none_of(service.begin(), service.end(),
                         [&](const TransportRecord& r) { return r.name == name; })) {
            Scored s;
            s.name = name;
            s.why = "not offered by the owner's service";
            sel.scored.push_back(std::move(s));
        }
    // Eligible first, fastest first; ties within 1% by preference, then name
    // and reach, so the order never depends on the records' order.
    std::stable_sort(sel.scored.begin(), sel.scored.end(), [](const Scored& a, const Scored& b) {
        if (a.eligible != b.eligible) return a.eligible;
        if (!a.eligible) return a.name < b.name;
        double hi = std::max(a.estimate_us, b.estimate_us);
        if (std::fabs(a.estimate_us - b.estimate_us) > 0.01 * hi)
            return a.estimate_us < b.estimate_us;
        if (preference(a.name) != preference(b.name))
            return preference(a.name) < preference(b.name);
        if (a.name != b.name) return a.name < b.name;
        return a.reach < b.reach;
    });
    for (const auto& s : sel.scored)
        if (s.eligible && std::find(sel.order.begin(), sel.order.end(), s.name) == sel.order.end())
            sel.order.push_back(s.name);
    if (!sel.order.empty()) sel.chosen = sel.order.front();
    return sel;
}

std::string Selection::explain() const {
    std::string out = "transport for a " + sel_size_text(size) + " file (" + size_class +
                      "): " + (chosen.empty() ? std::string("none usable") : chosen);
    for (const auto& s : scored) {
        out += "\n  " + s.name + (s.reach.empty() ? "" : "@" + s.reach) + ": ";
        out +=
            s.eligible ? fmt("%.0f us estimated, ", s.estimate_us) + s.why : "left out, " + s.why;
    }
    return out;
}

nlohmann::json Selection::to_json() const {
    nlohmann::json c = nlohmann::json::array();
    for (const auto& s : scored) {
        nlohmann::json j = {{"name", s.name}, {"eligible", s.eligible}, {"why", s.why}};
        if (!s.reach.empty()) j["reach"] = s.reach;
        if (s.eligible) j["estimate_us"] = s.estimate_us;
        c.push_back(std::move(j));
    }
    return {{"chosen", chosen}, {"size", size}, {"class", size_class}, {"candidates", c}};
}

Status apply_figures(const std::string& spec, std::vector<TransportRecord>* records) {
    size_t pos = 0;
    while (pos < spec.size()) {
        size_t end = spec.find(',', pos);
        if (end == std::string::npos) end = spec.size();
        std::string item = spec.substr(pos, end - pos);
        pos = end + 1;
        if (item.empty()) continue;
        size_t eq = item.find('='), slash = item.find('/');
        auto bad = [&] {
            return Status(DYAD_RC_BAD_CLI_PARSE,
                          "DYAD_DTL_FIGURES item '" + item +
                              "' is not NAME[@reach]=LATENCY_US/BANDWIDTH_GBPS",
                          EINVAL);
        };
        if (eq == std::string::npos || slash == std::string::npos || slash < eq) return bad();
        std::string who = item.substr(0, eq), reach;
        if (size_t at = who.find('@'); at != std::string::npos) {
            reach = who.substr(at + 1);
            who = who.substr(0, at);
        }
        char* e1 = nullptr;
        char* e2 = nullptr;
        std::string lat_s = item.substr(eq + 1, slash - eq - 1), bw_s = item.substr(slash + 1);
        double lat = std::strtod(lat_s.c_str(), &e1), bw = std::strtod(bw_s.c_str(), &e2);
        if (lat_s.empty() || bw_s.empty() || *e1 || *e2 || !(lat >= 0) || !(bw > 0)) return bad();
        bool hit = false;
        for (auto& r : *records)
            if (strcasecmp_ascii(r.name, who) && (reach.empty() || r.reach == reach)) {
                r.latency_us = lat;
                r.bandwidth_gbps = bw;
                r.source = "configuration (DYAD_DTL_FIGURES)";
                hit = true;
            }
        if (!hit)
            return Status(DYAD_RC_BAD_CLI_PARSE,
                          "DYAD_DTL_FIGURES names '" + item.substr(0, eq) +
                              "', which this service does not offer",
                          EINVAL);
    }
    return Status::ok();
}

std::string host_id() {
    static const std::string id = [] {
        std::ifstream f("/proc/sys/kernel/random/boot_id");
        std::string s;
        std::getline(f, s);
        return s;
    }();
    return id;
}

}  // namespace dyad::dtl
