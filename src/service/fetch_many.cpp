// SPDX-License-Identifier: Apache-2.0
// dyad.fetch_many: many small files of this service in one request, over
// the stream transport (docs/design.md, "Many small files in one request").
//
// The request (proto::FetchManyRequest) names at most proto::kFetchManyFiles
// files. One job on a file thread takes each file in turn the way a fetch
// does (serve_file.hpp: open, lock without waiting, one fstat under the lock,
// as published), then reads it whole, hashes it and checks it again
// (read_whole, shared with send_whole). The loop then queues one answer
// frame per file, in order (proto::FetchManyItem: the file with its bytes,
// or its refusal), then the END (proto::FetchManyEnd). With a raw answer a
// served file's frame has no meta: its data is a header (index, digest:
// dtl::put_raw_file_header) and the bytes, read into one buffer behind the
// header; the END says so. A file that cannot be served this way now (larger
// than kFetchManyFileMax, locked by its producer: EBUSY, no memory in the
// budget now) is answered with its error; the consumer fetches it alone, the
// way that waits. The request takes one fetch slot of its peer and one
// watchdog.
#include <sys/stat.h>

#include <chrono>
#include <vector>

#include "common/paths.hpp"
#include "common/seconds.hpp"
#include "dtl/fetch_many.hpp"
#include "proto/fetch.hpp"
#include "serve_file.hpp"
#include "file_server.hpp"

namespace dyad::service {

// The compact answer's header (index, XXH3) is what the frame's tag covers
// of its data (kFlagTagHead).
static_assert(dtl::kRawFileHeader == rpc::kTagHead);

// One file of a dyad.fetch_many.
struct FileServer::ManyFile {
    proto::FetchRequest req;  // its upath normalized
    Status error;             // set: answered with this
    Whole got;                // its bytes, from the memory budget
};

void FileServer::on_fetch_many(std::shared_ptr<rpc::Request> r) {
    std::string transport = dtl::universal_backend().name;
    auto req = proto::FetchManyRequest::parse(r->args());
    if (!req) return fail(r, transport, req.status());
    // Counted under the transport asked when it may batch small files and
    // this service serves it (a consumer with DYAD_DTL_MODE=UCX).
    if (auto b = dtl::find_backend(req->transport);
        b && dtl::may_batch(*b.value()) && senders_.count(b.value()->name))
        transport = b.value()->name;
    auto files = std::make_shared<std::vector<ManyFile>>(req->files.size());
    for (size_t i = 0; i < files->size(); ++i) {
        ManyFile& one = (*files)[i];
        auto e = req->entry(i);
        auto up = e ? normalize_upath(e->upath) : Result<std::string>(e.status());
        if (!up) {
            one.error = up.status();
            continue;
        }
        one.req = std::move(e.value());
        one.req.upath = std::move(up.value());
    }
    per_transport_[transport].requests += files->size();
    // The compact answer, for the clients that ask (older ones do not).
    const bool raw = req->raw_answer;
    auto slot = core_.caps->take(r->peer().key, false, core_.id);
    if (!slot) return fail(r, transport, slot.status());
    const uint64_t owner = r->session_id();
    const uint64_t peer = std::hash<std::string>{}(r->peer().key) | 1;
    asio::post(core_.files, [this, r, files, hold = slot.value(), owner, peer, transport, raw] {
        if (r->finished()) return;
        const auto t0 = std::chrono::steady_clock::now();
        for (size_t i = 0; i < files->size(); ++i) {
            ManyFile& one = (*files)[i];
            if (!one.error.is_ok() || r->finished()) continue;
            auto got = read_small(one.req, r->peer(), owner, peer, raw ? dtl::kRawFileHeader : 0);
            if (!got) {
                one.error = got.status();
                continue;
            }
            one.got = std::move(got.value());
            if (raw) dtl::put_raw_file_header(one.got.buf.data(), i, one.got.digest);
        }
        asio::post(core_.io, [this, r, files, hold, transport, t0, raw] {
            answer_many(r, files, transport, t0, raw);
        });
    });
}

Result<FileServer::Whole> FileServer::read_small(const proto::FetchRequest& req,
                                                 const rpc::Peer& who, uint64_t owner,
                                                 uint64_t peer, size_t front) {
    // The descriptor stays non-blocking (pread_all copes with a filesystem
    // that honours that): one syscall less per file.
    auto f = open_for(who, req.upath);
    if (!f) return f.status();
    Snapshot snap;
    Status ok = take_served(*f, req, who, &snap);
    if (!ok && ok.err() == EAGAIN)  // held by its producer: EBUSY, the lone fetch waits
        return Status(ok.rc(), ok.message(), EBUSY);
    if (!ok) return ok;
    if (snap.size > dtl::kFetchManyFileMax)
        return Status(DYAD_RC_BADFETCH, "'" + req.upath + "' is not a small file", EFBIG);
    auto whole =
        read_whole(f->fd(), req.upath, static_cast<size_t>(snap.size), snap, owner, peer, front);
    if (!whole && whole.status().err() == ESTALE) refused_.stale++;
    return whole;
}

void FileServer::answer_many(const std::shared_ptr<rpc::Request>& r,
                             const std::shared_ptr<std::vector<ManyFile>>& files,
                             const std::string& transport, std::chrono::steady_clock::time_point t0,
                             bool raw) {
    if (r->finished()) return;
    auto watchdog = send_watchdog(r);
    auto left = std::make_shared<size_t>(files->size());
    uint64_t bytes = 0, served = 0;
    for (size_t i = 0; i < files->size(); ++i) {
        ManyFile& one = (*files)[i];
        auto written = [files, watchdog, left, i](bool) {
            (*files)[i].got.buf.reset();  // back to the budget
            if (--*left == 0) watchdog->cancel();
        };
        if (!one.error.is_ok()) {
            r->respond(proto::FetchManyItem::refusal(i, one.error).build(), {}, written);
            continue;
        }
        const uint64_t n = one.got.size;
        if (raw)  // no meta: the header and the bytes, in one buffer; the tag covers the header
            r->respond(nullptr, asio::buffer(one.got.buf.data(), dtl::kRawFileHeader + n), written,
                       rpc::kFlagTagHead);
        else
            r->respond(proto::FetchManyItem::served(i, n, one.got.xxh3).build(),
                       n > 0 ? asio::buffer(one.got.buf.data(), n) : asio::const_buffer(), written);
        bytes += n;
        ++served;
    }
    auto& c = per_transport_[transport];
    c.bytes_sent += bytes;
    c.served += served;
    total_.bytes_sent += bytes;
    total_.served += served;
    transfer_seconds_[transport]->observe(seconds_since(t0));
    core_.metrics.note(*r, transport, bytes);
    r->end(proto::FetchManyEnd{files->size(), raw}.build());
}

}  // namespace dyad::service
