// SPDX-License-Identifier: Apache-2.0
// The service's side of replicas (replicas.hpp; docs/design.md,
// "Replicas"): the Replicas object made at start, dyad.replicate (a holder
// asked by an owner), and the pushes after a publish.
#include <fcntl.h>

#include "common/log.hpp"
#include "common/paths.hpp"
#include "proto/identity.hpp"
#include "proto/publish.hpp"
#include "proto/replica.hpp"
#include "serve_file.hpp"
#include "service.hpp"

namespace dyad::service {
namespace {
constexpr const char* kSub = "replicas";
constexpr double kStoreTimeout = 30.0;
}  // namespace

Status Service::start_replicas() {
    ReplicaOptions ro;
    ro.k = opts_.replicas;
    ro.space = opts_.replica_space;
    const std::string state =
        opts_.state_dir.empty() ? prod_dir_ + "/" + kReservedDir : opts_.state_dir;
    ro.root = state + "/replicas";
    Replicas::Hooks hooks;
    hooks.get = [this](const std::string& ns, const std::string& key) {
        return store_get(ns, key);
    };
    hooks.put = [this](const std::string& ns, const std::string& key, const std::string& value) {
        return store_put(ns, key, value);
    };
    hooks.remove = [this](const std::string& ns, const std::string& key) {
        return store_->remove(ns, key, id_, Deadline::after(kStoreTimeout));
    };
    hooks.list = [this](const std::string& ns, const std::string& prefix)
        -> Result<std::vector<std::pair<std::string, kvs::Entry>>> {
        auto page = store_->list(ns, prefix, "", kvs::kPageLimit, Deadline::after(kStoreTimeout));
        if (!page) return page.status();
        return std::move(page->entries);
    };
    hooks.services = [this]() -> Result<std::map<std::string, std::vector<std::string>>> {
        std::map<std::string, std::vector<std::string>> out;
        std::string after;
        for (int pages = 0; pages < 64; ++pages) {
            auto page = store_->list(kServicesNamespace, "", after, kvs::kPageLimit,
                                     Deadline::after(kStoreTimeout));
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
    rpc::Credentials creds;
    creds.key = key_;
    creds.role = "service";
    creds.service_id = id_;
    replicas_ = std::make_unique<Replicas>(id_, opts_.node, endpoints_, ro, std::move(hooks),
                                           std::move(creds), opts_.pull_replica);
    if (opts_.replicas)
        DYAD_INFO(kSub,
                  "%llu replica(s) of every file published here unless its producer says "
                  "otherwise (DYAD_REPLICAS)",
                  static_cast<unsigned long long>(opts_.replicas));
    return Status::ok();
}

Result<ServedFile> Service::open_replica(const proto::FetchRequest& req) {
    if (!replicas_ || !req.ns || req.ns->empty())
        return Status(DYAD_RC_BADFETCH,
                      "service " + id_ + " holds no replica of '" + req.upath + "'", ENOENT);
    const std::string dir = replicas_->dir_of(*req.ns);
    UniqueFd d(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    if (!d.valid())
        return Status(DYAD_RC_BADFETCH,
                      "service " + id_ + " holds no replica of '" + req.upath + "'", ENOENT);
    return ServedFile::open(d.get(), dir, req.upath);
}

void Service::on_replicate(std::shared_ptr<rpc::Request> r) {
    // Only another service, proving it with the job's key, asks for one
    // (the store then says whether it owns the file).
    const std::string from = r->peer_service();
    if (from.empty() || from == id_)
        return r->error(EPERM, "dyad.replicate is a request of one service to another",
                        DYAD_RC_NOAUTH);
    if (!replicas_ || !opts_.pull_replica)
        return r->error(EOPNOTSUPP, "service " + id_ + " holds no replicas", DYAD_RC_BADRPC);
    auto req = proto::ReplicateRequest::parse(r->args());
    if (!req) return r->error(EPROTO, req.status().message(), req.status().rc());
    auto up = normalize_upath(req->upath);
    if (!up) return r->error(up.status().err(), up.status().message(), up.status().rc());
    req->upath = up.value();
    auto slot = replicas_->take_pull_slot();
    if (!slot) return r->error(EBUSY, slot.status().message(), slot.status().rc());
    asio::post(replica_pool_,
               [this, r, req = std::move(req.value()), from, slot = std::move(slot.value())] {
                   if (r->finished()) return;
                   auto res = replicas_->hold(req, from);
                   asio::post(io_, [r, res] {
                       if (res) return r->end(res.value());
                       Status st = res.status();
                       r->error(st.err() ? st.err() : EIO, st.message(), st.rc());
                   });
               });
}

void Service::on_replicate_many(std::shared_ptr<rpc::Request> r) {
    // As dyad.replicate, for several files of one namespace: one pull slot,
    // one batched pull.
    const std::string from = r->peer_service();
    if (from.empty() || from == id_)
        return r->error(EPERM, "dyad.replicate_many is a request of one service to another",
                        DYAD_RC_NOAUTH);
    if (!replicas_ || !opts_.pull_replica)
        return r->error(EOPNOTSUPP, "service " + id_ + " holds no replicas", DYAD_RC_BADRPC);
    auto batch = proto::ReplicateBatch::parse(r->args());
    if (!batch) return r->error(EPROTO, batch.status().message(), batch.status().rc());
    for (auto& f : batch->files) {
        auto up = normalize_upath(f.upath);
        if (!up) return r->error(up.status().err(), up.status().message(), up.status().rc());
        f.upath = up.value();
    }
    auto slot = replicas_->take_pull_slot();
    if (!slot) return r->error(EBUSY, slot.status().message(), slot.status().rc());
    asio::post(replica_pool_,
               [this, r, batch = std::move(batch.value()), from, slot = std::move(slot.value())] {
                   if (r->finished()) return;
                   auto answer = replicas_->hold_many(batch, from).build();
                   asio::post(io_, [r, answer = std::move(answer)] { r->end(answer); });
               });
}

void Service::on_unreplicate(std::shared_ptr<rpc::Request> r) {
    // Only another service, proving it with the job's key; the holder then
    // checks it is the owner it recorded for the replica.
    const std::string from = r->peer_service();
    if (from.empty() || from == id_)
        return r->error(EPERM, "dyad.unreplicate is a request of one service to another",
                        DYAD_RC_NOAUTH);
    if (!replicas_)
        return r->error(EOPNOTSUPP, "service " + id_ + " holds no replicas", DYAD_RC_BADRPC);
    auto req = proto::UnreplicateRequest::parse(r->args());
    if (!req) return r->error(EPROTO, req.status().message(), req.status().rc());
    auto up = normalize_upath(req->upath);
    if (!up) return r->error(up.status().err(), up.status().message(), up.status().rc());
    req->upath = up.value();
    asio::post(replica_pool_, [this, r, req = std::move(req.value()), from] {
        if (r->finished()) return;
        auto res = replicas_->unhold(req, from);
        asio::post(io_, [r, res] {
            if (res) return r->end(res.value());
            Status st = res.status();
            r->error(st.err() ? st.err() : EIO, st.message(), st.rc());
        });
    });
}

void Service::replicate_then_answer(const std::shared_ptr<rpc::Request>& r, nlohmann::json answer,
                                    const std::string& ns, uint64_t k, bool sync) {
    auto pub = proto::PublishAnswer::parse(answer);
    auto rec = pub ? kvs::Record::from_json(pub->record.dump(), pub->version)
                   : Result<kvs::Record>(pub.status());
    if (!rec || !replicas_) {
        if (!rec) DYAD_WARN(kSub, "no replicas: %s", rec.status().to_string().c_str());
        return asio::post(io_, [r, answer] { r->end(answer); });
    }
    if (!sync) {
        replicas_->push(ns, pub->key, rec.value(), k, nullptr);
        return asio::post(io_, [r, answer] { r->end(answer); });
    }
    replicas_->push(
        ns, pub->key, rec.value(), k, [this, r, answer, k](Result<uint64_t> copies) mutable {
            asio::post(io_, [r, answer = std::move(answer), copies, k]() mutable {
                if (!copies) {
                    Status st = copies.status();
                    return r->error(st.err() ? st.err() : EIO, st.message(), st.rc());
                }
                answer["replicas"] = copies.value();
                if (copies.value() < k)
                    answer["replicas_warning"] =
                        std::to_string(copies.value()) + " of the " + std::to_string(k) +
                        " replicas asked for were made (too few other services "
                        "took one: see their logs)";
                r->end(answer);
            });
        });
}

}  // namespace dyad::service
