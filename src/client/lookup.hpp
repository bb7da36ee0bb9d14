// SPDX-License-Identifier: Apache-2.0
// The lookup: a consumer path's record in the metadata store (at once, or
// waiting for its produce until a deadline), the records under a prefix
// page by page, a file's replicas, and the retry of a consume whose file
// was produced again or changed since it was looked up.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "common/deadline.hpp"
#include "common/paths.hpp"
#include "common/status.hpp"
#include "proto/replica.hpp"
#include "record.hpp"
#include "service_link.hpp"

namespace dyad::client {

class Lookup {
  public:
    Lookup(const Config& cfg, const ManagedDir& prod, const ManagedDir& cons, ServiceLink& link)
        : cfg_(cfg), prod_(prod), cons_(cons), link_(link) {}

    // The relative path of a consumer path: BADMANAGEDPATH without a
    // consumer directory, UNTRACKED outside it, refused under the reserved
    // directory.
    Result<std::string> consumer_relative(const std::string& path) const;
    // The record of the relative path `upath`; should_wait: until it is
    // produced or `deadline` (an expired one: one look, TIMEOUT if absent).
    Result<Record> find(const std::string& upath, bool should_wait, Deadline deadline);
    // The metadata of a path in the consumer or the producer directory
    // (whichever holds it), without waiting.
    Result<Record> stat(const std::string& path);
    // once(rec); when it fails with ESTALE (the file is no longer the one
    // the record describes), looks `path` up again and retries with its
    // newest record (a few times at most), or waits for its new produce
    // until `deadline` if it changed and is not produced again yet.
    Status retry_stale(const std::string& path, Record rec, Deadline deadline,
                       const std::function<Status(const Record&)>& once);
    // The records whose relative path starts with `prefix`, page by page.
    Status list(const std::string& prefix, const std::function<bool(const Record&)>& each);
    // The replicas of `rec` (upath's record) recorded in the store: those of
    // its very produce (owner, generation, size, mtime).
    Result<std::vector<proto::ReplicaEntry>> replicas(const std::string& upath, const Record& rec,
                                                      const ServiceInfo& svc);
    // DYAD_WAIT_TIMEOUT from now.
    Deadline wait_deadline() const;
    std::string key_of(const std::string& upath) const;

  private:
    // find()'s failure, said for a user.
    Status lookup_failure(Status s, const std::string& upath, bool should_wait, bool look_once,
                          const ServiceInfo& svc) const;

    const Config& cfg_;
    const ManagedDir& prod_;
    const ManagedDir& cons_;
    ServiceLink& link_;
};

// A managed path's relative part, refused under the reserved directory.
Status reserved_check(const std::optional<std::string>& up);

}  // namespace dyad::client
