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

#include "fetcher.hpp"
#include "common/log.hpp"
#include "common/rate_limit.hpp"
#include "proto/replica.hpp"

namespace dyad::client {
namespace {
constexpr const char* kSub = "client";

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

Status Fetcher::fetch(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                      ConsumeReport* rep, int lock_fd) {
    if (!p_.cfg.replica_failover)
        return from_source(upath, rec, Source::owner(rec, svc), svc, rep, lock_fd);
    if (p_.owners.down(rec.owner)) {
        Status why(DYAD_RC_CONNFAIL,
                   "the service " + rec.owner + " that owns '" + upath +
                       "' could not be reached a moment ago",
                   EHOSTUNREACH);
        Status r = from_replicas(upath, rec, svc, rep, lock_fd, why);
        if (r) return r;
        // No replica served it: the owner after all (it may be back).
        Status s = from_source(upath, rec, Source::owner(rec, svc), svc, rep, lock_fd);
        if (!s && s.rc() == DYAD_RC_CONNFAIL) p_.owners.note_down(rec.owner);
        return s ? s : Status(s.rc(), s.message() + "; " + r.message(), s.err());
    }
    // An owner cut off (its link down) does not refuse: its connect would
    // wait 30 s. The first attempt waits timeouts::kQuickConnect, then a
    // replica; with none, the owner again with the usual deadline.
    const auto t0 = std::chrono::steady_clock::now();
    Status s = from_source(upath, rec, Source::owner(rec, svc, timeouts::kQuickConnect), svc, rep,
                           lock_fd);
    if (s || !fails_over(s)) return s;
    if (s.rc() == DYAD_RC_CONNFAIL) p_.owners.note_down(rec.owner);
    Status r = from_replicas(upath, rec, svc, rep, lock_fd, s);
    if (r || s.rc() != DYAD_RC_CONNFAIL ||
        std::chrono::steady_clock::now() - t0 <
            std::chrono::duration<double>(timeouts::kQuickConnect * 0.9))
        return r;
    Status again = from_source(upath, rec, Source::owner(rec, svc), svc, rep, lock_fd);
    return again ? again : Status(again.rc(), again.message() + "; " + r.message(), again.err());
}

Status Fetcher::from_replicas(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                              ConsumeReport* rep, int lock_fd, const Status& why) {
    auto found = p_.lookup.replicas(upath, rec, svc);
    if (!found)
        return Status(why.rc(),
                      why.message() + "; no replica looked up: " + found.status().message(),
                      why.err());
    std::string tried;
    const std::string& gen = std::to_string(rec.generation);
    for (const auto& replica : found.value()) {
        const proto::ReplicaEntry* r = &replica;
        const Source src = Source::holder(replica, rec, svc);
        const std::string& ep = src.endpoint;
        if (ep.empty()) continue;
        proto::FetchRequest req = request_of(upath, rec, p_.link.ns(svc));
        req.replica = true;
        const dtl::Backend& b = dtl::universal_backend();
        rep->transport = b.name;
        Status s = stage_commit(upath, rec, lock_fd, rep, [&](FileSink& sink) {
            bool retry = false;
            return receive(
                b, src, req, sink, [&sink] { return sink.bytes(); }, &retry);
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
