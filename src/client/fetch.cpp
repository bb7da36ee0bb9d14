// SPDX-License-Identifier: Apache-2.0
// The one path of bytes: a file asked of one source (the record's owner,
// or a replica's holder in its place) over one transport of the plan, into
// the staged file (or a range's memory), ended by the END trailer.
#include <algorithm>
#include <cerrno>
#include <chrono>

#include "common/log.hpp"
#include "common/seconds.hpp"
#include "fetch_channel.hpp"
#include "fetcher.hpp"

namespace dyad::client {
namespace {
constexpr const char* kSub = "client";
}  // namespace

Source Source::owner(const Record& rec, const ServiceInfo& svc, double connect_s) {
    Source s;
    s.service = rec.owner;
    s.endpoint = OwnerDirectory::endpoint(rec, svc);
    s.connect_s = connect_s;
    return s;
}

Source Source::holder(const proto::ReplicaEntry& r, const Record& rec, const ServiceInfo& svc) {
    Record from = rec;
    from.owner = r.holder;
    from.node = r.node;
    from.endpoints = r.endpoints;
    Source s;
    s.service = r.holder;
    s.endpoint = OwnerDirectory::endpoint(from, svc);
    s.replica = true;
    return s;
}

Status Fetcher::from_source(const std::string& upath, const Record& rec, const Source& src,
                            const ServiceInfo& svc, ConsumeReport* rep, int lock_fd) {
    if (src.endpoint.empty())
        return Status(DYAD_RC_BADMETADATA,
                      "metadata of '" + upath + "' lists no reachable endpoint", EHOSTUNREACH);
    rep->endpoint = src.endpoint;
    Status last;
    nlohmann::json fell_back = nlohmann::json::array();
    for (const dtl::Backend* b : p_.planner.plan(rec, svc, rep)) {
        bool retry = false;
        Status s = fetch_via(*b, src, upath, rec, p_.link.ns(svc), rep, lock_fd, &retry);
        if (s && !fell_back.empty() && rep->selection) {
            // AUTO chose a transport that could not start here: the report's
            // selection says which one moved the file, and why not the others.
            auto sel = std::make_shared<nlohmann::json>(*rep->selection);
            (*sel)["used"] = b->name;
            (*sel)["fell_back_from"] = std::move(fell_back);
            rep->selection = std::move(sel);
        }
        if (s || !retry || p_.planner.fixed()) return s;
        // This transport could not start here: note it, take the next one.
        DYAD_DEBUG(kSub, "%s could not move '%s' (%s): trying the next transport", b->name.c_str(),
                   upath.c_str(), s.to_string().c_str());
        rep->explain += "\n  " + b->name + " failed to start: " + s.message();
        fell_back.push_back({{"transport", b->name}, {"error", s.message()}});
        last = s;
    }
    return last;
}

Status Fetcher::fetch_via(const dtl::Backend& b, const Source& src, const std::string& upath,
                          const Record& rec, const std::string& nspace, ConsumeReport* rep,
                          int lock_fd, bool* retry) {
    rep->transport = b.name;
    return stage_commit(upath, rec, lock_fd, rep, [&](FileSink& sink) -> Result<nlohmann::json> {
        if (rep->progress) {
            auto t0 = std::chrono::steady_clock::now();
            sink.on_progress(
                [cb = rep->progress, t0, total = rec.size](uint64_t bytes) {
                    cb(TransferProgress{bytes, total, seconds_since(t0)});
                },
                rep->progress_interval_s);
        }
        proto::FetchRequest req = request_of(upath, rec, nspace);
        req.replica = src.replica;
        return receive(
            b, src, std::move(req), sink, [&sink] { return sink.bytes(); }, retry);
    });
}

Status Fetcher::unreachable(const Source& src, const std::string& upath, const Status& e) {
    p_.planner.forget();
    if (!p_.owners.registered(src.service))
        return Status(DYAD_RC_CONNFAIL,
                      "the service " + src.service + " that produced '" + upath +
                          "' is gone: it is no longer registered in the metadata store (it "
                          "stopped, or its lease ran out). Start it again on its node (its "
                          "records are served again if the files are unchanged), or produce "
                          "the file elsewhere",
                      EHOSTDOWN);
    return Status(DYAD_RC_CONNFAIL,
                  "cannot reach the service " + src.service + " that owns '" + upath + "' at " +
                      src.endpoint + ": " + e.to_string(),
                  e.err());
}

Result<nlohmann::json> Fetcher::receive(const dtl::Backend& b, const Source& src,
                                        proto::FetchRequest req, dtl::Sink& sink,
                                        const std::function<uint64_t()>& received, bool* retry) {
    const std::string& upath = req.upath;
    auto recv = b.make_receiver();
    if (!recv) {
        *retry = true;
        p_.planner.unusable(b, recv.status().message());
        return recv.status();
    }
    // Only the source's service may answer at its endpoint (with a key, it
    // proves it in the hello).
    auto conn = p_.link.pool().get(
        src.endpoint, Deadline::after(std::min(timeouts::kControl, src.connect_s)), src.service);
    if (!conn) return unreachable(src, upath, conn.status());
    nlohmann::json args = recv.value()->describe();
    req.transport = b.name;
    req.build_into(args);
    RpcFetchChannel ch(*conn.value(), p_.cfg.transfer_timeout);
    Status opened = ch.open(args, Deadline::after(timeouts::kControl));
    if (!opened) return opened.wrap("fetch of '" + upath + "' from " + src.endpoint);
    auto trailer = recv.value()->receive(ch, sink);
    if (!trailer) {
        Status e = trailer.status();
        // Nothing arrived, and the failure is the transport's own (the
        // service does not serve it, or LOCAL reached it over TCP, where no
        // file descriptor can pass): another transport may work.
        *retry = received() == 0 && (e.rc() == DYAD_RC_BADDTLMODE ||
                                     std::find(b.start_errnos.begin(), b.start_errnos.end(),
                                               e.err()) != b.start_errnos.end());
        return Status(e.rc() == DYAD_RC_CONNFAIL ? DYAD_RC_BADFETCH : e.rc(),
                      "fetch of '" + upath + "' from " + src.service + " (" + src.endpoint +
                          ") failed: " + e.message(),
                      e.err());
    }
    if (ch.ended()) p_.link.pool().put(std::move(conn.value()));
    return trailer;
}

}  // namespace dyad::client
