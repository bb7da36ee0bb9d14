// SPDX-License-Identifier: Apache-2.0
// The DYAD client: produce, look up, consume. Thread-safe: one Client may be
// used from any number of threads. The C API is a thin layer over this.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.hpp"
#include "common/paths.hpp"
#include "common/status.hpp"
#include "dtl/dtl.hpp"
#include "kvs/store.hpp"
#include "rpc/client.hpp"
#include "record.hpp"
#include "consumer_store.hpp"

namespace dyad::client {

// Identity of the node's service, from its hello.
struct ServiceInfo {
    std::string id, node, ns, producer_dir, kvs;
    std::vector<std::string> endpoints;
    uint32_t rank = UINT32_MAX;  // the node's rank (DYAD_RANK_UNKNOWN if it did not say)
    nlohmann::json raw;
};

// How far a transfer is, for a progress display.
struct TransferProgress {
    uint64_t bytes = 0;    // received so far
    uint64_t total = 0;    // the file's size
    double elapsed_s = 0;  // since the transfer started
};

// What a consume did (for the CLI, the demo and tests).
struct ConsumeReport {
    // In: if set, called on the consuming thread while a file's bytes
    // arrive: on the first bytes, then at most every progress_interval_s
    // (a clock read per received block, no system call).
    std::function<void(const TransferProgress&)> progress;
    double progress_interval_s = 0.25;
    // Out:
    std::string action;  // "fetched", "present", "in-place"
    std::string transport;
    std::string endpoint;
    uint64_t bytes = 0;
    double wait_s = 0;         // waiting for the file to be produced
    double transfer_s = 0;     // moving and storing its bytes
    std::string explain;       // DYAD_DTL_MODE=AUTO: why this transport (scores)
    nlohmann::json selection;  // the same, as data
};

class Client {
  public:
    // `fs`: the file-system seam for the consumer store (tests inject
    // faults through it); null is the real one.
    static Result<std::unique_ptr<Client>> create(Config cfg, FileSystem* fs = nullptr);

    const Config& config() const { return cfg_; }
    const ManagedDir& producer_dir() const { return prod_; }
    const ManagedDir& consumer_dir() const { return cons_; }

    // Relative path of a consumer/producer path, if managed.
    std::optional<std::string> consumer_upath(const std::string& path) const;
    std::optional<std::string> producer_upath(const std::string& path) const;

    // Publishes a file of the producer directory. Unmanaged paths: UNTRACKED.
    Status produce(const std::string& path);
    // Metadata of a consumer path; should_wait blocks until produced.
    Result<Record> get_metadata(const std::string& path, bool should_wait);
    // Waits for the file, then makes it appear whole in the consumer directory.
    Status consume(const std::string& path, ConsumeReport* report = nullptr);
    Status consume_with(const std::string& path, const Record& rec,
                        ConsumeReport* report = nullptr);

    Result<std::vector<Record>> list();
    Result<nlohmann::json> service_status(const std::string& uri = "");
    Result<ServiceInfo> service();
    // Has this client reached its node's service (service() succeeded)?
    bool reached_service();
    std::string key_of(const std::string& upath) const;
    // In a child after fork(): drop the connections shared with the parent.
    void reset_after_fork();

  private:
    Client(Config cfg, FileSystem& fs, rpc::Credentials creds);
    Result<kvs::Store*> store();
    // The metadata store the node's service uses.
    std::string store_uri(const ServiceInfo& svc) const;
    // A store operation that could not reach the store, said so (others
    // unchanged).
    Status store_failure(const Status& e, const ServiceInfo& svc) const;
    std::string ns(const ServiceInfo& svc) const;
    // lock_fd: the file's lock (ConsumerStore::lock), held meanwhile.
    Status fetch(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                 ConsumeReport* report, int lock_fd);
    // One attempt over one transport; *retry says another may still work
    // (nothing was received and the failure is this transport's).
    Status fetch_via(const dtl::Backend& b, const std::string& upath, const Record& rec,
                     const std::string& ep, const std::string& nspace, ConsumeReport* rep,
                     int lock_fd, bool* retry);
    // AUTO: the transports to try for this file, best first.
    std::vector<const dtl::Backend*> plan(const Record& rec, const ServiceInfo& svc,
                                          ConsumeReport* rep);
    // The owner service's registry entry (transport records, host), cached.
    Result<nlohmann::json> owner_info(const std::string& owner, const ServiceInfo& svc);
    Deadline wait_deadline() const;

    Config cfg_;
    ManagedDir prod_;
    ManagedDir cons_;
    ConsumerStore cstore_;
    const dtl::Backend* backend_ = nullptr;  // fixed mode; null for AUTO
    // False when `owner` is no longer in the registry (stopped, or its
    // lease in etcd ran out); drops what was cached of it.
    bool owner_registered(const std::string& owner);
    std::map<std::string, nlohmann::json> owners_;  // under mu_
    std::map<std::string, std::string> unusable_;   // transport -> why (under mu_)
    rpc::Credentials creds_;                        // DYAD_AUTH_KEY_FILE
    std::shared_ptr<rpc::ConnectionPool> pool_;
    std::mutex mu_;
    std::optional<ServiceInfo> svc_;
    std::unique_ptr<kvs::Store> store_;
};

}  // namespace dyad::client
