// SPDX-License-Identifier: Apache-2.0
// The cheap path of a small file over the stream transport: one job on a
// file thread opens (on_fetch), locks and checks (try_lock, fetch.cpp), then here reads
// the whole file into one buffer of the memory budget, hashes it and checks
// that it did not change; the loop then queues the answer (meta and bytes)
// and the END together, which leave in one write. Two hand-offs in all,
// instead of a chunk pipeline's read, send and final check each going
// through the loop; and one watchdog per file, not one per chunk. Anything else (a larger
// file, another transport, a budget spent for now) takes the chunk
// pipeline (start_send), which waits for memory. read_whole and
// send_watchdog also serve dyad.fetch_many (fetch_many.cpp). docs/design.md,
// "Small files".
#include <sys/stat.h>

#include <algorithm>
#include <chrono>

#include "common/checksum.hpp"
#include "common/seconds.hpp"
#include "proto/fetch.hpp"
#include "file_server.hpp"

namespace dyad::service {

namespace {
constexpr uint64_t kWholeMax = dtl::kFetchManyFileMax;  // bytes: at most one stream chunk
}  // namespace

Result<FileServer::Whole> FileServer::read_whole(int fd, const std::string& upath, size_t n,
                                                 const Snapshot& snap, uint64_t owner,
                                                 uint64_t peer, size_t front, uint64_t from) {
    Whole w;
    w.size = n;
    if (n + front > 0) {
        // Whole pages, so that buffers of files of about one size are
        // reused from the budget's cache rather than mapped each time.
        w.buf = core_.budget->try_get(owner, (front + n + 4095) & ~size_t(4095), peer);
        if (!w.buf) return Status(DYAD_RC_BADFETCH, "no memory for '" + upath + "' now", EAGAIN);
        Status st =
            FileSystem::real().pread_all(fd, w.buf.data() + front, n, from, "'" + upath + "'");
        if (!st) return st;
    }
    w.digest = Xxh3::of(n > 0 ? w.buf.data() + front : nullptr, n);
    w.xxh3 = Xxh3::to_hex(w.digest);
    // Read whole under the shared lock: unchanged now means what was read
    // is the published file.
    struct stat sb;
    if (::fstat(fd, &sb) != 0 || !(Snapshot::of(sb) == snap))
        return Status(DYAD_RC_BADFETCH,
                      "'" + upath +
                          "' was modified while it was being sent: the consumer installs "
                          "nothing; produce it again once it is written",
                      ESTALE);
    return w;
}

std::shared_ptr<asio::steady_timer> FileServer::send_watchdog(
    const std::shared_ptr<rpc::Request>& r) {
    auto watchdog = std::make_shared<asio::steady_timer>(core_.io);
    watchdog->expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(std::min(core_.opts.send_timeout, 1e9))));
    watchdog->async_wait([r](asio::error_code ec) {
        if (!ec) r->close_connection();
    });
    return watchdog;
}

bool FileServer::send_whole(const std::shared_ptr<rpc::Request>& r, const std::string& transport,
                            const std::shared_ptr<dtl::FetchJob>& job, const Snapshot& snap) {
    if (transport != dtl::universal_backend().name || job->size > kWholeMax) return false;
    const auto t0 = std::chrono::steady_clock::now();
    const size_t n = static_cast<size_t>(job->size);
    auto whole =
        read_whole(job->fd.get(), job->upath, n, snap, job->endpoint, job->peer, 0, job->offset);
    if (!whole && whole.status().err() == EAGAIN) return false;  // the pipeline waits for memory
    job->fd.reset();  // this is a file thread: close (and unlock) here
    const bool same = whole || whole.status().err() != ESTALE;
    if (!whole && same) {
        asio::post(core_.io, [this, r, transport, st = whole.status()] { fail(r, transport, st); });
        return true;
    }
    auto buf = std::make_shared<dtl::Buffer>();
    std::string xxh;
    if (whole) {
        *buf = std::move(whole->buf);
        xxh = std::move(whole->xxh3);
    }
    asio::post(core_.io, [this, r, transport, job, buf, same, xxh, t0, n] {
        if (r->finished()) return;  // the consumer went away meanwhile
        if (same) {
            // A consumer that takes nothing for the send timeout loses its
            // connection, as in the chunk pipeline: the buffer comes back.
            auto watchdog = send_watchdog(r);
            r->respond(proto::FetchStart{n, transport}.build(),
                       n > 0 ? asio::buffer(buf->data(), n) : asio::const_buffer(),
                       [buf, watchdog](bool) { watchdog->cancel(); });
            per_transport_[transport].bytes_sent += n;
            total_.bytes_sent += n;
            transfer_seconds_[transport]->observe(seconds_since(t0));
        }
        core_.metrics.note(*r, transport, same ? n : 0);
        end_send(r, transport, *job, same, xxh);
    });
    return true;
}

}  // namespace dyad::service
