// SPDX-License-Identifier: Apache-2.0
// The transport planner (planner.hpp): the transports to try for a file,
// best first, and those that could not start in this process.
#include "planner.hpp"

#include <new>

#include "common/log.hpp"

namespace dyad::client {
namespace {
constexpr const char* kSub = "client";
constexpr size_t kMaxPlans = 4096;
}  // namespace

std::vector<const dtl::Backend*> TransportPlanner::plan(const Record& rec, const ServiceInfo& svc,
                                                        ConsumeReport* rep) {
    if (fixed_) return {fixed_};
    const auto key = std::make_pair(rec.owner, rec.size);
    {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = plans_.find(key);
        if (it != plans_.end()) {
            rep->explain = it->second.explain;
            rep->selection = it->second.selection;
            return it->second.order;
        }
    }
    bool keep = false;
    std::vector<const dtl::Backend*> out = score(rec, svc, rep, &keep);
    if (keep) {
        std::lock_guard<std::mutex> lk(mu_);
        if (plans_.size() >= kMaxPlans) plans_.clear();
        plans_[key] = {out, rep->explain, rep->selection};
    }
    return out;
}

std::vector<const dtl::Backend*> TransportPlanner::score(const Record& rec, const ServiceInfo& svc,
                                                         ConsumeReport* rep, bool* keep) {
    std::vector<dtl::TransportRecord> records;
    dtl::Placement where;
    where.same_node = rec.node == svc.node;
    auto info = owners_.info(rec.owner, svc);
    if (info) {
        where.same_host =
            info->value("host_id", std::string()) == dtl::host_id() && !dtl::host_id().empty();
        if (info->contains("transports") && (*info)["transports"].is_array())
            for (const auto& t : (*info)["transports"]) {
                auto r = dtl::TransportRecord::from_json(t);
                if (r) records.push_back(std::move(r.value()));
            }
    }
    std::vector<std::string> mine;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (const auto& b : dtl::backends())
            if (!unusable_.count(b.name)) mine.push_back(b.name);
    }
    dtl::Selection sel = dtl::select_transport(rec.size, where, records, mine);
    rep->explain = sel.explain();
    if (!info) rep->explain += "\n  (owner's records unavailable: " + info.status().message() + ")";
    rep->selection = std::make_shared<const nlohmann::json>(sel.to_json());
    DYAD_DEBUG(kSub, "%s: %s", rec.upath.c_str(), rep->explain.c_str());
    std::vector<const dtl::Backend*> out;
    for (const auto& name : sel.order) {
        auto b = dtl::find_backend(name);
        if (b) out.push_back(b.value());
    }
    // Services that publish no records (older ones) all serve the stream.
    if (out.empty()) {
        const dtl::Backend& u = dtl::universal_backend();
        out.push_back(&u);
        rep->explain += "\n  no scored transport usable: " + u.name;
    }
    *keep = info.is_ok();
    return out;
}

void TransportPlanner::unusable(const dtl::Backend& b, const std::string& why) {
    if (fixed_) return;
    std::lock_guard<std::mutex> lk(mu_);
    if (unusable_.emplace(b.name, why).second)
        DYAD_WARN(kSub, "%s", dtl::left_out_message(b, why).c_str());
    plans_.clear();
}

void TransportPlanner::forget() {
    std::lock_guard<std::mutex> lk(mu_);
    plans_.clear();
}

void TransportPlanner::reset_after_fork() {
    new (&mu_) std::mutex();  // a parent thread may have held it at fork time
}

}  // namespace dyad::client
