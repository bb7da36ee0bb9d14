// SPDX-License-Identifier: Apache-2.0
// Read-through from an origin directory (DYAD_PATH_ORIGIN, e.g. a dataset on
// the parallel file system): a consume of a path no produce is recorded for,
// whose file exists under the origin at the same relative path, copies that
// file into the consumer directory (staged and renamed into place as every
// consume, never partial) instead of waiting for a produce.
//
// The rules (docs/user-guide.md, "Cache and origin"):
//  - A record wins. The store is looked up first, without waiting: found,
//    the file is consumed from its owner as always, whether or not the
//    origin holds the path too. Only with no record is the origin looked at,
//    at once (origin files exist before the job: waiting for a produce that
//    may never come would make every first read pay DYAD_WAIT_TIMEOUT).
//    Missing there too, the consume waits for a produce as without an origin.
//  - A copy from the origin is identified by the origin file's ctime, mtime
//    and size (its install stamp names them, as a fetched copy's names its
//    produce): the next consume finds it present while they are unchanged,
//    and reads the file again once any changed. A file changing while it is
//    read is read again (a few times), then refused with ESTALE.
//  - With DYAD_ORIGIN_PUBLISH the copy goes into DYAD_PATH_PRODUCER and is
//    published by this node's service (a produce, with the origin's
//    identity in the user.dyad.origin attribute), then consumed from there
//    as any local produce: other nodes find the record and fetch from this
//    node, not from the shared file system. This node checks its published
//    copy against the origin at each consume and, changed, reads it again
//    and publishes it again (a new generation, which other nodes' next
//    consumes fetch).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/paths.hpp"
#include "common/status.hpp"
#include "consumer_store.hpp"
#include "record.hpp"

namespace dyad::client {

// The owner named by the record of an origin file (no service id has '@').
inline constexpr const char* kOriginOwner = "@origin";
inline bool is_origin(const Record& r) {
    return r.owner == kOriginOwner;
}

class Origin {
  public:
    // `dir` as set (DYAD_PATH_ORIGIN); "" for none.
    explicit Origin(std::string dir) : dir_(std::move(dir)) {}
    bool enabled() const { return !dir_.empty(); }
    const std::string& dir() const { return dir_; }

    // The origin's file at `upath` as a record (owner kOriginOwner, its
    // generation the file's ctime in ns): NOTFOUND if the origin has no such
    // file; BADFIO naming DYAD_PATH_ORIGIN if the origin directory is
    // missing or unreadable, or the file cannot be read.
    Result<Record> stat(const std::string& upath) const;
    // The origin's file at `upath` open for reading, if it is still the file
    // `rec` describes (ESTALE if not).
    Result<UniqueFd> open_file(const std::string& upath, const Record& rec) const;
    // Whether the open file `fd` is still the one `rec` describes.
    static bool unchanged(int fd, const Record& rec);
    // Copies the file `rec` describes into `sink`; ESTALE if it is no
    // longer that file, or changed while read. The END trailer (size and
    // checksum of what was read).
    Result<nlohmann::json> copy(const std::string& upath, const Record& rec, FileSink& sink) const;
    // Copies it into `prod` (DYAD_PATH_PRODUCER) at the same relative path:
    // a temporary file renamed into place, with the origin's mode, mtime and
    // identity (user.dyad.origin).
    Status copy_to(const std::string& upath, const Record& rec, const ManagedDir& prod) const;
    // The origin identity a published copy was made from (user.dyad.origin
    // of the file at `full`), if any.
    static std::optional<std::string> published_from(const std::string& full);
    // "CTIME MTIME SIZE" of an origin record.
    static std::string identity(const Record& rec);

  private:
    Result<UniqueFd> open_root() const;
    std::string dir_;
};

}  // namespace dyad::client
