// SPDX-License-Identifier: Apache-2.0
// The client's front: each call handed to the part that holds its concept
// (client.hpp lists them), and the consume of one file, which takes them in
// turn: the lookup (its record), the fetcher's core (settled? under the
// file's lock), then its bytes from a source.
#include "client.hpp"

#include <algorithm>
#include <chrono>

#include "common/seconds.hpp"
#include "timeouts.hpp"
#include "trace_points.hpp"

namespace dyad::client {

namespace {
// Idle connections the pool keeps per URI: at least the window, so that
// every fetch of a full window from one owner finds an idle connection on
// its next file instead of connecting again.
size_t idle_per_owner(const Config& cfg) {
    return std::max<size_t>(8, cfg.consume_window);
}
}  // namespace

Client::Client(Config cfg, FileSystem& fs, rpc::Credentials creds, const dtl::Backend* fixed)
    : cfg_(std::move(cfg)),
      prod_(cfg_.prod_path),
      cons_(cfg_.cons_path),
      cstore_(cons_.path(), fs, cfg_.fsync_write),
      origin_(cfg_.path_origin),
      origin_seen_(cfg_.path_origin.empty() ? 0 : cfg_.origin_recheck),
      cache_(cfg_, cons_.empty() ? "" : cons_.path(), prod_.empty() ? "" : prod_.path(),
             [this](const std::string& up) { return cstore_.try_lock(up); }),
      link_(cfg_, std::move(creds), idle_per_owner(cfg_)),
      owners_(link_),
      planner_(fixed, owners_),
      lookup_(cfg_, prod_, cons_, link_),
      producer_(cfg_, prod_, cons_, link_, cache_),
      fetcher_(Fetcher::Parts{cfg_, cons_, cstore_, cache_, origin_, link_, owners_, planner_,
                              lookup_}) {}

Result<std::unique_ptr<Client>> Client::create(Config cfg, FileSystem* fs) {
    trace::start_from_settings();  // DYAD_TRACE: once per process
    const dtl::Backend* fixed = nullptr;
    auto mode = dtl::canonical_mode(cfg.dtl_mode);
    if (!mode) return mode.status();
    cfg.dtl_mode = mode.value();
    if (cfg.dtl_mode != dtl::kAutoMode) {
        auto b = dtl::find_backend(cfg.dtl_mode);
        if (!b) return b.status();
        fixed = b.value();
    }
    if (cfg.key_bins == 0) return Status(DYAD_RC_NOCTX, "DYAD_KEY_BINS must be at least 1", EINVAL);
    if (Status cs = check_cache_settings(cfg); !cs) return cs;
    auto creds = rpc::Credentials::from_settings();
    if (!creds) return creds.status();
    std::unique_ptr<Client> c(
        new Client(std::move(cfg), fs ? *fs : FileSystem::real(), std::move(creds.value()), fixed));
    // A consumer usually starts before its data exists: set the transport up
    // now rather than on the first fetch. A fixed transport that cannot work
    // here is an error now, not a wait for files it could never move. AUTO
    // warms nothing up: a transport is set up when first chosen (UCX's
    // context holds sockets and a shared-memory window that every forked
    // worker would inherit, and libfabric's providers take 0.2 s to load),
    // and most files never need one; one that cannot work is left out.
    if (fixed && !c->cons_.empty())
        if (Status w = dtl::prepare_fixed_mode(*fixed); !w) return w;
    return c;
}

std::optional<std::string> Client::consumer_upath(const std::string& path) const {
    return cons_.relative(path, cfg_.relative_to_managed_path);
}
std::optional<std::string> Client::producer_upath(const std::string& path) const {
    return prod_.relative(path, cfg_.relative_to_managed_path);
}

Status Client::produce(const std::string& path) {
    return producer_.produce(path);
}

Status Client::unpublish(const std::string& path) {
    return producer_.unpublish(path);
}

Result<Record> Client::get_metadata(const std::string& path, bool should_wait) {
    return lookup(path, should_wait, wait_deadline());
}

Result<Record> Client::lookup(const std::string& path, bool should_wait, Deadline deadline) {
    auto up = lookup_.consumer_relative(path);
    if (!up) return up.status();
    if (should_wait && origin_.enabled()) return lookup_with_origin(up.value(), deadline);
    return lookup_.find(up.value(), should_wait, deadline);
}

Result<Record> Client::stat(const std::string& path) {
    return lookup_.stat(path);
}

Status Client::consume(const std::string& path, ConsumeReport* report) {
    trace::Span sp("consume", "client");
    ConsumeReport local;
    ConsumeReport* rep = report ? report : &local;
    auto t0 = std::chrono::steady_clock::now();
    const Deadline deadline = wait_deadline();
    auto rec = get_metadata(path, true);
    Status s = rec.status();
    if (rec) {
        rep->wait_s = seconds_since(t0);
        s = consume_record(path, std::move(rec.value()), rep, deadline);
    }
    if (sp.active()) trace_consume(sp, path, *rep, s);
    return s;
}

Status Client::consume_record(const std::string& path, Record rec, ConsumeReport* report,
                              Deadline deadline) {
    return lookup_.retry_stale(path, std::move(rec), deadline, [&](const Record& r) {
        return consume_once(path, r, report, deadline);
    });
}

Status Client::consume_with(const std::string& path, const Record& rec, ConsumeReport* report) {
    trace::Span sp("consume", "client");
    ConsumeReport local;
    ConsumeReport* rep = report ? report : &local;
    Status s = consume_record(path, rec, rep, wait_deadline());
    if (sp.active()) trace_consume(sp, path, *rep, s);
    return s;
}

Status Client::consume_once(const std::string& path, const Record& rec, ConsumeReport* report,
                            Deadline deadline) {
    auto up = lookup_.consumer_relative(path);
    if (!up) return up.status();
    // A record is only ever the record of its own path (consume_w_metadata
    // with another file's record must not fetch that other file).
    if (rec.upath != up.value())
        return Status(DYAD_RC_BADMETADATA,
                      "the metadata given is that of '" + rec.upath + "', not of '" + up.value() +
                          "': refused",
                      EINVAL);
    auto svc = link_.service();
    if (!svc) return svc.status();
    auto t0 = std::chrono::steady_clock::now();
    ConsumeReport local;
    ConsumeReport* rep = report ? report : &local;
    if (!fetcher_.settled(up.value(), rec, svc.value(), rep)) {
        Status s = fetcher_.under_lock(up.value(), rec, deadline, rep, [&](int lock_fd) {
            return fetch(up.value(), rec, svc.value(), rep, lock_fd);
        });
        if (!s) return s;
    }
    rep->transfer_s = seconds_since(t0);
    return Status::ok();
}

Status Client::fetch(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                     ConsumeReport* report, int lock_fd) {
    if (is_origin(rec)) return read_through(upath, rec, svc, report, lock_fd);
    return fetcher_.fetch(upath, rec, svc, report, lock_fd);
}

Result<RangeBytes> Client::consume_range(const std::string& path, uint64_t offset, uint64_t length,
                                         ConsumeReport* report, char* into) {
    auto up = lookup_.consumer_relative(path);
    if (!up) return up.status();
    ConsumeReport local;
    ConsumeReport* rep = report ? report : &local;
    RangeBytes out;
    if (into) out.data = {into, [](void*) {}};  // the caller's memory: not freed here
    // Within DYAD_ORIGIN_RECHECK of its last lookup, a path only in the
    // origin is that origin file still: no store, no origin asked. Failing
    // (ESTALE: a block to read from a file that changed), asked again.
    if (auto seen = origin_seen_.recall(up.value())) {
        if (fetcher_.range(up.value(), *seen, offset, length, &out, rep)) return out;
        origin_seen_.forget(up.value());
        *rep = ConsumeReport();
    }
    Status s = range_of(path, up.value(), offset, length, &out, rep);
    if (!s) return s;
    return out;
}

Status Client::range_of(const std::string& path, const std::string& upath, uint64_t offset,
                        uint64_t length, RangeBytes* out, ConsumeReport* rep) {
    const auto t0 = std::chrono::steady_clock::now();
    const Deadline deadline = wait_deadline();
    auto rec = get_metadata(path, true);
    if (!rec) return rec.status();
    rep->wait_s = seconds_since(t0);
    std::optional<Record> used;
    Status s = lookup_.retry_stale(path, std::move(rec.value()), deadline, [&](const Record& r) {
        used = r;
        return fetcher_.range(upath, r, offset, length, out, rep);
    });
    if (s && used && is_origin(*used)) origin_seen_.remember(upath, *used, t0);
    return s;
}

Result<std::vector<proto::ReplicaEntry>> Client::replicas(const std::string& upath,
                                                          const Record& rec) {
    auto svc = link_.service();
    if (!svc) return svc.status();
    return lookup_.replicas(upath, rec, svc.value());
}

Status Client::list(const std::string& prefix, const std::function<bool(const Record&)>& each) {
    return lookup_.list(prefix, each);
}

Result<std::vector<Record>> Client::list() {
    std::vector<Record> out;
    Status s = list("", [&out](const Record& r) {
        out.push_back(r);
        return true;
    });
    if (!s) return s;
    return out;
}

Result<nlohmann::json> Client::service_status(const std::string& uri) {
    return link_.status(uri);
}

Result<ServiceInfo> Client::service() {
    return link_.service();
}

bool Client::reached_service() {
    return link_.reached();
}

std::string Client::key_of(const std::string& upath) const {
    return lookup_.key_of(upath);
}

void Client::reset_after_fork() {
    link_.reset_after_fork();
    owners_.reset_after_fork();
    planner_.reset_after_fork();
}

}  // namespace dyad::client
