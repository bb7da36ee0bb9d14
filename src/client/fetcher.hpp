// SPDX-License-Identifier: Apache-2.0
// The fetcher: the one path a file's bytes take into the consumer
// directory (or, for a range, into memory). Every consume goes through its
// core (consume.cpp): settled (nothing to move), under_lock (one consumer
// per file per node moves it), stage_commit (a temporary file, the bytes,
// the END checked, renamed into place). The bytes come from a Source: the
// record's owner, or a replica's holder in its place (failover.cpp), over
// one transport of the plan (fetch.cpp); a byte range from the same source
// into memory (range.cpp); many small files of one owner in one request
// (fetch_many.cpp). Origin files (DYAD_PATH_ORIGIN) are copied by the
// client's read-through (origin.cpp) through the same core.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache.hpp"
#include "common/config.hpp"
#include "common/deadline.hpp"
#include "common/paths.hpp"
#include "common/status.hpp"
#include "consumer_store.hpp"
#include "dtl/dtl.hpp"
#include "lookup.hpp"
#include "origin.hpp"
#include "origin_blocks.hpp"
#include "owners.hpp"
#include "planner.hpp"
#include "proto/fetch.hpp"
#include "record.hpp"
#include "report.hpp"
#include "service_link.hpp"
#include "timeouts.hpp"

namespace dyad::client {

// Where a file's bytes are asked for: the service that answers (the
// record's owner, or the holder of a replica of the same generation in its
// place), its endpoint, and how long connecting to it may take (shorter
// while a replica could serve the file instead).
struct Source {
    std::string service;   // who must answer at the endpoint (it proves it with a key)
    std::string endpoint;  // "" if the record lists none reachable
    double connect_s = timeouts::kControl;
    bool replica = false;  // a replica fetch (the holder checks its copy's generation)

    // The record's owner.
    static Source owner(const Record& rec, const ServiceInfo& svc,
                        double connect_s = timeouts::kControl);
    // The holder of the replica `r` of rec.
    static Source holder(const proto::ReplicaEntry& r, const Record& rec, const ServiceInfo& svc);
};

class Fetcher {
  public:
    struct Parts {
        const Config& cfg;
        const ManagedDir& cons;
        ConsumerStore& cstore;
        Cache& cache;
        const Origin& origin;
        ServiceLink& link;
        OwnerDirectory& owners;
        TransportPlanner& planner;
        Lookup& lookup;
    };
    explicit Fetcher(const Parts& p) : p_(p), blocks_(p.cons.path()) {}

    // ---- The consume core (consume.cpp) ----
    // The in-place rule: same node and same directory, or storage shared by
    // all nodes (DYAD_SHARED_STORAGE): the file is already where it is wanted.
    bool in_place(const Record& rec, const ServiceInfo& svc) const;
    // Nothing to move: in place, or a copy of this produce present (said in
    // *rep: action, transport "none", no bytes). No lock is needed to see a
    // whole file.
    bool settled(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                 ConsumeReport* rep);
    // Under the file's lock (waited for until `deadline`; one consumer per
    // file per node moves it, the others wait, then find it present): done
    // if present by then, else move(lock_fd).
    using MoveFn = std::function<Status(int lock_fd)>;
    Status under_lock(const std::string& upath, const Record& rec, Deadline deadline,
                      ConsumeReport* rep, const MoveFn& move);
    // Stages the file (beside its target, under lock_fd), lets `fill`
    // write its bytes into the sink and give the END trailer, checks and
    // commits it, and says "fetched" in *rep.
    using FillFn = std::function<Result<nlohmann::json>(FileSink& sink)>;
    Status stage_commit(const std::string& upath, const Record& rec, int lock_fd,
                        ConsumeReport* rep, const FillFn& fill);
    // What every fetch asks for a file: its path, its generation, where its
    // record is.
    proto::FetchRequest request_of(const std::string& upath, const Record& rec,
                                   const std::string& nspace) const;

    // ---- Sources (failover.cpp) ----
    // lock_fd: the file's lock (ConsumerStore::lock), held meanwhile.
    // From the owner, then, if it is gone or the fetch fails mid-way, from a
    // replica of the same generation (docs/design.md, "Replicas").
    Status fetch(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                 ConsumeReport* rep, int lock_fd);

    // ---- A byte range into memory (range.cpp) ----
    // [offset, offset + length) of `rec` into out->data (the caller's if set
    // on entry, else allocated): read here when the file is (in place, a
    // copy present, the origin's), else fetched from its owner.
    Status range(const std::string& upath, const Record& rec, uint64_t offset, uint64_t length,
                 RangeBytes* out, ConsumeReport* rep);

    // ---- Many small files of one owner in one request (fetch_many.cpp) ----
    // The endpoint to ask for `rec` with many others in one dyad.fetch_many,
    // if it may travel so: a small file, to be fetched (not in place), over
    // the stream transport.
    std::optional<std::string> batch_endpoint(const Record& rec, const ServiceInfo& svc);
    // Fetches the files `which` (indices into upaths and records) from the
    // owner at `ep` in one request; calls finish for each file it installs
    // or finds present, and returns those left to fetch alone (refused by
    // the owner, or not answered).
    using FinishFn = std::function<void(size_t, Status, const ConsumeReport&)>;
    std::vector<size_t> consume_batch(const std::vector<size_t>& which,
                                      const std::vector<std::string>& upaths,
                                      const std::vector<Record>& records, const ServiceInfo& svc,
                                      const std::string& ep, const FinishFn& finish,
                                      std::chrono::steady_clock::time_point t0);

  private:
    // ---- fetch.cpp: one source, the transports of the plan in turn ----
    Status from_source(const std::string& upath, const Record& rec, const Source& src,
                       const ServiceInfo& svc, ConsumeReport* rep, int lock_fd);
    // One attempt over one transport; *retry says another may still work
    // (nothing was received and the failure is this transport's).
    Status fetch_via(const dtl::Backend& b, const Source& src, const std::string& upath,
                     const Record& rec, const std::string& nspace, ConsumeReport* rep, int lock_fd,
                     bool* retry);
    // The one path of bytes: `req` (request_of, maybe with a range or as a
    // replica fetch) to `src` over `b`, its bytes into `sink`; the END
    // trailer. `received`: the bytes the sink has taken.
    Result<nlohmann::json> receive(const dtl::Backend& b, const Source& src,
                                   proto::FetchRequest req, dtl::Sink& sink,
                                   const std::function<uint64_t()>& received, bool* retry);
    // receive()'s failure to connect to `src`, said for a user.
    Status unreachable(const Source& src, const std::string& upath, const Status& e);
    // ---- failover.cpp ----
    Status from_replicas(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                         ConsumeReport* rep, int lock_fd, const Status& why);
    // ---- range.cpp ----
    // The range read here (in place, present, origin); nullopt: not here.
    std::optional<Status> range_here(const std::string& upath, const Record& rec,
                                     const ServiceInfo& svc, uint64_t offset, uint64_t length,
                                     char* dst, ConsumeReport* rep);
    Status range_fetched(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                         uint64_t offset, uint64_t length, char* dst, ConsumeReport* rep);
    // ---- fetch_many.cpp ----
    proto::FetchManyRequest batch_request(const std::vector<size_t>& which,
                                          const std::vector<std::string>& upaths,
                                          const std::vector<Record>& records,
                                          const ServiceInfo& svc) const;
    // The settled files of `which` finished; the others returned.
    std::vector<size_t> unsettled(const std::vector<size_t>& which,
                                  const std::vector<std::string>& upaths,
                                  const std::vector<Record>& records, const ServiceInfo& svc,
                                  const FinishFn& finish, std::chrono::steady_clock::time_point t0);
    // One served file of a dyad.fetch_many, all its bytes here: installed
    // whole without a lock where the file system allows, else under its
    // lock, staged and committed as a lone fetch's.
    Status install_answer(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                          const Sent& sent, const std::string& bytes, ConsumeReport* rep);

    Parts p_;
    OriginBlocks blocks_;                     // origin files' blocks kept (range reads)
    std::atomic<bool> no_fetch_many_{false};  // an owner did not know dyad.fetch_many
};

}  // namespace dyad::client
