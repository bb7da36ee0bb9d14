// SPDX-License-Identifier: Apache-2.0
// Failover to replicas (docs/design.md, "Replicas"). A fetch goes to the
// record's owner; when the owner cannot be reached (gone, its lease run
// out, connection refused) or the transfer fails mid-way, the file is taken
// from a service holding a replica of the same generation: the holders'
// entries (proto/replica.hpp) are looked up in the store, those of another
// generation, size or mtime are skipped, and each holder is asked in turn
// with a replica fetch (it checks again that its copy is that generation).
// The copy is installed as the owner's (staging, END checksum, the record's
// stamp), so the wrapper, the C API, Python and the tool all fail over the
// same way: they share this fetch.
#include <cerrno>
#include <chrono>

#include "client.hpp"
#include "common/log.hpp"
#include "common/rate_limit.hpp"
#include "proto/replica.hpp"

namespace dyad::client {
namespace {
constexpr const char* kSub = "client";
constexpr double kListTimeout = 30.0;
// How long an owner that could not be reached is skipped (its files go to a
// replica first): a lost node does not cost one connect timeout per file.
constexpr auto kDownFor = std::chrono::seconds(5);
// Seconds the first connect to an owner may take before its replicas are
// tried (a cut-off owner does not refuse: its connect would wait 30 s).
constexpr double kQuickConnect = 2.0;

// Failures a replica can remedy: the owner unreachable, the transfer cut or
// corrupted. Not: the file changed (ESTALE: produced again, looked up
// again), refusals (not produced, not permitted), this node's own I/O.
bool fails_over(const Status& s) {
    if (s.err() == ESTALE) return false;
    switch (s.rc()) {
        case DYAD_RC_CONNFAIL:
        case DYAD_RC_BADFETCH:
        case DYAD_RC_BADCHECKSUM:
        case DYAD_RC_TIMEOUT:
        case DYAD_RC_UCXWAIT_FAIL:
        case DYAD_RC_UCXEP_FAIL:
        case DYAD_RC_UCXCOMM_FAIL:
            return true;
        default:
            return false;
    }
}

log::RateLimit& failover_log() {
    static log::RateLimit limit(kSub, "failovers to replicas");
    return limit;
}
}  // namespace

bool Client::owner_down(const std::string& owner) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = down_.find(owner);
    if (it == down_.end()) return false;
    if (std::chrono::steady_clock::now() - it->second < kDownFor) return true;
    down_.erase(it);
    return false;
}

void Client::note_owner_down(const std::string& owner) {
    std::lock_guard<std::mutex> lk(mu_);
    if (down_.size() >= 4096) down_.clear();
    down_[owner] = std::chrono::steady_clock::now();
}

Status Client::fetch(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                     ConsumeReport* rep, int lock_fd) {
    if (is_origin(rec)) return read_through(upath, rec, svc, rep, lock_fd);
    if (cfg_.replica_failover && owner_down(rec.owner)) {
        Status why(DYAD_RC_CONNFAIL,
                   "the service " + rec.owner + " that owns '" + upath +
                       "' could not be reached a moment ago",
                   EHOSTUNREACH);
        Status r = fetch_replica(upath, rec, svc, rep, lock_fd, why);
        if (r) return r;
        // No replica served it: the owner after all (it may be back).
        Status s = fetch_owner(upath, rec, svc, rep, lock_fd);
        if (!s && s.rc() == DYAD_RC_CONNFAIL) note_owner_down(rec.owner);
        return s ? s : Status(s.rc(), s.message() + "; " + r.message(), s.err());
    }
    if (!cfg_.replica_failover) return fetch_owner(upath, rec, svc, rep, lock_fd);
    // An owner cut off (its link down) does not refuse: its connect would
    // wait 30 s. The first attempt waits kQuickConnect, then a replica; with
    // none, the owner again with the usual deadline.
    const auto t0 = std::chrono::steady_clock::now();
    Status s;
    {
        const double before = t_connect_limit;
        t_connect_limit = kQuickConnect;
        s = fetch_owner(upath, rec, svc, rep, lock_fd);
        t_connect_limit = before;
    }
    if (s || !fails_over(s)) return s;
    if (s.rc() == DYAD_RC_CONNFAIL) note_owner_down(rec.owner);
    Status r = fetch_replica(upath, rec, svc, rep, lock_fd, s);
    if (r || s.rc() != DYAD_RC_CONNFAIL ||
        std::chrono::steady_clock::now() - t0 < std::chrono::duration<double>(kQuickConnect * 0.9))
        return r;
    Status again = fetch_owner(upath, rec, svc, rep, lock_fd);
    return again ? again : Status(again.rc(), again.message() + "; " + r.message(), again.err());
}

Result<std::vector<proto::ReplicaEntry>> Client::replicas(const std::string& upath,
                                                          const Record& rec) {
    auto svc = service();
    if (!svc) return svc.status();
    return replicas(upath, rec, svc.value());
}

Result<std::vector<proto::ReplicaEntry>> Client::replicas(const std::string& upath,
                                                          const Record& rec,
                                                          const ServiceInfo& svc) {
    auto st = store();
    if (!st) return st.status();
    auto page = st.value()->list_page(proto::replica_namespace(ns(svc)),
                                      proto::replica_prefix(key_of(upath)), "", 0,
                                      Deadline::after(kListTimeout));
    if (!page) return page.status();
    std::vector<proto::ReplicaEntry> out;
    for (const auto& entry : page->entries) {
        auto r = proto::ReplicaEntry::parse(entry.second.value);
        // Only a copy of this very produce: the owner's generation, size
        // and mtime (the holder checks the generation again when serving).
        if (!r || r->upath != upath || r->of != rec.owner || r->holder == rec.owner ||
            r->generation != rec.generation || r->size != rec.size || r->mtime_ns != rec.mtime_ns)
            continue;
        out.push_back(std::move(r.value()));
    }
    return out;
}

Status Client::fetch_replica(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                             ConsumeReport* rep, int lock_fd, const Status& why) {
    auto found = replicas(upath, rec, svc);
    if (!found)
        return Status(why.rc(),
                      why.message() + "; no replica looked up: " + found.status().message(),
                      why.err());
    std::string tried;
    const std::string& gen = std::to_string(rec.generation);
    for (const auto& replica : found.value()) {
        const proto::ReplicaEntry* r = &replica;
        Record from = rec;
        from.owner = r->holder;
        from.node = r->node;
        from.endpoints = r->endpoints;
        const std::string ep = owner_endpoint(from, svc);
        if (ep.empty()) continue;
        proto::FetchRequest req = request_of(upath, rec, ns(svc));
        req.replica = true;
        const dtl::Backend& b = dtl::universal_backend();
        rep->transport = b.name;
        Status s = stage_commit(upath, rec, lock_fd, rep, [&](FileSink& sink) {
            bool retry = false;
            return receive_via(
                b, req, from, ep, sink, [&sink] { return sink.bytes(); }, &retry);
        });
        if (s) {
            rep->endpoint = ep;
            rep->explain += "\n  failover: " + why.message() + "; fetched generation " + gen +
                            " from the replica on " + r->holder + " (" + ep + ")";
            if (failover_log().allow())
                DYAD_WARN(kSub, "'%s': the owner %s failed (%s): fetched from the replica on %s",
                          upath.c_str(), rec.owner.c_str(), why.message().c_str(),
                          r->holder.c_str());
            return s;
        }
        tried += (tried.empty() ? "" : "; ") + r->holder + ": " + s.message();
    }
    if (tried.empty())
        return Status(why.rc(),
                      why.message() + "; no replica of generation " + gen + " is recorded",
                      why.err());
    return Status(why.rc(), why.message() + "; its replicas failed too (" + tried + ")", why.err());
}

}  // namespace dyad::client
