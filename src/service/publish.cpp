// SPDX-License-Identifier: Apache-2.0
// dyad.publish, the service's own calls to its metadata store, and the
// re-join after a remote store lost the service: what this service
// published is its PublishLedger (publish_ledger.hpp).
#include <fcntl.h>
#include <sys/stat.h>

#include "common/json_text.hpp"
#include "common/keygen.hpp"
#include "common/log.hpp"
#include "common/paths.hpp"
#include "common/rate_limit.hpp"
#include "common/timeouts.hpp"
#include "common/trace.hpp"
#include "kvs/record.hpp"
#include "proto/publish.hpp"
#include "access.hpp"
#include "handler.hpp"
#include "publisher.hpp"
#include "replica_holder.hpp"

namespace dyad::service {
namespace {
constexpr const char* kSub = "dyadd";
// The trace event of a publish: the file, its key, size and generation.
void trace_published(trace::Span& sp, const std::string& up, const Result<nlohmann::json>& res) {
    sp.arg("path", up).fail(res.status());
    if (!res) return;
    auto a = proto::PublishAnswer::parse(res.value());
    if (!a) return;
    sp.arg("key", a->key).arg("generation", a->version);
    auto size = a->record.find("size");
    if (size != a->record.end() && size->is_number_unsigned())
        sp.arg("size", size->get<uint64_t>());
}

}  // namespace

void Publisher::on_publish(std::shared_ptr<rpc::Request> r) {
    auto req = take_args<proto::PublishRequest>(*r);
    if (!req) return;
    std::string ns = req->ns.value_or(core_.opts.ns);
    if (ns.empty() || ns == kServicesNamespace)
        return r->error(EINVAL, "publish into namespace '" + ns + "' refused", DYAD_RC_BADUNPACK);
    if (Status ok = req->check(); !ok) return r->error(EINVAL, ok.message(), DYAD_RC_BADUNPACK);
    const uint64_t depth = req->key_depth, bins = req->key_bins, replaces = req->replaces;
    // The store is known to be down: said at once (the client asks again
    // until its deadline), not a file thread held until then, which fetches
    // of files already published need.
    if (auto down = core_.store->down()) return r->fail(*down);
    const uint64_t copies = req->replicas.value_or(core_.opts.replicas);
    const bool sync = req->replicas_sync;
    // The store this service hosts answers a put at once (in memory): the
    // publish is done here on the loop, without the two hand-offs to a file
    // thread and back, which were most of a small publish's time
    // (docs/design.md, "A publish of microseconds"). A file of the producer
    // directory is on node-local storage: its open and stat take
    // microseconds. With replicas, or a store elsewhere, a file thread.
    if (!copies && !core_.store->blocks()) {
        trace::Span sp("service.publish", "service");
        auto res = publish(req->upath, ns, static_cast<unsigned>(depth),
                           static_cast<unsigned>(bins), replaces, *r);
        if (sp.active()) trace_published(sp, req->upath, res);
        if (res) return r->end(res.value());
        return r->fail(res.status());
    }
    asio::post(core_.files, [this, r, up = req->upath, ns, depth, bins, replaces, copies, sync] {
        if (r->finished()) return;
        trace::Span sp("service.publish", "service");
        auto res = publish(up, ns, static_cast<unsigned>(depth), static_cast<unsigned>(bins),
                           replaces, *r);
        if (sp.active()) trace_published(sp, up, res);
        if (res && copies) return replicas_.replicate_then_answer(r, res.value(), ns, copies, sync);
        asio::post(core_.io, [r, res] {
            if (res) return r->end(res.value());
            r->fail(res.status());
        });
    });
}

Result<nlohmann::json> Publisher::publish(const std::string& up, const std::string& ns,
                                          unsigned depth, unsigned bins, uint64_t replaces,
                                          const rpc::Request& from) {
    auto fd = open_served_file(up);
    if (!fd) return Status(fd.status()).wrap("cannot publish");
    struct stat sb;
    if (::fstat(fd->get(), &sb) != 0)
        return Status(DYAD_RC_BADFIO, "cannot publish '" + up + "': stat failed", errno);
    if (Status one = one_name(up, sb); !one) return one.wrap("cannot publish");
    if (Status may = may_publish(from, up, sb); !may) return may;
    kvs::Record rec = record_of(up, sb);
    auto key = gen_path_key(up, depth, bins);
    if (!key) return key.status();
    auto gate = ledger_.publishing();
    // Published before the store says so: a consumer woken by the put may
    // ask for the file at once.
    // (Generation 0 until the store answers: not checked meanwhile.)
    Published pub = Published::of(sb, ns, key.value());
    pub.uid = from.peer().uid;
    auto before = ledger_.begin(up, pub);
    auto v = core_.calls.put(ns, key.value(), rec.to_json().dump(-1, ' ', false, kBadUtf8Replaced),
                             replaces);
    ledger_.end(up, std::move(pub), v, before);
    if (!v) return Status(v.status()).wrap("cannot publish '" + up + "'");
    published_++;
    return proto::PublishAnswer{v.value(), key.value(), rec.to_json()}.build();
}

// Without a key, a user other than dyadd's and root publishes only a file
// it proved it can open (the descriptor its client passed over the Unix
// socket: over TCP none can pass), and only one no other user published
// (docs/security.md, "The node-wide service"). A descriptor that came is
// checked whoever sent it.
Status Publisher::may_publish(const rpc::Request& from, const std::string& up,
                              const struct stat& sb) {
    const rpc::Peer& peer = from.peer();
    const bool must_prove = !core_.key && !peer.trusted;
    if (!must_prove && !from.passed_file()) return Status::ok();
    Status ok = check_passed_file(from.passed_file(), sb, up, peer_text(peer));
    if (ok && must_prove) ok = may_change(peer, up, "publish", true);
    if (!ok) refused_not_producer_++;
    return ok;
}

void Publisher::on_unpublish(std::shared_ptr<rpc::Request> r) {
    auto req = take_args<proto::UnpublishRequest>(*r);
    if (!req) return;
    std::string ns = req->ns.value_or(core_.opts.ns);
    if (ns.empty() || ns == kServicesNamespace)
        return r->error(EINVAL, "unpublish in namespace '" + ns + "' refused", DYAD_RC_BADUNPACK);
    if (req->key_depth > 64 || req->key_bins == 0 || req->key_bins > (1u << 30))
        return r->error(EINVAL, "key_depth must be 0..64 and key_bins 1..2^30", DYAD_RC_BADUNPACK);
    const auto depth = static_cast<unsigned>(req->key_depth);
    const auto bins = static_cast<unsigned>(req->key_bins);
    asio::post(core_.files, [this, r, up = req->upath, ns, depth, bins] {
        if (r->finished()) return;
        Status may = may_change(r->peer(), up, "unpublish", false);
        if (!may) refused_not_producer_++;
        auto res = may ? unpublish(up, ns, depth, bins) : Result<nlohmann::json>(may);
        asio::post(core_.io, [r, res] {
            if (res) return r->end(res.value());
            r->fail(res.status());
        });
    });
}

// Only this service's own record goes; the file stays where it is.
Result<nlohmann::json> Publisher::unpublish(const std::string& up, const std::string& ns,
                                            unsigned depth, unsigned bins) {
    auto key = gen_path_key(up, depth, bins);
    if (!key) return key.status();
    auto gate = ledger_.publishing();
    auto e = core_.calls.get(ns, key.value());
    if (!e && e.status().rc() == DYAD_RC_NOTFOUND)
        return Status(DYAD_RC_NOTFOUND,
                      "'" + up + "' is not published (no record in namespace '" + ns +
                          "'): nothing to unpublish",
                      ENOENT);
    if (!e) return Status(e.status()).wrap("cannot unpublish '" + up + "'");
    auto owner = proto::record_owner(e->value);
    auto rec_up = kvs::Record::from_json(e->value, e->version);
    if (rec_up && rec_up->upath != up)
        return Status(DYAD_RC_NOTFOUND,
                      "'" + up + "' is not published (its key holds the record of '" +
                          rec_up->upath + "'): nothing to unpublish",
                      ENOENT);
    if (owner && *owner != core_.id)
        return Status(DYAD_RC_NOAUTH,
                      "'" + up + "' was produced by service '" + *owner + "', not this one (" +
                          core_.id + "): only its owner's node can unpublish it",
                      EPERM);
    Status s =
        core_.store->remove(ns, key.value(), core_.id, Deadline::after(timeouts::kStoreCall));
    if (!s && s.rc() == DYAD_RC_NOTFOUND)
        return Status(DYAD_RC_NOTFOUND,
                      "'" + up + "' is not published (no record in namespace '" + ns +
                          "'): nothing to unpublish",
                      ENOENT);
    if (!s) return Status(s).wrap("cannot unpublish '" + up + "'");
    ledger_.forget(up);
    // Its replicas go too, after the answer (replicas.hpp, forget()).
    if (rec_up) replicas_.forget(ns, key.value(), rec_up.value());
    DYAD_INFO(kSub, "unpublished '%s' (key %s in namespace %s); the file stays on disk", up.c_str(),
              key->c_str(), ns.c_str());
    return proto::UnpublishAnswer{key.value(), e->version}.build();
}

kvs::Record Publisher::own_record(const std::string& up) const {
    kvs::Record rec;
    rec.upath = up;
    rec.owner = core_.id;
    rec.node = core_.opts.node;
    rec.producer_dir = core_.prod_dir;
    rec.endpoints = core_.endpoints;
    rec.rank = core_.rank;
    return rec;
}

kvs::Record Publisher::record_of(const std::string& up, const struct stat& sb) const {
    kvs::Record rec = own_record(up);
    rec.size = static_cast<uint64_t>(sb.st_size);
    rec.mtime_ns = static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000LL + sb.st_mtim.tv_nsec;
    rec.mode = sb.st_mode & 07777;
    rec.ino = static_cast<uint64_t>(sb.st_ino);
    return rec;
}

Status Publisher::check_served(const proto::FetchRequest& req, const struct stat& sb,
                               const std::string& up, Snapshot* snap) {
    if (Status one = one_name(up, sb); !one) return one;
    PublishLedger::Wanted want{
        req.ns, req.key, req.generation ? std::optional<uint64_t>(req.generation) : std::nullopt};
    *snap = Snapshot::of(sb);
    return ledger_.check(
        core_.id, up, sb, want,
        [this](const std::string& ns, const std::string& key) { return core_.calls.get(ns, key); });
}

// ---- putting the service back into a store that lost it ----

bool Publisher::republish(const std::function<bool()>& stopping, uint64_t& republished) {
    uint64_t again = 0, changed = 0, failed = 0;
    for (const auto& [up, pub] : ledger_.to_republish()) {
        if (stopping()) return true;
        // One at a time with publishes: a publish of the same file while
        // this one is in flight would otherwise be overtaken by it.
        auto gate = ledger_.republishing();
        if (!ledger_.current(up, pub.generation)) continue;
        // Only a file still exactly as published (it would not be served
        // otherwise): its record as publish() would write it now.
        auto fd = open_served_file(up);
        struct stat sb;
        if (!fd || ::fstat(fd->get(), &sb) != 0 || !pub.unchanged(sb)) {
            ++changed;
            continue;
        }
        auto rec = record_of(up, sb);
        auto put =
            core_.store->put(pub.ns, pub.key, rec.to_json().dump(-1, ' ', false, kBadUtf8Replaced),
                             core_.id, 0, Deadline::after(timeouts::kRegister));
        if (!put) {
            ++failed;
            DYAD_WARN(kSub, "cannot publish '%s' again: %s", up.c_str(),
                      put.status().to_string().c_str());
            if (put.status().rc() == DYAD_RC_CONNFAIL) return false;  // gone again
            continue;
        }
        ledger_.republished(up, pub.generation, put.value());
        ++again;
        ++republished;
    }
    DYAD_INFO(kSub,
              "registered again in the metadata store at %s; published again %llu files (%llu "
              "changed since, not published; %llu failed)",
              core_.opts.kvs_uri.c_str(), static_cast<unsigned long long>(again),
              static_cast<unsigned long long>(changed), static_cast<unsigned long long>(failed));
    return true;
}

// ---- the store's host across its own restart ----

Status Publisher::restore() {
    if (!core_.opts.open_journal) return Status::ok();
    const std::string dir = core_.state_dir();
    auto opened = core_.opts.open_journal(dir, core_.id, core_.prod_dir);
    if (!opened) return opened.status();
    auto journal = std::move(opened.value());
    auto rows = journal->load();
    if (!rows) return rows.status();
    const std::string where = journal->describe();
    if (!core_.store->hosted()) {
        // Another dyadd's store or etcd keeps this service's records across
        // this restart: the durable copy starts again from this run's publishes.
        if (Status c = journal->clear(); !c) return c;
        ledger_.attach(std::move(journal));
        return Status::ok();
    }
    // The store this service hosts started empty (a new epoch): what this
    // service published before goes back in, each file only if it is still
    // exactly as published (it would not be served otherwise), with its
    // record as publish() would write it now (endpoints may have changed) and
    // a generation of the new epoch, above every earlier one. Nothing is
    // served yet; the durable copy is replaced in one transaction at the end
    // (a crash before it finds the old rows again).
    uint64_t again = 0, changed = 0, failed = 0;
    LedgerJournal::Rows kept;
    kept.reserve(rows->size());
    for (auto& [up, pub] : rows.value()) {
        auto fd = open_served_file(up);
        struct stat sb;
        if (!fd || ::fstat(fd->get(), &sb) != 0 || !pub.unchanged(sb) || !one_name(up, sb)) {
            ++changed;
            static log::RateLimit limit(kSub, "files not published again");
            if (limit.allow())
                DYAD_INFO(kSub,
                          "'%s' changed or went away since it was published (generation %llu): "
                          "not published again (produce it again to serve it)",
                          up.c_str(), static_cast<unsigned long long>(pub.generation));
            continue;
        }
        auto rec = record_of(up, sb);
        auto put = core_.calls.put(pub.ns, pub.key,
                                   rec.to_json().dump(-1, ' ', false, kBadUtf8Replaced), 0);
        if (!put) {
            ++failed;
            DYAD_WARN(kSub, "cannot publish '%s' again: %s (produce it again)", up.c_str(),
                      put.status().to_string().c_str());
            continue;
        }
        pub.generation = put.value();
        ledger_.restore(up, pub);
        kept.emplace_back(up, std::move(pub));
        ++again;
    }
    if (Status s = journal->replace(kept); !s) return s;
    ledger_.attach(std::move(journal));
    if (again + changed + failed > 0)
        DYAD_INFO(kSub,
                  "published again %llu files this service published before it restarted (from "
                  "%s; %llu changed or removed since, not published; %llu failed)",
                  static_cast<unsigned long long>(again), where.c_str(),
                  static_cast<unsigned long long>(changed),
                  static_cast<unsigned long long>(failed));
    return Status::ok();
}

Result<UniqueFd> Publisher::open_served_file(const std::string& up) {
    auto f = ServedFile::open(core_.prod_fd.get(), core_.prod_dir, up);
    if (!f) return f.status();
    struct stat sb;
    if (::fstat(f->fd(), &sb) != 0)
        return Status(DYAD_RC_BADFIO, "stat of '" + up + "' failed", errno);
    if (Status kind = served_kind(up, sb); !kind) return kind;
    f->make_blocking();
    return f->release();
}

Status Publisher::may_change(const rpc::Peer& peer, const std::string& up, const char* what,
                             bool absent_ok) {
    if (core_.key || peer.trusted) return Status::ok();
    auto pub = ledger_.find(up);
    if (!pub && absent_ok) return Status::ok();
    if (!pub || pub->uid < 0 || peer.uid < 0 || pub->uid != peer.uid) {
        const std::string by = !pub           ? std::string("no user of this node")
                               : pub->uid < 0 ? std::string("a user this service no longer knows")
                                              : "uid " + std::to_string(pub->uid);
        return Status(DYAD_RC_NOAUTH,
                      std::string("cannot ") + what + " '" + up + "' for " + peer_text(peer) +
                          ": it was published by " + by +
                          "; without a key only that user, "
                          "dyadd's own (uid " +
                          std::to_string(::geteuid()) + ") and root may " + what + " it",
                      EPERM);
    }
    return Status::ok();
}

}  // namespace dyad::service
