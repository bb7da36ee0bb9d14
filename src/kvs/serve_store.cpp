// SPDX-License-Identifier: Apache-2.0
// kvs.get / kvs.list of a service whose metadata lives in a ServiceStore
// (etcd): the service answers its own clients, so one service multiplexes
// every wait of its consumers on its one connection to the store.
#include <asio/post.hpp>

#include "rpc/server.hpp"
#include "store.hpp"

namespace dyad::kvs {
namespace {
// A wait request answers TIMEOUT after this long; the client's RpcStore::wait
// asks again until its own deadline (it slices its waits at 30 s).
constexpr double kWaitAnswer = 30.0;
constexpr double kCallTimeout = 30.0;  // a lookup or a page

bool string_arg(const std::shared_ptr<rpc::Request>& r, const char* name, std::string* out,
                bool required = true) {
    auto it = r->args().find(name);
    if (it == r->args().end() && !required) return true;
    if (it == r->args().end() || !it->is_string()) {
        r->error(EINVAL, std::string("missing string field '") + name + "'", DYAD_RC_BADUNPACK);
        return false;
    }
    *out = it->get<std::string>();
    return true;
}

void fail(const std::shared_ptr<rpc::Request>& r, const Status& s) {
    r->error(s.err() ? s.err() : EIO, s.message(), s.rc());
}

nlohmann::json entry_json(const Entry& e) {
    return {{"value", e.value}, {"version", e.version}};
}
}  // namespace

void serve(rpc::Server& server, ServiceStore& store, asio::thread_pool& pool) {
    server.handle("kvs.put", [](std::shared_ptr<rpc::Request> r) {
        r->error(EPERM,
                 "this service keeps its metadata in an external store: publish through it "
                 "(dyad produce, dyad_produce)",
                 DYAD_RC_NOAUTH);
    });
    server.reads_args("kvs.get", {"ns", "key", "wait"});
    server.handle("kvs.get", [&store, &pool, &server](std::shared_ptr<rpc::Request> r) {
        std::string ns, key;
        if (!string_arg(r, "ns", &ns) || !string_arg(r, "key", &key)) return;
        const bool wait = r->args().value("wait", false);
        if (wait) r->cap_deadline(server.max_wait());
        asio::post(pool, [&store, r, ns = std::move(ns), key = std::move(key), wait] {
            if (!wait) {
                auto e = store.get(ns, key, Deadline::after(kCallTimeout));
                if (!e) return fail(r, e.status());
                return r->end(entry_json(e.value()));
            }
            uint64_t id = store.wait(ns, key, Deadline::after(kWaitAnswer), [r](Result<Entry> e) {
                if (!e) return fail(r, e.status());
                r->end(entry_json(e.value()));
            });
            r->on_cancel([&store, id] { store.cancel(id); });
        });
    });
    server.reads_args("kvs.list", {"ns", "prefix", "after", "limit"});
    server.handle("kvs.list", [&store, &pool](std::shared_ptr<rpc::Request> r) {
        std::string ns, prefix, after;
        if (!string_arg(r, "ns", &ns) || !string_arg(r, "prefix", &prefix, false) ||
            !string_arg(r, "after", &after, false))
            return;
        size_t limit = kPageLimit;
        auto l = r->args().find("limit");
        if (l != r->args().end() && l->is_number_unsigned() && l->get<uint64_t>() > 0)
            limit = std::min<uint64_t>(l->get<uint64_t>(), kPageLimit);
        asio::post(pool, [&store, r, ns = std::move(ns), prefix = std::move(prefix),
                          after = std::move(after), limit] {
            auto page = store.list(ns, prefix, after, limit, Deadline::after(kCallTimeout));
            if (!page) return fail(r, page.status());
            // A page also ends at kPageBytes (the rest comes with the next).
            nlohmann::json arr = nlohmann::json::array();
            uint64_t bytes = 0;
            bool more = page->more;
            for (auto& [k, e] : page->entries) {
                if (!arr.empty() && bytes + k.size() + e.value.size() > kPageBytes) {
                    more = true;
                    break;
                }
                bytes += k.size() + e.value.size();
                arr.push_back({{"key", k}, {"value", std::move(e.value)}, {"version", e.version}});
            }
            r->end({{"entries", std::move(arr)}, {"more", more}});
        });
    });
}

}  // namespace dyad::kvs
