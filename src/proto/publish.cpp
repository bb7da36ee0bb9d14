// SPDX-License-Identifier: Apache-2.0
#include "proto/publish.hpp"

#include <cerrno>

#include "proto/fields.hpp"

namespace dyad::proto {
namespace {
std::optional<uint64_t> loose_u64(const nlohmann::json& j, const char* name) {
    auto it = j.find(name);
    if (it == j.end() || !it->is_number_integer()) return std::nullopt;
    if (it->is_number_unsigned()) return it->get<uint64_t>();
    auto v = it->get<int64_t>();
    if (v < 0) return std::nullopt;
    return static_cast<uint64_t>(v);
}
}  // namespace

Result<PublishRequest> PublishRequest::parse(const nlohmann::json& args) {
    auto up = args.is_object() ? args.find("upath") : args.end();
    if (!args.is_object() || up == args.end() || !up->is_string())
        return Status(DYAD_RC_BADUNPACK, "publish request without 'upath'", EINVAL);
    PublishRequest r;
    r.upath = up->get<std::string>();
    auto ns = args.find("ns");
    if (ns != args.end() && ns->is_string()) r.ns = ns->get<std::string>();
    r.key_depth = loose_u64(args, "key_depth").value_or(3);
    r.key_bins = loose_u64(args, "key_bins").value_or(1024);
    r.replaces = loose_u64(args, "replaces").value_or(0);
    return r;
}

Status PublishRequest::check() const {
    if (key_depth > 64 || key_bins == 0 || key_bins > (1u << 30))
        return Status(DYAD_RC_BADUNPACK, "key_depth must be 0..64 and key_bins 1..2^30", EINVAL);
    return Status::ok();
}

nlohmann::json PublishRequest::build() const {
    nlohmann::json a = {{"upath", upath}, {"key_depth", key_depth}, {"key_bins", key_bins}};
    if (ns) a["ns"] = *ns;
    if (replaces) a["replaces"] = replaces;
    return a;
}

nlohmann::json PublishAnswer::build() const {
    return {{"version", version}, {"key", key}, {"record", record}};
}

Result<PublishAnswer> PublishAnswer::parse(const nlohmann::json& meta) {
    Fields f(meta, "the answer of dyad.publish");
    PublishAnswer a;
    a.version = f.u64("version");
    a.key = f.str("key");
    if (const auto* rec = f.object("record", false)) a.record = *rec;
    return finish(f, std::move(a));
}

}  // namespace dyad::proto
