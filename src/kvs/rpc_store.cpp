// SPDX-License-Identifier: Apache-2.0
#include <algorithm>

#include "store.hpp"

namespace dyad::kvs {
namespace {
constexpr double kWaitSlice = 30.0;  // seconds per wait request; the loop re-arms
constexpr double kGrace = 5.0;       // extra client-side time for the answer to travel
}  // namespace

Result<nlohmann::json> RpcStore::call(const std::string& topic, nlohmann::json args, Deadline d,
                                      double grace) {
    // Reads may be sent again if a pooled connection turns out closed; a put
    // only if it certainly did not reach the store.
    const bool idempotent = topic != "kvs.put";
    bool connect_failed = false;
    auto r = pool_->call(uri_, topic, args, d, grace, idempotent, &connect_failed);
    if (!r && connect_failed) return Status(r.status()).wrap("metadata store");
    return r;
}

Result<uint64_t> RpcStore::put(const std::string& ns, const std::string& key,
                               const std::string& value, Deadline d, uint64_t replaces) {
    nlohmann::json args = {{"ns", ns}, {"key", key}, {"value", value}};
    if (replaces) args["replaces"] = replaces;
    auto r = call("kvs.put", std::move(args), d, 0);
    if (!r) return r.status();
    return r->value("version", static_cast<uint64_t>(0));
}

Result<Entry> RpcStore::get(const std::string& ns, const std::string& key, Deadline d) {
    auto r = call("kvs.get", {{"ns", ns}, {"key", key}}, d, 0);
    if (!r) return r.status();
    return Entry{r->value("value", ""), r->value("version", static_cast<uint64_t>(0))};
}

Result<Entry> RpcStore::wait(const std::string& ns, const std::string& key, Deadline d) {
    for (;;) {
        Deadline slice = d.min(Deadline::after(kWaitSlice));
        auto r = call("kvs.get", {{"ns", ns}, {"key", key}, {"wait", true}}, slice, kGrace);
        if (r) return Entry{r->value("value", ""), r->value("version", static_cast<uint64_t>(0))};
        if (r.status().rc() == DYAD_RC_TIMEOUT && !d.expired()) continue;
        return r.status();
    }
}

Result<std::vector<std::pair<std::string, Entry>>> RpcStore::list(const std::string& ns,
                                                                  const std::string& prefix,
                                                                  Deadline d) {
    auto r = call("kvs.list", {{"ns", ns}, {"prefix", prefix}}, d, 0);
    if (!r) return r.status();
    std::vector<std::pair<std::string, Entry>> out;
    for (auto& e : (*r)["entries"])
        out.emplace_back(e.value("key", ""), Entry{e.value("value", ""), e.value("version", 0ull)});
    return out;
}

}  // namespace dyad::kvs
