// SPDX-License-Identifier: Apache-2.0
// The transport planner: which transports to try for a file, best first.
// A fixed DYAD_DTL_MODE is the one; AUTO scores every transport that can
// reach the owner (dtl::select_transport) from its registry entry, leaves
// out those that could not start in this process, and remembers its
// choice per (owner, size): many files of one size from one owner are
// chosen for once (the scores' arithmetic and the explanation's formatting
// cost as much as a small file's transfer).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dtl/dtl.hpp"
#include "owners.hpp"
#include "record.hpp"
#include "report.hpp"

namespace dyad::client {

class TransportPlanner {
  public:
    // `fixed`: the fixed mode's transport; null for AUTO.
    TransportPlanner(const dtl::Backend* fixed, OwnerDirectory& owners)
        : fixed_(fixed), owners_(owners) {}

    const dtl::Backend* fixed() const { return fixed_; }
    // The transports to try for this file, best first (AUTO: why, in *rep).
    std::vector<const dtl::Backend*> plan(const Record& rec, const ServiceInfo& svc,
                                          ConsumeReport* rep);
    // AUTO: `b` cannot work in this process (`why`: its setup's error): left
    // out from now on, said once.
    void unusable(const dtl::Backend& b, const std::string& why);
    // What an owner offers changed (it left the registry): choose again.
    void forget();
    void reset_after_fork();

  private:
    struct Plan {
        std::vector<const dtl::Backend*> order;
        std::string explain;
        std::shared_ptr<const nlohmann::json> selection;
    };
    // AUTO's choice, scored now.
    std::vector<const dtl::Backend*> score(const Record& rec, const ServiceInfo& svc,
                                           ConsumeReport* rep, bool* keep);

    const dtl::Backend* const fixed_;
    OwnerDirectory& owners_;
    std::mutex mu_;
    std::map<std::string, std::string> unusable_;  // transport -> why (under mu_)
    // Under mu_; emptied when an owner leaves or a transport is left out.
    std::map<std::pair<std::string, uint64_t>, Plan> plans_;
};

}  // namespace dyad::client
