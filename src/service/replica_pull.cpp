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
    return [clients, transfer_timeout](const PullJob& j) -> Status {
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
                if (!made) return made.status();
                slot = std::move(made.value());
            }
            c = slot;
        }
        client::ConsumeReport rep;
        return c->consume_with(j.dir + "/" + j.record.upath, j.record, &rep);
    };
}

}  // namespace dyad::service
