// SPDX-License-Identifier: Apache-2.0
// The consume core: the steps every consume takes, whether one file alone
// (Client::consume_once, its bytes by any transport) or many small files of
// one owner in one dyad.fetch_many (Client::consume_batch):
//   settled      in place, or a copy of this produce present: nothing moves;
//   under_lock   one consumer per file per node moves it: present once the
//                lock is held, done; else it moves;
//   stage_commit a temporary file beside the target, the bytes, the END
//                trailer checked, renamed into place.
// docs/design.md, "Consumer store", says why a file is installed so.
//
// The range variant (Client::consume_range) takes the same first step and
// writes no file: settled files (in place, or a copy of this produce) are
// read with pread; otherwise the owner sends only the range (a dyad.fetch
// with offset and length) into memory, and its END's size and checksum are
// the range's.
#include <fcntl.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "client.hpp"
#include "origin_blocks.hpp"
#include "common/checksum.hpp"
#include "common/fs.hpp"
#include "fetch_channel.hpp"
#include "trace_points.hpp"

namespace dyad::client {

namespace {

// A range's bytes as they arrive, into the buffer sized for them: more than
// that is the service's error, refused.
class MemorySink : public dtl::Sink {
  public:
    MemorySink(char* p, size_t cap, const std::string& upath) : p_(p), cap_(cap), upath_(upath) {}
    Status write(const void* p, size_t n) override {
        if (n > cap_ - n_)
            return Status(DYAD_RC_BADFETCH,
                          "the owner of '" + upath_ + "' sent more than the " +
                              std::to_string(cap_) + " bytes of the range asked for",
                          EPROTO);
        if (n) std::memcpy(p_ + n_, p, n);
        hash_.update(p, n);
        n_ += n;
        return Status::ok();
    }
    // LOCAL marks its copies so (no checksum from the owner); with no
    // descriptor here its bytes still come through write().
    void copied(uint64_t n) override {
        n_ += static_cast<size_t>(n);
        kernel_ = true;
    }
    size_t bytes() const { return n_; }
    Received received() const { return {n_, hash_.hex(), kernel_}; }

  private:
    char* p_;
    size_t cap_;
    size_t n_ = 0;
    const std::string& upath_;
    Xxh3 hash_;
    bool kernel_ = false;
};

bool same_produce(const struct stat& sb, const Record& rec) {
    return static_cast<uint64_t>(sb.st_size) == rec.size &&
           static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000LL + sb.st_mtim.tv_nsec ==
               rec.mtime_ns;
}

Status changed(const std::string& upath) {
    return Status(DYAD_RC_BADFETCH,
                  "'" + upath + "' changed since it was produced: no bytes returned", ESTALE);
}

}  // namespace

bool Client::in_place(const Record& rec, const ServiceInfo& svc) const {
    return !is_origin(rec) &&
           (cfg_.shared_storage ||
            (rec.node == svc.node && canonical_path(rec.producer_dir) == cons_.path()));
}

bool Client::settled(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                     ConsumeReport* rep) {
    if (in_place(rec, svc)) {
        rep->action = "in-place";
    } else if (cstore_.present(upath, rec)) {
        rep->action = "present";
        rep->bytes = 0;
        cache_.hit(upath);
    } else {
        return false;
    }
    rep->transport = "none";
    return true;
}

Status Client::under_lock(const std::string& upath, const Record& rec, Deadline deadline,
                          ConsumeReport* rep, const MoveFn& move) {
    // Until the deadline (and while a holder is seen moving the file).
    auto lk = cstore_.lock(upath, deadline, cfg_.transfer_timeout);
    if (!lk) return lk.status();
    if (cstore_.present(upath, rec)) {
        rep->action = "present";
        rep->transport = "none";
        rep->bytes = 0;
        return Status::ok();
    }
    return move(lk.value().get());
}

Status Client::stage_commit(const std::string& upath, const Record& rec, int lock_fd,
                            ConsumeReport* rep, const FillFn& fill) {
    auto staging = cstore_.stage(upath, lock_fd);
    if (!staging) return staging.status();
    FileSink& sink = staging.value()->sink();
    trace::Span moving("transfer", "client");
    auto trailer = fill(sink);
    if (moving.active())
        trace_transfer(moving, rec, key_of(upath), rep->transport, sink.bytes(), trailer.status());
    if (!trailer) return trailer.status();
    trace::Span committing("commit", "client");
    Status s = staging.value()->commit(trailer.value(), rec);
    if (committing.active()) trace_commit(committing, rec, key_of(upath), sink.bytes(), s);
    if (!s) return s;
    rep->action = "fetched";
    rep->bytes = sink.bytes();
    cache_.installed(upath, sink.bytes());  // then evicts if over capacity
    return Status::ok();
}

proto::FetchRequest Client::request_of(const std::string& upath, const Record& rec,
                                       const std::string& nspace) const {
    proto::FetchRequest r;
    r.upath = upath;
    r.generation = rec.generation;
    // Where the owner finds the record if it restarted since publishing.
    r.ns = nspace;
    r.key = key_of(upath);
    return r;
}

Result<RangeBytes> Client::consume_range(const std::string& path, uint64_t offset, uint64_t length,
                                         ConsumeReport* report, char* into) {
    auto up = consumer_relative(path);
    if (!up) return up.status();
    const auto t0 = std::chrono::steady_clock::now();
    const Deadline deadline = wait_deadline();
    auto rec = get_metadata(path, true);
    if (!rec) return rec.status();
    ConsumeReport local;
    ConsumeReport* rep = report ? report : &local;
    rep->wait_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    RangeBytes out;
    if (into) out.data = {into, [](void*) {}};  // the caller's memory: not freed here
    Status s = retry_stale(path, std::move(rec.value()), deadline, [&](const Record& r) {
        return range_once(up.value(), r, offset, length, &out, rep);
    });
    if (!s) return s;
    return out;
}

Status Client::range_once(const std::string& upath, const Record& rec, uint64_t offset,
                          uint64_t length, RangeBytes* out, ConsumeReport* rep) {
    // Never past what was produced: the whole range lies in the file.
    if (offset > rec.size || length > rec.size - offset)
        return Status(DYAD_RC_BADFIO,
                      "byte range [" + std::to_string(offset) + ", " + std::to_string(offset) +
                          " + " + std::to_string(length) + ") of '" + upath +
                          "' goes past its end (" + std::to_string(rec.size) +
                          " bytes): ask for bytes inside the file",
                      ERANGE);
    if (length > SIZE_MAX - 1)
        return Status(DYAD_RC_SYSFAIL, "byte range of '" + upath + "' too large for memory",
                      ENOMEM);
    auto svc = service();
    if (!svc) return svc.status();
    const auto t0 = std::chrono::steady_clock::now();
    // One byte more than asked: an empty range is still a buffer the
    // caller can free, never NULL.
    RangeBytes r;
    char* dst = out->data.get();  // the caller's memory, if given
    if (!dst) {
        r.data.reset(static_cast<char*>(std::malloc(static_cast<size_t>(length) + 1)));
        if (!r.data)
            return Status(DYAD_RC_SYSFAIL,
                          "no memory for " + std::to_string(length) + " bytes of '" + upath + "'",
                          ENOMEM);
        dst = r.data.get();
    }
    Status s;
    if (length == 0) {
        rep->action = "empty";
        rep->transport = "none";
    } else if (in_place(rec, svc.value())) {
        // The producer's own file (same directory, or shared storage): the
        // record's produce before and after the read, or nothing.
        UniqueFd fd = cstore_.open_target(upath);
        if (!fd.valid())
            return Status(DYAD_RC_BADFIO, "cannot open '" + cstore_.target(upath) + "'", errno);
        s = read_range(fd.get(), upath, offset, length, &rec, dst);
        rep->action = "in-place";
        rep->transport = "none";
    } else if (UniqueFd fd = cstore_.open_present(upath, rec); fd.valid()) {
        s = read_range(fd.get(), upath, offset, length, nullptr, dst);
        rep->action = "present";
        rep->transport = "none";
    } else if (is_origin(rec)) {
        // Only in the origin (DYAD_PATH_ORIGIN): the blocks this node holds
        // of the origin's file, the others read from it and kept
        // (origin_blocks.hpp; changed: ESTALE, which retry_stale looks up again).
        uint64_t from_origin = 0;
        s = OriginBlocks(cons_.path()).read(origin_, upath, rec, offset, length, dst, &from_origin);
        rep->action = from_origin ? "origin" : "present";
        rep->transport = from_origin ? "origin" : "none";
    } else {
        const std::string ep = owner_endpoint(rec, svc.value());
        if (ep.empty())
            return Status(DYAD_RC_BADMETADATA,
                          "metadata of '" + upath + "' lists no reachable endpoint", EHOSTUNREACH);
        rep->endpoint = ep;
        proto::FetchRequest req = request_of(upath, rec, ns(svc.value()));
        req.offset = offset;
        req.length = length;
        for (const dtl::Backend* b : plan(rec, svc.value(), rep)) {
            rep->transport = b->name;
            MemorySink sink(dst, static_cast<size_t>(length), upath);
            bool retry = false;
            auto trailer = receive_via(
                *b, req, rec, ep, sink, [&sink] { return static_cast<uint64_t>(sink.bytes()); },
                &retry);
            if (trailer) s = verify_trailer(trailer.value(), sink.received(), upath);
            if (trailer && s && sink.bytes() != length)
                s = Status(DYAD_RC_BADFETCH,
                           "the owner of '" + upath + "' sent " + std::to_string(sink.bytes()) +
                               " bytes of a range of " + std::to_string(length) +
                               " (a dyadd without byte ranges sends the whole file): nothing "
                               "returned",
                           EPROTO);
            if (!trailer) s = trailer.status();
            if (s || !retry || backend_) break;
            rep->explain += "\n  " + b->name + " failed to start: " + s.message();
        }
        rep->action = "fetched";
        rep->bytes = s ? length : 0;
    }
    if (!s) return s;
    if (r.data) out->data = std::move(r.data);
    out->size = static_cast<size_t>(length);
    rep->transfer_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return Status::ok();
}

Status Client::read_range(int fd, const std::string& upath, uint64_t offset, uint64_t length,
                          const Record* rec, char* dst) {
    struct stat before, after;
    if (rec && (::fstat(fd, &before) != 0 || !same_produce(before, *rec))) return changed(upath);
    Status s = FileSystem::real().pread_all(fd, dst, static_cast<size_t>(length), offset,
                                            "'" + upath + "'");
    if (!s) return s;
    if (rec &&
        (::fstat(fd, &after) != 0 || !same_produce(after, *rec) || after.st_ino != before.st_ino))
        return changed(upath);
    return Status::ok();
}

}  // namespace dyad::client
