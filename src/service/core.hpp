// SPDX-License-Identifier: Apache-2.0
// What the parts of the service (file_server.hpp, publisher.hpp,
// replica_holder.hpp, status_reporter.hpp) share of it. Service
// (service.hpp) owns every piece and its life cycle: the parts see them
// through a Core of references, made with the Service, filled in by
// Service::start() (the identity once registered, the key, the store, the
// transfer budget, the caps per peer). A part never outlives its Service.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <asio.hpp>

#include "common/auth.hpp"
#include "common/fd.hpp"
#include "common/status.hpp"
#include "dtl/budget.hpp"
#include "kvs/service_store.hpp"
#include "metrics.hpp"
#include "options.hpp"
#include "peer_caps.hpp"

namespace dyad::service {

using kvs::kServicesNamespace;

// The served file as the transfer started.
struct Snapshot {
    uint64_t ino = 0, size = 0;
    int64_t mtime_ns = 0, ctime_ns = 0;
    static Snapshot of(const struct stat& sb) {
        auto ns = [](const struct timespec& t) {
            return static_cast<int64_t>(t.tv_sec) * 1000000000LL + t.tv_nsec;
        };
        return {static_cast<uint64_t>(sb.st_ino), static_cast<uint64_t>(sb.st_size), ns(sb.st_mtim),
                ns(sb.st_ctim)};
    }
    bool operator==(const Snapshot& o) const {
        return ino == o.ino && size == o.size && mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns;
    }
};

// The service's own calls to its metadata store (publishes, the checks of
// fetches, replicas), with the deadline of one call, timed for the metrics.
class StoreCalls {
  public:
    StoreCalls(const std::shared_ptr<kvs::ServiceStore>& store, const std::string& id)
        : store_(store), id_(id) {}
    Result<uint64_t> put(const std::string& ns, const std::string& key, const std::string& value,
                         uint64_t replaces = 0);
    Result<kvs::Entry> get(const std::string& ns, const std::string& key);
    // put, get
    const Histogram (&histograms() const)[2] { return calls_; }

  private:
    const std::shared_ptr<kvs::ServiceStore>& store_;
    const std::string& id_;
    Histogram calls_[2] = {Histogram(kFastBuckets), Histogram(kFastBuckets)};
};

struct Core {
    const Options& opts;
    // The identity (id from the node name; rank once registered).
    const std::string& id;
    const std::optional<uint32_t>& rank;
    const std::vector<std::string>& endpoints;
    // The producer directory (canonical) and its descriptor.
    const std::string& prod_dir;
    const UniqueFd& prod_fd;
    const std::shared_ptr<const auth::Key>& key;  // null: keyless
    const bool& act_as_users;  // can take consumers' credentials (root): access.hpp
    asio::io_context& io;      // the loop
    asio::thread_pool& files;  // file threads: never block the loop on disk
    std::shared_ptr<kvs::ServiceStore>& store;
    StoreCalls& calls;
    RequestMetrics& metrics;  // sees every request of the server
    const std::unique_ptr<dtl::MemoryBudget>& budget;
    const std::shared_ptr<PeerCaps>& caps;

    // Where the service keeps its state (--state-dir, or <producer dir>/.dyad).
    std::string state_dir() const;
};

}  // namespace dyad::service
