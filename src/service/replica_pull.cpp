// SPDX-License-Identifier: Apache-2.0
// dyadd's replica puller (replica_pull.hpp): one client per replica
// directory, each consuming into that directory.
#include "replica_pull.hpp"

#include <map>
#include <memory>
#include <mutex>

#include "client/client.hpp"

namespace dyad::service {

PullFn make_replica_puller(double transfer_timeout) {
    struct Clients {
        std::mutex mu;
        std::map<std::string, std::shared_ptr<client::Client>> by_dir;
    };
    auto clients = std::make_shared<Clients>();
    return [clients, transfer_timeout](const PullJob& j) -> std::vector<Status> {
        std::shared_ptr<client::Client> c;
        {
            std::lock_guard<std::mutex> lk(clients->mu);
            auto& slot = clients->by_dir[j.dir + '\n' + j.service_uri];
            if (!slot) {
                Config cfg;
                cfg.cons_path = j.dir;
                cfg.kvs_namespace = j.ns;
                cfg.service_uri = j.service_uri;
                cfg.transfer_timeout = transfer_timeout;
                cfg.wait_timeout = 60;         // for another pull of the same file
                cfg.replica_failover = false;  // from the owner only
                auto made = client::Client::create(cfg);
                if (!made) return std::vector<Status>(j.records.size(), made.status());
                slot = std::move(made.value());
            }
            c = slot;
        }
        if (j.records.size() == 1) {
            client::ConsumeReport rep;
            return {
                c->consume_with(j.dir + "/" + j.records.front().upath, j.records.front(), &rep)};
        }
        // Many: one batched consume (the owner's dyad.fetch_many for the
        // small ones, a window of fetches for the rest). The holder checks
        // each copy against the record it verified (size, mtime) before it
        // records it.
        std::vector<std::string> paths;
        paths.reserve(j.records.size());
        for (const auto& rec : j.records) paths.push_back(j.dir + "/" + rec.upath);
        // Two in flight: a replica is background work, and a small window
        // makes each dyad.fetch_many carry more files (fewer requests for
        // the owner, less CPU taken from its producers).
        client::ConsumeManyOptions o;
        o.window = 2;
        return c->consume_many(paths, o);
    };
}

}  // namespace dyad::service
