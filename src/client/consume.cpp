// SPDX-License-Identifier: Apache-2.0
// The consume core: the steps every consume takes, whether one file alone
// (Client::consume_once, its bytes by any transport) or many small files of
// one owner in one dyad.fetch_many (Fetcher::consume_batch):
//   settled      in place, or a copy of this produce present: nothing moves;
//   under_lock   one consumer per file per node moves it: present once the
//                lock is held, done; else it moves;
//   stage_commit a temporary file beside the target, the bytes, the END
//                trailer checked, renamed into place.
// docs/design.md, "Consumer store", says why a file is installed so. A byte
// range (range.cpp) takes the same first step and writes no file.
#include "fetcher.hpp"

#include "trace_points.hpp"

namespace dyad::client {

bool Fetcher::in_place(const Record& rec, const ServiceInfo& svc) const {
    return !is_origin(rec) &&
           (p_.cfg.shared_storage ||
            (rec.node == svc.node && canonical_path(rec.producer_dir) == p_.cons.path()));
}

bool Fetcher::settled(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                      ConsumeReport* rep) {
    if (in_place(rec, svc)) {
        rep->action = "in-place";
    } else if (p_.cstore.present(upath, rec)) {
        rep->action = "present";
        rep->bytes = 0;
        p_.cache.hit(upath);
    } else {
        return false;
    }
    rep->transport = "none";
    return true;
}

Status Fetcher::under_lock(const std::string& upath, const Record& rec, Deadline deadline,
                           ConsumeReport* rep, const MoveFn& move) {
    // Until the deadline (and while a holder is seen moving the file).
    auto lk = p_.cstore.lock(upath, deadline, p_.cfg.transfer_timeout);
    if (!lk) return lk.status();
    if (p_.cstore.present(upath, rec)) {
        rep->action = "present";
        rep->transport = "none";
        rep->bytes = 0;
        return Status::ok();
    }
    return move(lk.value().get());
}

Status Fetcher::stage_commit(const std::string& upath, const Record& rec, int lock_fd,
                             ConsumeReport* rep, const FillFn& fill) {
    auto staging = p_.cstore.stage(upath, lock_fd);
    if (!staging) return staging.status();
    FileSink& sink = staging.value()->sink();
    trace::Span moving("transfer", "client");
    auto trailer = fill(sink);
    if (moving.active())
        trace_transfer(moving, rec, p_.lookup.key_of(upath), rep->transport, sink.bytes(),
                       trailer.status());
    if (!trailer) return trailer.status();
    trace::Span committing("commit", "client");
    Status s = staging.value()->commit(trailer.value(), rec);
    if (committing.active())
        trace_commit(committing, rec, p_.lookup.key_of(upath), sink.bytes(), s);
    if (!s) return s;
    rep->action = "fetched";
    rep->bytes = sink.bytes();
    p_.cache.installed(upath, sink.bytes());  // then evicts if over capacity
    return Status::ok();
}

proto::FetchRequest Fetcher::request_of(const std::string& upath, const Record& rec,
                                        const std::string& nspace) const {
    proto::FetchRequest r;
    r.upath = upath;
    r.generation = rec.generation;
    // Where the owner finds the record if it restarted since publishing.
    r.ns = nspace;
    r.key = p_.lookup.key_of(upath);
    return r;
}

}  // namespace dyad::client
