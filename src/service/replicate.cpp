// SPDX-License-Identifier: Apache-2.0
// The service's side of replicas (replicas.hpp; docs/design.md,
// "Replicas"): the Replicas object made at start, dyad.replicate (a holder
// asked by an owner), and the pushes after a publish.
#include <fcntl.h>

#include "common/log.hpp"
#include "common/paths.hpp"
#include "common/timeouts.hpp"
#include "proto/identity.hpp"
#include "proto/publish.hpp"
#include "proto/replica.hpp"
#include "serve_file.hpp"
#include "handler.hpp"
#include "replica_holder.hpp"

namespace dyad::service {
namespace {
constexpr const char* kSub = "replicas";
}  // namespace

Status ReplicaHolder::start() {
    ReplicaOptions ro;
    ro.k = core_.opts.replicas;
    ro.space = core_.opts.replica_space;
    ro.root = core_.state_dir() + "/replicas";
    rpc::Credentials creds;
    creds.key = core_.key;
    creds.role = "service";
    creds.service_id = core_.id;
    replicas_ = std::make_unique<Replicas>(core_.id, core_.opts.node, core_.endpoints, ro, hooks(),
                                           std::move(creds), core_.opts.pull_replica);
    if (core_.opts.replicas)
        DYAD_INFO(kSub,
                  "%llu replica(s) of every file published here unless its producer says "
                  "otherwise (DYAD_REPLICAS)",
                  static_cast<unsigned long long>(core_.opts.replicas));
    return Status::ok();
}

std::string from_other_service(rpc::Request& r, const std::string& self) {
    std::string from = r.peer_service();
    if (!from.empty() && from != self) return from;
    r.error(EPERM, r.topic() + " is a request of one service to another", DYAD_RC_NOAUTH);
    return "";
}

// What the service lends its replicas: its metadata store and registry.
Replicas::Hooks ReplicaHolder::hooks() {
    Replicas::Hooks hooks;
    hooks.get = [this](const std::string& ns, const std::string& key) {
        return core_.calls.get(ns, key);
    };
    hooks.put = [this](const std::string& ns, const std::string& key, const std::string& value) {
        return core_.calls.put(ns, key, value);
    };
    hooks.remove = [this](const std::string& ns, const std::string& key) {
        return core_.store->remove(ns, key, core_.id, Deadline::after(timeouts::kStoreCall));
    };
    hooks.list = [this](const std::string& ns, const std::string& prefix)
        -> Result<std::vector<std::pair<std::string, kvs::Entry>>> {
        auto page = core_.store->list(ns, prefix, "", kvs::kPageLimit,
                                      Deadline::after(timeouts::kStoreCall));
        if (!page) return page.status();
        return std::move(page->entries);
    };
    hooks.services = [this]() -> Result<std::map<std::string, std::vector<std::string>>> {
        std::map<std::string, std::vector<std::string>> out;
        std::string after;
        for (int pages = 0; pages < 64; ++pages) {
            auto page = core_.store->list(kServicesNamespace, "", after, kvs::kPageLimit,
                                          Deadline::after(timeouts::kStoreCall));
            if (!page) return page.status();
            for (const auto& [id, e] : page->entries) {
                auto j = nlohmann::json::parse(e.value, nullptr, false);
                if (j.is_discarded()) continue;
                auto who = proto::Identity::parse(j);
                if (who && who->service_id == id) out[id] = who->endpoints;
            }
            if (!page->more || page->entries.empty()) break;
            after = page->entries.back().first;
        }
        return out;
    };
    return hooks;
}

void ReplicaHolder::shutdown() {
    pool_.stop();  // (a pull in progress ends first)
    pool_.join();
    replicas_.reset();
}

Status ReplicaHolder::check(const proto::FetchRequest& req, const ServedFile& f) {
    if (!replicas_ || !req.ns) return Status(DYAD_RC_BADFETCH, "no replica held here", ENOENT);
    return replicas_->check(*req.ns, f.upath(), req.generation, f.stat());
}

void ReplicaHolder::forget(const std::string& ns, const std::string& key, const kvs::Record& rec) {
    if (replicas_) replicas_->forget(ns, key, rec);
}

Result<ServedFile> ReplicaHolder::open(const proto::FetchRequest& req) {
    if (!replicas_ || !req.ns || req.ns->empty())
        return Status(DYAD_RC_BADFETCH,
                      "service " + core_.id + " holds no replica of '" + req.upath + "'", ENOENT);
    const std::string dir = replicas_->dir_of(*req.ns);
    UniqueFd d(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    if (!d.valid())
        return Status(DYAD_RC_BADFETCH,
                      "service " + core_.id + " holds no replica of '" + req.upath + "'", ENOENT);
    return ServedFile::open(d.get(), dir, req.upath);
}

void ReplicaHolder::on_replicate(std::shared_ptr<rpc::Request> r) {
    // Only another service, proving it with the job's key, asks for one
    // (the store then says whether it owns the file).
    const std::string from = from_other_service(*r, core_.id);
    if (from.empty()) return;
    if (!replicas_ || !core_.opts.pull_replica)
        return r->error(EOPNOTSUPP, "service " + core_.id + " holds no replicas", DYAD_RC_BADRPC);
    auto req = take_args<proto::ReplicateRequest>(*r);
    if (!req) return;
    auto slot = replicas_->take_pull_slot();
    if (!slot) return r->fail(slot.status());
    asio::post(pool_,
               [this, r, req = std::move(req.value()), from, slot = std::move(slot.value())] {
                   if (r->finished()) return;
                   auto res = replicas_->hold(req, from);
                   asio::post(core_.io, [r, res] {
                       if (res) return r->end(res.value());
                       r->fail(res.status());
                   });
               });
}

void ReplicaHolder::on_replicate_many(std::shared_ptr<rpc::Request> r) {
    // As dyad.replicate, for several files of one namespace: one pull slot,
    // one batched pull.
    const std::string from = from_other_service(*r, core_.id);
    if (from.empty()) return;
    if (!replicas_ || !core_.opts.pull_replica)
        return r->error(EOPNOTSUPP, "service " + core_.id + " holds no replicas", DYAD_RC_BADRPC);
    auto batch = rpc::args_as<proto::ReplicateBatch>(*r);
    if (!batch) return;
    for (auto& f : batch->files) {
        auto up = normalize_upath(f.upath);
        if (!up) return r->fail(up.status());
        f.upath = up.value();
    }
    auto slot = replicas_->take_pull_slot();
    if (!slot) return r->fail(slot.status());
    asio::post(pool_,
               [this, r, batch = std::move(batch.value()), from, slot = std::move(slot.value())] {
                   if (r->finished()) return;
                   auto answer = replicas_->hold_many(batch, from).build();
                   asio::post(core_.io, [r, answer = std::move(answer)] { r->end(answer); });
               });
}

void ReplicaHolder::on_unreplicate(std::shared_ptr<rpc::Request> r) {
    // Only another service, proving it with the job's key; the holder then
    // checks it is the owner it recorded for the replica.
    const std::string from = from_other_service(*r, core_.id);
    if (from.empty()) return;
    if (!replicas_)
        return r->error(EOPNOTSUPP, "service " + core_.id + " holds no replicas", DYAD_RC_BADRPC);
    auto req = take_args<proto::UnreplicateRequest>(*r);
    if (!req) return;
    asio::post(pool_, [this, r, req = std::move(req.value()), from] {
        if (r->finished()) return;
        auto res = replicas_->unhold(req, from);
        asio::post(core_.io, [r, res] {
            if (res) return r->end(res.value());
            r->fail(res.status());
        });
    });
}

void ReplicaHolder::replicate_then_answer(const std::shared_ptr<rpc::Request>& r,
                                          nlohmann::json answer, const std::string& ns, uint64_t k,
                                          bool sync) {
    auto pub = proto::PublishAnswer::parse(answer);
    auto rec = pub ? kvs::Record::from_json(pub->record.dump(), pub->version)
                   : Result<kvs::Record>(pub.status());
    if (!rec || !replicas_) {
        if (!rec) DYAD_WARN(kSub, "no replicas: %s", rec.status().to_string().c_str());
        return asio::post(core_.io, [r, answer] { r->end(answer); });
    }
    if (!sync) {
        replicas_->push(ns, pub->key, rec.value(), k, nullptr);
        return asio::post(core_.io, [r, answer] { r->end(answer); });
    }
    replicas_->push(
        ns, pub->key, rec.value(), k, [this, r, answer, k](Result<uint64_t> copies) mutable {
            asio::post(core_.io, [r, answer = std::move(answer), copies, k]() mutable {
                if (!copies) return r->fail(copies.status());
                auto a = proto::PublishAnswer::parse(answer);
                if (!a) return r->end(answer);  // (built by publish(): not reached)
                a->replicas = copies.value();
                if (copies.value() < k)
                    a->replicas_warning = std::to_string(copies.value()) + " of the " +
                                          std::to_string(k) +
                                          " replicas asked for were made (too few other services "
                                          "took one: see their logs)";
                r->end(a->build());
            });
        });
}

}  // namespace dyad::service
