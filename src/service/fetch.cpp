// SPDX-License-Identifier: Apache-2.0
// dyad.fetch: one file of this service to one consumer (docs/wire-protocol.md,
// section 7). The loop reads the request (proto::FetchRequest), picks the
// transport and takes one of the peer's fetch slots; a file thread opens the
// file and takes it (serve_file.hpp), waiting while its producer holds it
// locked; then the file goes whole over the stream (whole_file.cpp) or
// through the transport's sender (start_send), and the END says its size and
// checksum once it is known to be unchanged to the end. A request with a byte
// range (offset, length) sends only that part of the file, clipped to its
// size; a range that starts past the end is refused (ERANGE).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "common/paths.hpp"
#include "common/seconds.hpp"
#include "proto/fetch.hpp"
#include "send_channel.hpp"
#include "serve_file.hpp"
#include "file_server.hpp"
#include "replica_holder.hpp"

namespace dyad::service {

// A dyad.fetch between its request and its transfer: what the file thread
// needs while it waits for the file's lock.
struct FileServer::PendingFetch {
    std::shared_ptr<rpc::Request> r;
    std::string transport;    // canonical
    proto::FetchRequest req;  // its upath normalized
    std::optional<ServedFile> file;
    std::shared_ptr<void> hold;  // the peer's fetch slot
};

void FileServer::count(const std::string& name) {
    per_transport_[name];
    transfer_seconds_[name] = std::make_unique<Histogram>(kSlowBuckets);
}

void FileServer::fail(const std::shared_ptr<rpc::Request>& r, const std::string& transport,
                      const Status& st) {
    total_.errors++;
    if (!transport.empty()) {
        per_transport_[transport].errors++;
        core_.metrics.note(*r, transport, 0);
    }
    // (Its warning is the request's line: RequestMetrics::finished.)
    r->fail(st);
}

Result<std::string> FileServer::transport_served(const nlohmann::json& args) {
    const std::string asked =
        proto::FetchRequest::transport_asked(args).value_or(dtl::universal_backend().name);
    auto canon = dtl::find_backend(asked);
    if (canon && senders_.count(canon.value()->name)) return canon.value()->name;
    refused_.transport++;
    std::string served;
    for (auto& [n, s] : senders_) served += (served.empty() ? "" : ", ") + n;
    auto why = canon ? unavailable_.find(canon.value()->name) : unavailable_.end();
    return Status(DYAD_RC_BADDTLMODE,
                  "transport '" + asked + "' is not served here (served: " + served + ")" +
                      (why != unavailable_.end() ? ": " + why->second : ""),
                  EINVAL);
}

void FileServer::on_fetch(std::shared_ptr<rpc::Request> r) {
    if (hold_ && hold_(r)) return;  // its transport is being set up (late_transports.cpp)
    auto transport = transport_served(r->args());
    if (!transport) return fail(r, "", transport.status());
    auto p = std::make_shared<PendingFetch>();
    p->r = r;
    p->transport = transport.value();
    auto req = proto::FetchRequest::parse(r->args());
    if (!req) return fail(r, p->transport, req.status());
    auto upath = normalize_upath(req->upath);
    if (!upath) return fail(r, p->transport, upath.status());
    p->req = std::move(req.value());
    p->req.upath = std::move(upath.value());
    per_transport_[p->transport].requests++;
    // One peer's fetches (and LOCAL descriptors) are capped: what it holds
    // is let go when the fetch's job is.
    auto slot = core_.caps->take(r->peer().key, dtl::is_local(p->transport), core_.id);
    if (!slot) return fail(r, p->transport, slot.status());
    p->hold = slot.value();

    // Open, lock and check on a file thread: never block the loop on disk.
    asio::post(core_.files, [this, p] {
        if (p->r->finished()) return;  // consumer gone before we started
        auto f = p->req.replica ? replicas_.open(p->req) : open_for(p->r->peer(), p->req.upath);
        if (!f) {
            asio::post(core_.io,
                       [this, r = p->r, t = p->transport, st = f.status()] { fail(r, t, st); });
            return;
        }
        p->file.emplace(std::move(f.value()));
        try_lock(std::move(p), 0);
    });
}

// Runs on a file thread. A shared OFD lock is held for the whole transfer, so
// a producer that rewrites the file under an exclusive lock waits for us and
// we never serve a half-rewritten file. The attempt does not block: while the
// producer holds its lock we retry from a loop timer (1 ms doubling to 50 ms),
// so waiting fetches hold no thread and end as soon as their consumer goes.
void FileServer::try_lock(std::shared_ptr<PendingFetch> p, int attempt) {
    if (p->r->finished()) return;  // the file closes here, on this file thread
    auto snap = std::make_shared<Snapshot>();
    // Only what this service published, unchanged since (with the lock
    // held, a producer rewriting under its own lock is done by now).
    Status ok = take_served(*p->file, p->req, p->r->peer(), snap.get());
    if (!ok && ok.err() == EAGAIN) {
        auto timer = std::make_shared<asio::steady_timer>(core_.io);
        timer->expires_after(std::chrono::milliseconds(std::min(50, 1 << std::min(attempt, 6))));
        timer->async_wait([this, p, attempt, timer](asio::error_code ec) mutable {
            if (ec) return;
            // (Moved: the file closes on a file thread, not on the loop.)
            asio::post(core_.files, [this, p = std::move(p), attempt]() mutable {
                try_lock(std::move(p), attempt + 1);
            });
        });
        return;
    }
    if (!ok) {
        asio::post(core_.io, [this, r = p->r, t = p->transport, ok] { fail(r, t, ok); });
        return;
    }
    if (Status in = range_within(p->req, p->file->stat()); !in) {
        asio::post(core_.io, [this, r = p->r, t = p->transport, in] { fail(r, t, in); });
        return;
    }
    p->file->make_blocking();
    auto job = fetch_job(*p);
    if (send_whole(p->r, p->transport, job, *snap)) return;
    asio::post(core_.io,
               [this, r = p->r, t = p->transport, job, snap] { start_send(r, t, job, snap); });
}

Status FileServer::range_within(const proto::FetchRequest& req, const struct stat& sb) {
    if (!req.offset) return Status::ok();
    const uint64_t size = static_cast<uint64_t>(sb.st_size);
    if (*req.offset <= size) return Status::ok();
    return Status(DYAD_RC_BADFIO,
                  "byte range of '" + req.upath + "' starts at " + std::to_string(*req.offset) +
                      ", past its end (" + std::to_string(size) + " bytes)",
                  ERANGE);
}

std::shared_ptr<dtl::FetchJob> FileServer::fetch_job(PendingFetch& p) {
    const auto& r = p.r;
    auto job = std::make_shared<dtl::FetchJob>();
    job->ch = std::make_shared<RequestChannel>(r);
    job->upath = p.req.upath;
    job->local_host = r->local_host();
    job->transport_args = r->args();  // the receiver's own fields, for the sender
    job->file_pool = &core_.files;
    job->idle_timeout_s = core_.opts.send_timeout;
    job->budget = core_.budget.get();
    job->endpoint = r->session_id();
    job->peer = std::hash<std::string>{}(r->peer().key) | 1;  // never 0
    job->hold = std::move(p.hold);
    job->size = static_cast<uint64_t>(p.file->stat().st_size);
    if (p.req.offset && p.req.length) {
        // A byte range: only [offset, offset + length), clipped to the file
        // (range_within checked that it starts inside); the END's size and
        // checksum are the range's.
        job->offset = *p.req.offset;
        job->size = std::min(*p.req.length, job->size - job->offset);
    }
    job->fd = p.file->release();
    return job;
}

void FileServer::start_send(std::shared_ptr<rpc::Request> r, std::string transport,
                            std::shared_ptr<dtl::FetchJob> job,
                            std::shared_ptr<const Snapshot> snap) {
    if (r->finished()) return release_fd(job);  // cancelled meanwhile
    per_transport_[transport].in_flight++;
    total_.in_flight++;
    auto t0 = std::chrono::steady_clock::now();
    senders_.at(transport)->send(
        job, [this, r, transport, job, snap, t0](Status s, uint64_t bytes, std::string xxh) {
            auto& c = per_transport_[transport];
            c.bytes_sent += bytes;
            total_.bytes_sent += bytes;
            if (c.in_flight) c.in_flight--;
            if (total_.in_flight) total_.in_flight--;
            if (!s) {
                release_fd(job);
                core_.metrics.note(*r, transport, bytes);
                return fail(r, transport, s);
            }
            transfer_seconds_[transport]->observe(seconds_since(t0));
            core_.metrics.note(*r, transport, bytes);
            // Unchanged to the end, or the consumer installs nothing: what was
            // read may be a mix of two versions whatever its checksum says. (On
            // a file thread: a stat on a network file system is a round trip.)
            asio::post(core_.files, [this, r, transport, job, snap, xxh = std::move(xxh)] {
                struct stat sb;
                bool same = job->fd.valid() && ::fstat(job->fd.get(), &sb) == 0 &&
                            Snapshot::of(sb) == *snap;
                job->fd.reset();
                asio::post(core_.io, [this, r, transport, job, same, xxh] {
                    end_send(r, transport, *job, same, xxh);
                });
            });
        });
}

void FileServer::end_send(const std::shared_ptr<rpc::Request>& r, const std::string& transport,
                          const dtl::FetchJob& job, bool unchanged, const std::string& xxh) {
    if (!unchanged) {
        refused_.stale++;
        return fail(r, transport,
                    Status(DYAD_RC_BADFETCH,
                           "'" + job.upath +
                               "' was modified while it was being sent: the consumer installs "
                               "nothing; produce it again once it is written",
                           ESTALE));
    }
    per_transport_[transport].served++;
    total_.served++;
    r->end(proto::FetchEnd{job.size, xxh}.build());
}

// Closing the file drops its lock, which on a network filesystem is a
// round trip: do it on a file thread, never on the loop.
void FileServer::release_fd(const std::shared_ptr<dtl::FetchJob>& job) {
    if (!job->fd.valid()) return;
    auto fd = std::make_shared<UniqueFd>(std::move(job->fd));
    asio::post(core_.files, [fd] { fd->reset(); });
}

}  // namespace dyad::service
