// SPDX-License-Identifier: Apache-2.0
#include "get_many.hpp"

#include <cerrno>

#include "rpc/server.hpp"

namespace dyad::kvs {

void serve_get_many(rpc::Server& server, MemoryStore& store) {
    server.handle("kvs.get_many", [&store](std::shared_ptr<rpc::Request> r) {
        const auto& a = r->args();
        auto ns = a.find("ns");
        auto keys = a.find("keys");
        if (ns == a.end() || !ns->is_string())
            return r->error(EINVAL, "missing string field 'ns'", DYAD_RC_BADUNPACK);
        if (keys == a.end() || !keys->is_array())
            return r->error(EINVAL, "missing array field 'keys'", DYAD_RC_BADUNPACK);
        if (keys->size() > kGetManyMaxKeys)
            return r->error(EINVAL,
                            "kvs.get_many takes at most " + std::to_string(kGetManyMaxKeys) +
                                " keys, not " + std::to_string(keys->size()),
                            DYAD_RC_BADUNPACK);
        for (const auto& k : *keys)
            if (!k.is_string())
                return r->error(EINVAL, "field 'keys' holds something that is not a string",
                                DYAD_RC_BADUNPACK);
        const std::string& nspace = ns->get_ref<const std::string&>();
        // One entry per key, in order: [value, version] when found, 0 when
        // absent, null when it did not fit in this answer (ask again).
        nlohmann::json out = nlohmann::json::array();
        size_t budget = kGetManyAnswerBudget;
        for (const auto& k : *keys) {
            if (budget == 0) {
                out.push_back(nullptr);
                continue;
            }
            auto e = store.get(nspace, k.get_ref<const std::string&>());
            if (!e) {
                out.push_back(0);
                continue;
            }
            if (e->value.size() + 32 > budget) {
                budget = 0;
                out.push_back(nullptr);
                continue;
            }
            budget -= e->value.size() + 32;
            out.push_back(nlohmann::json::array({e->value, e->version}));
        }
        r->end({{"entries", std::move(out)}});
    });
}

Result<std::vector<Lookup>> get_many(rpc::ConnectionPool& pool, const std::string& uri,
                                     const std::string& ns, const std::vector<std::string>& keys,
                                     Deadline deadline) {
    bool connect_failed = false;
    auto r = pool.call(uri, "kvs.get_many", {{"ns", ns}, {"keys", keys}}, deadline, 0, true,
                       &connect_failed);
    if (!r && connect_failed) return Status(r.status()).wrap("metadata store");
    if (!r) return r.status();
    auto it = r->find("entries");
    if (it == r->end() || !it->is_array() || it->size() != keys.size())
        return Status(
            DYAD_RC_BADRPC,
            "the metadata store at " + uri + " answered kvs.get_many without one entry per key",
            EPROTO);
    std::vector<Lookup> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
        auto& e = (*it)[i];         // its string is moved out
        if (e.is_null()) continue;  // later
        if (e.is_number()) {
            out[i].state = Lookup::State::missing;
            continue;
        }
        if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number_unsigned())
            return Status(
                DYAD_RC_BADRPC,
                "the metadata store at " + uri + " answered kvs.get_many with a malformed entry",
                EPROTO);
        out[i].state = Lookup::State::found;
        out[i].entry.value = std::move(e[0].get_ref<std::string&>());
        out[i].entry.version = e[1].get<uint64_t>();
    }
    return out;
}

}  // namespace dyad::kvs
