// SPDX-License-Identifier: Apache-2.0
// dyad.fetch_many: many small files of this service in one request, over
// the stream transport (docs/design.md, "Many small files in one request").
//
// Request: {"files": [{"upath", "generation", "ns", "key"}, ...], "answer"},
// at most dtl::kFetchManyFiles files. One job on a file thread takes each
// file in turn: open, lock without waiting (try_shared_lock), one fstat to
// check what it is and that it is as published, then read whole, hash and
// check again (read_whole, shared with send_whole). The loop then
// queues one answer frame per file, in order: {"i", "size", "xxh3"} with
// the bytes, or {"i", "rc", "errno", "msg"} without; then the END
// ({"files": n}). With "answer": "raw" a served file's frame has no meta:
// its data is a header (index, digest: dtl::put_raw_file_header) and the
// bytes, read into one buffer behind the header; the END says
// "format": "raw". A file that cannot be served this way now (larger than
// kFetchManyFileMax, locked by its producer, no memory in the budget now)
// is answered with its error; the consumer fetches it alone, the way that
// waits. The request takes one fetch slot of its peer and one watchdog.
#include <sys/stat.h>

#include <chrono>
#include <vector>

#include "dtl/fetch_many.hpp"
#include "service.hpp"

namespace dyad::service {

namespace {

struct OneFile {
    std::string upath;
    nlohmann::json args;  // its generation, ns and key, as a fetch's
    Status error;         // set: answered with this
    dtl::Buffer buf;      // its bytes (size), from the memory budget
    uint64_t size = 0;
    std::string xxh3;
};

nlohmann::json error_meta(size_t i, const Status& st) {
    return {{"i", i},
            {"rc", static_cast<int>(st.rc())},
            {"errno", st.err() ? st.err() : EIO},
            {"msg", st.message()}};
}

}  // namespace

void Service::on_fetch_many(std::shared_ptr<rpc::Request> r) {
    const std::string transport = dtl::universal_backend().name;
    auto parsed = dtl::parse_fetch_many(r->args());
    if (!parsed) return fail(r, transport, parsed.status());
    auto files = std::make_shared<std::vector<OneFile>>(parsed->size());
    for (size_t i = 0; i < parsed->size(); ++i) {
        auto& e = parsed.value()[i];
        OneFile& one = (*files)[i];
        one.upath = std::move(e.upath);
        one.args = std::move(e.args);
        one.error = std::move(e.error);
    }
    per_transport_[transport].requests += files->size();
    // The compact answer, for the clients that ask (older ones do not).
    const bool raw = dtl::meta_str(r->args(), "answer").value_or("") == "raw";
    auto slot = caps_->take(r->peer().key, false, id_);
    if (!slot) return fail(r, transport, slot.status());
    const uint64_t owner = r->session_id();
    const uint64_t peer = std::hash<std::string>{}(r->peer().key) | 1;
    asio::post(file_pool_, [this, r, files, hold = slot.value(), owner, peer, transport, raw] {
        if (r->finished()) return;
        const auto t0 = std::chrono::steady_clock::now();
        for (size_t i = 0; i < files->size(); ++i) {
            OneFile& one = (*files)[i];
            if (!one.error.is_ok() || r->finished()) continue;
            // One fstat, under the lock, says what the file is and whether
            // it is as published; the descriptor stays non-blocking
            // (pread_all copes with a filesystem that honours that).
            auto fd = open_served(one.upath);
            if (!fd) {
                one.error = fd.status();
                continue;
            }
            Status locked = try_shared_lock(fd->get(), one.upath);
            struct stat sb;
            if (::fstat(fd->get(), &sb) != 0) {
                one.error = Status(DYAD_RC_BADFIO, "stat of '" + one.upath + "' failed", errno);
                continue;
            }
            if (Status kind = served_kind(one.upath, sb); !kind) {
                one.error = kind;
                continue;
            }
            if (!locked) {  // held by its producer: EBUSY, the lone fetch waits
                one.error =
                    locked.err() == EAGAIN ? Status(locked.rc(), locked.message(), EBUSY) : locked;
                continue;
            }
            Snapshot snap;
            Status ok = check_served(one.args, sb, one.upath, &snap);
            if (ok) ok = readable_by(r->peer(), sb, one.upath);
            if (!ok) {
                if (ok.err() == ESTALE) refused_stale_++;
                if (ok.err() == ENOENT) refused_unproduced_++;
                one.error = ok;
                continue;
            }
            if (snap.size > dtl::kFetchManyFileMax) {
                one.error =
                    Status(DYAD_RC_BADFETCH, "'" + one.upath + "' is not a small file", EFBIG);
                continue;
            }
            const size_t n = static_cast<size_t>(snap.size);
            auto whole = read_whole(fd->get(), one.upath, n, snap, owner, peer,
                                    raw ? dtl::kRawFileHeader : 0);
            if (!whole) {
                if (whole.status().err() == ESTALE) refused_stale_++;
                one.error = whole.status();
                continue;
            }
            one.buf = std::move(whole->buf);
            one.xxh3 = std::move(whole->xxh3);
            one.size = n;
            if (raw) dtl::put_raw_file_header(one.buf.data(), i, whole->digest);
        }
        asio::post(io_, [this, r, files, hold, transport, t0, raw] {
            if (r->finished()) return;
            auto watchdog = send_watchdog(r);
            auto left = std::make_shared<size_t>(files->size());
            uint64_t bytes = 0, served = 0;
            for (size_t i = 0; i < files->size(); ++i) {
                OneFile& one = (*files)[i];
                auto written = [files, watchdog, left, i](bool) {
                    (*files)[i].buf.reset();  // back to the budget
                    if (--*left == 0) watchdog->cancel();
                };
                if (!one.error.is_ok()) {
                    r->respond(error_meta(i, one.error), {}, written);
                    continue;
                }
                if (raw)  // no meta: the header and the bytes, in one buffer
                    r->respond(nullptr,
                               asio::buffer(one.buf.data(), dtl::kRawFileHeader + one.size),
                               written);
                else
                    r->respond({{"i", i}, {"size", one.size}, {"xxh3", one.xxh3}},
                               one.size > 0 ? asio::buffer(one.buf.data(), one.size)
                                            : asio::const_buffer(),
                               written);
                bytes += one.size;
                ++served;
            }
            auto& c = per_transport_[transport];
            c.bytes_sent += bytes;
            c.served += served;
            total_.bytes_sent += bytes;
            total_.served += served;
            transfer_seconds_[transport]->observe(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            metrics_->note(*r, transport, bytes);
            nlohmann::json end = {{"files", files->size()}};
            if (raw) end["format"] = "raw";
            r->end(std::move(end));
        });
    });
}

}  // namespace dyad::service
