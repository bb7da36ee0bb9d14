// SPDX-License-Identifier: Apache-2.0
#include "proto/publish.hpp"

#include <cerrno>

#include "proto/fields.hpp"

namespace dyad::proto {
Result<PublishRequest> PublishRequest::parse(const nlohmann::json& args) {
    auto up = lenient_str(args, "upath");
    if (!up) return Status(DYAD_RC_BADUNPACK, "publish request without 'upath'", EINVAL);
    PublishRequest r;
    r.upath = std::move(*up);
    r.ns = lenient_str(args, "ns");
    r.key_depth = lenient_u64(args, "key_depth").value_or(3);
    r.key_bins = lenient_u64(args, "key_bins").value_or(1024);
    r.replaces = lenient_u64(args, "replaces").value_or(0);
    r.replicas = lenient_u64(args, "replicas");
    r.replicas_sync = args.is_object() && args.contains("replicas_sync") &&
                      args["replicas_sync"].is_boolean() && args["replicas_sync"].get<bool>();
    return r;
}

Status PublishRequest::check() const {
    if (key_depth > 64 || key_bins == 0 || key_bins > (1u << 30))
        return Status(DYAD_RC_BADUNPACK, "key_depth must be 0..64 and key_bins 1..2^30", EINVAL);
    if (replicas && *replicas > kMaxReplicas)
        return Status(DYAD_RC_BADUNPACK,
                      "replicas must be 0.." + std::to_string(kMaxReplicas) + " (DYAD_REPLICAS)",
                      EINVAL);
    return Status::ok();
}

nlohmann::json PublishRequest::build() const {
    nlohmann::json a = {{"upath", upath}, {"key_depth", key_depth}, {"key_bins", key_bins}};
    if (ns) a["ns"] = *ns;
    if (replaces) a["replaces"] = replaces;
    if (replicas) a["replicas"] = *replicas;
    if (replicas_sync) a["replicas_sync"] = true;
    return a;
}

Result<UnpublishRequest> UnpublishRequest::parse(const nlohmann::json& args) {
    auto up = lenient_str(args, "upath");
    if (!up) return Status(DYAD_RC_BADUNPACK, "unpublish request without 'upath'", EINVAL);
    UnpublishRequest r;
    r.upath = std::move(*up);
    r.ns = lenient_str(args, "ns");
    r.key_depth = lenient_u64(args, "key_depth").value_or(3);
    r.key_bins = lenient_u64(args, "key_bins").value_or(1024);
    return r;
}

nlohmann::json UnpublishRequest::build() const {
    nlohmann::json a = {{"upath", upath}, {"key_depth", key_depth}, {"key_bins", key_bins}};
    if (ns) a["ns"] = *ns;
    return a;
}

nlohmann::json PublishAnswer::build() const {
    nlohmann::json a = {{"version", version}, {"key", key}, {"record", record}};
    if (replicas) a["replicas"] = *replicas;
    if (replicas_warning) a["replicas_warning"] = *replicas_warning;
    return a;
}

nlohmann::json UnpublishAnswer::build() const {
    return {{"key", key}, {"version", version}};
}

Result<UnpublishAnswer> UnpublishAnswer::parse(const nlohmann::json& meta) {
    Fields f(meta, "the answer of dyad.unpublish");
    UnpublishAnswer a;
    a.key = f.str("key");
    a.version = f.opt_u64("version").value_or(0);
    return finish(f, std::move(a));
}

Result<PublishAnswer> PublishAnswer::parse(const nlohmann::json& meta) {
    Fields f(meta, "the answer of dyad.publish");
    PublishAnswer a;
    a.version = f.u64("version");
    a.key = f.str("key");
    if (const auto* rec = f.object("record", false)) a.record = *rec;
    a.replicas = f.opt_u64("replicas");
    a.replicas_warning = f.opt_str("replicas_warning", kMaxText);
    return finish(f, std::move(a));
}

}  // namespace dyad::proto
