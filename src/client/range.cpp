// SPDX-License-Identifier: Apache-2.0
// A byte range of a file into memory (Client::consume_range): no file is
// written. Settled files (in place, or a copy of this produce) and origin
// files are read with pread; otherwise the owner sends only the range (a
// dyad.fetch with offset and length) into memory, over the transport a
// consume would use, and its END's size and checksum are the range's.
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/checksum.hpp"
#include "common/fs.hpp"
#include "common/seconds.hpp"
#include "fetch_channel.hpp"
#include "fetcher.hpp"
#include "origin_blocks.hpp"

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

// [offset, offset + length) of the open file `fd` into dst. With `rec`, the
// file must be that produce (size and mtime) before and after the read:
// else ESTALE.
Status read_range(int fd, const std::string& upath, uint64_t offset, uint64_t length,
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

// Never past what was produced: the whole range lies in the file.
Status check_range(const std::string& upath, const Record& rec, uint64_t offset, uint64_t length) {
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
    return Status::ok();
}

}  // namespace

Status Fetcher::range(const std::string& upath, const Record& rec, uint64_t offset, uint64_t length,
                      RangeBytes* out, ConsumeReport* rep) {
    if (Status c = check_range(upath, rec, offset, length); !c) return c;
    auto svc = p_.link.service();
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
    } else if (auto here = range_here(upath, rec, svc.value(), offset, length, dst, rep)) {
        s = *here;
    } else {
        s = range_fetched(upath, rec, svc.value(), offset, length, dst, rep);
    }
    if (!s) return s;
    if (r.data) out->data = std::move(r.data);
    out->size = static_cast<size_t>(length);
    rep->transfer_s = seconds_since(t0);
    return Status::ok();
}

std::optional<Status> Fetcher::range_here(const std::string& upath, const Record& rec,
                                          const ServiceInfo& svc, uint64_t offset, uint64_t length,
                                          char* dst, ConsumeReport* rep) {
    Status s;
    if (in_place(rec, svc)) {
        // The producer's own file (same directory, or shared storage): the
        // record's produce before and after the read, or nothing.
        UniqueFd fd = p_.cstore.open_target(upath);
        if (!fd.valid())
            return Status(DYAD_RC_BADFIO, "cannot open '" + p_.cstore.target(upath) + "'", errno);
        s = read_range(fd.get(), upath, offset, length, &rec, dst);
        rep->action = "in-place";
        rep->transport = "none";
    } else if (is_origin(rec) && blocks_.held(upath, rec, offset, length, dst)) {
        // Blocks of the origin file held: read first (no open of a
        // consumer copy that is not there, in the common case).
        rep->action = "present";
        rep->transport = "none";
    } else if (UniqueFd fd = p_.cstore.open_present(upath, rec); fd.valid()) {
        s = read_range(fd.get(), upath, offset, length, nullptr, dst);
        rep->action = "present";
        rep->transport = "none";
    } else if (is_origin(rec)) {
        // Only in the origin (DYAD_PATH_ORIGIN): the blocks this node holds
        // of the origin's file, the others read from it and kept
        // (origin_blocks.hpp; changed: ESTALE, which retry_stale looks up again).
        uint64_t from_origin = 0;
        s = blocks_.read(p_.origin, upath, rec, offset, length, dst, &from_origin);
        rep->action = from_origin ? "origin" : "present";
        rep->transport = from_origin ? "origin" : "none";
    } else {
        return std::nullopt;
    }
    return s;
}

Status Fetcher::range_fetched(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                              uint64_t offset, uint64_t length, char* dst, ConsumeReport* rep) {
    const Source src = Source::owner(rec, svc);
    if (src.endpoint.empty())
        return Status(DYAD_RC_BADMETADATA,
                      "metadata of '" + upath + "' lists no reachable endpoint", EHOSTUNREACH);
    rep->endpoint = src.endpoint;
    proto::FetchRequest req = request_of(upath, rec, p_.link.ns(svc));
    req.offset = offset;
    req.length = length;
    Status s;
    for (const dtl::Backend* b : p_.planner.plan(rec, svc, rep)) {
        rep->transport = b->name;
        MemorySink sink(dst, static_cast<size_t>(length), upath);
        bool retry = false;
        auto trailer = receive(
            *b, src, req, sink, [&sink] { return static_cast<uint64_t>(sink.bytes()); }, &retry);
        if (trailer) s = verify_trailer(trailer.value(), sink.received(), upath);
        if (trailer && s && sink.bytes() != length)
            s = Status(DYAD_RC_BADFETCH,
                       "the owner of '" + upath + "' sent " + std::to_string(sink.bytes()) +
                           " bytes of a range of " + std::to_string(length) +
                           " (a dyadd without byte ranges sends the whole file): nothing "
                           "returned",
                       EPROTO);
        if (!trailer) s = trailer.status();
        if (s || !retry || p_.planner.fixed()) break;
        rep->explain += "\n  " + b->name + " failed to start: " + s.message();
    }
    rep->action = "fetched";
    rep->bytes = s ? length : 0;
    return s;
}

}  // namespace dyad::client
