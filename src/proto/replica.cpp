// SPDX-License-Identifier: Apache-2.0
// Replicas: dyad.replicate, the holders' entries, the placement rule
// (replica.hpp).
#include "replica.hpp"

#include <algorithm>

#include "common/checksum.hpp"
#include "fields.hpp"

namespace dyad::proto {

std::string replica_namespace(const std::string& ns) {
    return ns + ".replicas";
}

std::string replica_prefix(const std::string& key) {
    return key + "@";
}

std::string replica_key(const std::string& key, const std::string& holder) {
    return replica_prefix(key) + holder;
}

Result<ReplicateRequest> ReplicateRequest::parse(const nlohmann::json& args) {
    Fields f(args, "dyad.replicate");
    ReplicateRequest r;
    r.ns = f.str("ns");
    r.key = f.str("key");
    r.upath = f.str("upath");
    r.generation = f.u64("generation");
    r.size = f.u64("size");
    if (!f.ok()) return f.status();
    if (r.ns.empty() || r.key.empty() || r.upath.empty() || r.generation == 0)
        return Status(DYAD_RC_BADRPC,
                      "dyad.replicate: ns, key and upath must not be empty, generation not 0",
                      EPROTO);
    return r;
}

nlohmann::json ReplicateRequest::build() const {
    return {{"ns", ns}, {"key", key}, {"upath", upath}, {"generation", generation}, {"size", size}};
}

Result<ReplicateBatch> ReplicateBatch::parse(const nlohmann::json& args) {
    if (!args.is_object() || !args.contains("ns") || !args["ns"].is_string() ||
        !args.contains("files") || !args["files"].is_array())
        return Status(DYAD_RC_BADRPC,
                      "dyad.replicate_many: needs ns (a string) and files (an array)", EPROTO);
    ReplicateBatch b;
    b.ns = args["ns"].get<std::string>();
    const auto& files = args["files"];
    if (files.empty() || files.size() > kMaxFiles)
        return Status(DYAD_RC_BADRPC,
                      "dyad.replicate_many: " + std::to_string(files.size()) +
                          " files; a batch has 1 to " + std::to_string(kMaxFiles),
                      EPROTO);
    b.files.reserve(files.size());
    for (size_t i = 0; i < files.size(); ++i) {
        nlohmann::json one = files[i];
        if (!one.is_object())
            return Status(DYAD_RC_BADRPC,
                          "dyad.replicate_many: file " + std::to_string(i) + " is not an object",
                          EPROTO);
        one["ns"] = b.ns;
        auto r = ReplicateRequest::parse(one);
        if (!r)
            return Status(
                DYAD_RC_BADRPC,
                "dyad.replicate_many: file " + std::to_string(i) + ": " + r.status().message(),
                EPROTO);
        b.files.push_back(std::move(r.value()));
    }
    return b;
}

nlohmann::json ReplicateBatch::build() const {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& f : files) {
        nlohmann::json one = f.build();
        one.erase("ns");  // the batch's
        list.push_back(std::move(one));
    }
    return {{"ns", ns}, {"files", std::move(list)}};
}

Result<ReplicateBatchAnswer> ReplicateBatchAnswer::parse(const nlohmann::json& answer,
                                                         size_t expected) {
    if (!answer.is_object() || !answer.contains("holder") || !answer["holder"].is_string() ||
        !answer.contains("files") || !answer["files"].is_array() ||
        answer["files"].size() != expected)
        return Status(DYAD_RC_BADRPC,
                      "dyad.replicate_many: an answer without the holder and one item per file",
                      EPROTO);
    ReplicateBatchAnswer a;
    a.holder = answer["holder"].get<std::string>();
    for (const auto& it : answer["files"]) {
        Fields f(it, "a dyad.replicate_many item");
        Item item;
        item.held = f.boolean("held");
        if (item.held) {
            item.bytes = f.u64("bytes");
        } else {
            item.err = static_cast<int>(f.u64("errno"));
            item.error = f.str("error");
        }
        if (!f.ok()) return f.status();
        a.files.push_back(std::move(item));
    }
    return a;
}

nlohmann::json ReplicateBatchAnswer::build() const {
    nlohmann::json items = nlohmann::json::array();
    for (const auto& it : files) {
        if (it.held)
            items.push_back({{"held", true}, {"bytes", it.bytes}});
        else
            items.push_back({{"held", false}, {"errno", it.err}, {"error", it.error}});
    }
    return {{"holder", holder}, {"files", std::move(items)}};
}

Result<UnreplicateRequest> UnreplicateRequest::parse(const nlohmann::json& args) {
    Fields f(args, "dyad.unreplicate");
    UnreplicateRequest r;
    r.ns = f.str("ns");
    r.key = f.str("key");
    r.upath = f.str("upath");
    r.generation = f.u64("generation");
    if (!f.ok()) return f.status();
    if (r.ns.empty() || r.key.empty() || r.upath.empty() || r.generation == 0)
        return Status(DYAD_RC_BADRPC,
                      "dyad.unreplicate: ns, key and upath must not be empty, generation not 0",
                      EPROTO);
    return r;
}

nlohmann::json UnreplicateRequest::build() const {
    return {{"ns", ns}, {"key", key}, {"upath", upath}, {"generation", generation}};
}

nlohmann::json ReplicaEntry::to_json() const {
    return {{"path", upath},          {"owner", holder},     {"node", node},
            {"endpoints", endpoints}, {"replica_of", of},    {"generation", generation},
            {"size", size},           {"mtime_ns", mtime_ns}};
}

Result<ReplicaEntry> ReplicaEntry::parse(const std::string& text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        return Status(DYAD_RC_BADMETADATA, "a replica entry is not a JSON object", EPROTO);
    Fields f(j, "a replica entry");
    ReplicaEntry e;
    e.upath = f.str("path");
    e.holder = f.str("owner");
    e.node = f.str("node");
    e.endpoints = f.strings("endpoints", 16, kMaxText);
    e.of = f.str("replica_of");
    e.generation = f.u64("generation");
    e.size = f.u64("size");
    e.mtime_ns = f.i64("mtime_ns");
    if (!f.ok()) return Status(DYAD_RC_BADMETADATA, f.status().message(), EPROTO);
    return e;
}

std::vector<std::string> replica_holders(const std::string& key, std::vector<std::string> ids,
                                         const std::string& self, size_t k) {
    ids.erase(std::remove(ids.begin(), ids.end(), self), ids.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    auto weight = [&key](const std::string& id) {
        std::string s = key;
        s.push_back('\0');
        s += id;
        return Xxh3::of(s.data(), s.size());
    };
    std::vector<std::pair<uint64_t, std::string>> w;
    w.reserve(ids.size());
    for (auto& id : ids) w.emplace_back(weight(id), std::move(id));
    std::sort(w.begin(), w.end(), [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    std::vector<std::string> out;
    for (size_t i = 0; i < w.size() && i < k; ++i) out.push_back(std::move(w[i].second));
    return out;
}

}  // namespace dyad::proto
