// SPDX-License-Identifier: Apache-2.0
// Replicas, the owner's side of a push (replicas.hpp; docs/design.md,
// "Replicas"): the files waiting in the queue go to their holders in
// batches, one dyad.replicate_many per holder per round, so that a holder
// pulls many small files with one batched consume instead of one whole
// consume each.
#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "common/deadline.hpp"
#include "common/log.hpp"
#include "common/timeouts.hpp"
#include "replicas.hpp"

namespace dyad::service {
namespace {
constexpr const char* kSub = "replicas";
constexpr double kBytesPerSecond = 20e6;  // the slowest pull a deadline allows for
// How old the registry the owner places replicas by may be.
constexpr auto kRegistryAge = std::chrono::seconds(2);
// A job's services register while it starts (dyadd --store-late: each once
// its etcd answers, about 0.3-0.5 s in): within kStartGrace of this
// service's start, a file short of holders waits for more of them, the
// registry read again every kStartRetry, rather than being published with
// fewer replicas than asked.
constexpr auto kStartGrace = std::chrono::seconds(5);
constexpr auto kStartRetry = std::chrono::milliseconds(200);
}  // namespace

bool Replicas::fresh_services() {
    const auto now = std::chrono::steady_clock::now();
    if (!services_.empty() && now - services_at_ <= kRegistryAge) return true;
    auto fresh = hooks_.services();
    if (!fresh) {
        DYAD_WARN(kSub, "no replicas: the registry could not be read: %s",
                  fresh.status().to_string().c_str());
        return false;
    }
    services_ = std::move(fresh.value());
    services_at_ = now;
    return true;
}

void Replicas::place(const std::vector<Job>& jobs, std::vector<uint64_t>& copies,
                     std::vector<std::set<std::string>>& asked, std::vector<std::string>& why,
                     std::vector<size_t>& candidates) {
    std::vector<std::string> ids;
    for (const auto& [id, eps] : services_) ids.push_back(id);
    // Every other service in rendezvous order, per file: the first k that
    // take it. Each round asks every file's next candidate, grouped by
    // holder.
    std::vector<std::vector<std::string>> order(jobs.size());
    std::vector<size_t> next(jobs.size(), 0);
    for (size_t i = 0; i < jobs.size(); ++i) {
        order[i] = proto::replica_holders(jobs[i].key, ids, self_, ids.size());
        candidates[i] = order[i].size();
    }
    for (;;) {
        std::map<std::string, std::vector<size_t>> round;
        for (size_t i = 0; i < jobs.size(); ++i) {
            while (copies[i] < jobs[i].k && next[i] < order[i].size()) {
                const std::string& id = order[i][next[i]++];
                if (tcp_endpoint(services_[id]).empty() || !asked[i].insert(id).second) continue;
                round[id].push_back(i);
                break;
            }
        }
        if (round.empty()) break;
        for (const auto& [id, which] : round)
            ask_holder(id, tcp_endpoint(services_[id]), jobs, which, copies, why);
    }
}

std::vector<uint64_t> Replicas::push_batch(const std::vector<Job>& jobs) {
    std::vector<uint64_t> copies(jobs.size(), 0);
    if (!fresh_services()) {
        n_.push_failed += jobs.size();
        return copies;
    }
    std::vector<std::set<std::string>> asked(jobs.size());
    std::vector<std::string> why(jobs.size());
    std::vector<size_t> candidates(jobs.size(), 0);
    for (;;) {
        place(jobs, copies, asked, why, candidates);
        bool short_of = false;
        for (size_t i = 0; i < jobs.size(); ++i) short_of |= copies[i] < jobs[i].k;
        if (!short_of || std::chrono::steady_clock::now() + kStartRetry > born_ + kStartGrace)
            break;
        {
            std::unique_lock<std::mutex> lk(qmu_);
            if (qcv_.wait_for(lk, kStartRetry, [this] { return stopping_; })) break;
        }
        services_at_ = {};  // read the registry again
        if (!fresh_services()) break;
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
        const Job& j = jobs[i];
        if (copies[i] >= j.k) continue;
        n_.short_of_services++;
        DYAD_WARN(kSub,
                  "'%s' (generation %llu) has %llu of the %llu replicas asked for: %zu other "
                  "services are registered%s%s",
                  j.rec.upath.c_str(), static_cast<unsigned long long>(j.rec.generation),
                  static_cast<unsigned long long>(copies[i]), static_cast<unsigned long long>(j.k),
                  candidates[i], why[i].empty() ? "" : "; ", why[i].c_str());
    }
    return copies;
}

void Replicas::ask_holder(const std::string& id, const std::string& ep,
                          const std::vector<Job>& jobs, const std::vector<size_t>& which,
                          std::vector<uint64_t>& copies, std::vector<std::string>& why) {
    auto refused = [&](size_t i, const std::string& e) {
        n_.push_failed++;
        why[i] += (why[i].empty() ? "" : "; ") + id + ": " + e;
        DYAD_INFO(kSub, "%s did not take a replica of '%s': %s", id.c_str(),
                  jobs[i].rec.upath.c_str(), e.c_str());
    };
    auto took = [&](size_t i) {
        ++copies[i];
        n_.pushed++;
    };
    // One request per namespace and at most kMaxFiles files.
    for (size_t at = 0; at < which.size();) {
        proto::ReplicateBatch batch;
        batch.ns = jobs[which[at]].ns;
        std::vector<size_t> in;
        double timeout = timeouts::kAskReplica;
        for (; at < which.size() && in.size() < proto::ReplicateBatch::kMaxFiles &&
               jobs[which[at]].ns == batch.ns;
             ++at) {
            const Job& j = jobs[which[at]];
            batch.files.push_back({j.ns, j.key, j.rec.upath, j.rec.generation, j.rec.size});
            in.push_back(which[at]);
            timeout += static_cast<double>(j.rec.size) / kBytesPerSecond;
        }
        if (in.size() == 1) {
            // One file: dyad.replicate, which every holder knows.
            const size_t i = in.front();
            auto a = pool_.call(ep, "dyad.replicate", batch.files.front().build(),
                                Deadline::after(timeout));
            if (a && a->is_object() && a->value("holder", std::string()) == id)
                took(i);
            else
                refused(i, a ? std::string("an answer not naming it") : a.status().message());
            continue;
        }
        auto a = pool_.call(ep, "dyad.replicate_many", batch.build(), Deadline::after(timeout));
        auto answer = a ? proto::ReplicateBatchAnswer::parse(a.value(), in.size())
                        : Result<proto::ReplicateBatchAnswer>(a.status());
        if (!answer || answer->holder != id) {
            const std::string e = !answer ? answer.status().message() : "an answer not naming it";
            for (size_t i : in) refused(i, e);
            continue;
        }
        for (size_t n = 0; n < in.size(); ++n) {
            if (answer->files[n].held)
                took(in[n]);
            else
                refused(in[n], answer->files[n].error);
        }
    }
}

}  // namespace dyad::service
