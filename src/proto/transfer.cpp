// SPDX-License-Identifier: Apache-2.0
#include "proto/transfer.hpp"

#include <cerrno>
#include <exception>

#include "common/json_text.hpp"
#include "proto/fields.hpp"

namespace dyad::proto {

namespace {

// An unsigned integer as the JSON reader makes it of a non-negative number
// on the wire (the request's strict fields: a signed one is refused).
std::optional<uint64_t> strict_u64(const nlohmann::json& j, const char* name) {
    if (!j.is_object()) return std::nullopt;
    auto it = j.find(name);
    if (it == j.end() || !it->is_number_unsigned()) return std::nullopt;
    return it->get<uint64_t>();
}

std::string shown(const nlohmann::json& j) {
    return j.dump(-1, ' ', false, kBadUtf8Replaced);
}

// The common part of a first answer, read leniently: the transports check
// the size themselves, and ignore a transport of another type.
FetchStart lenient_start(const nlohmann::json& meta) {
    FetchStart s;
    s.size = lenient_u64(meta, "size").value_or(0);
    s.transport = lenient_str(meta, "transport").value_or("");
    return s;
}

}  // namespace

// ---- UCX ----

Result<UcxRequest> UcxRequest::parse(const nlohmann::json& args) {
    auto worker = lenient_str(args, "ucx_worker");
    auto tag = strict_u64(args, "ucx_tag");
    if (!worker || !tag)
        return Status(DYAD_RC_BADUNPACK, "UCX fetch without ucx_worker and ucx_tag", EINVAL);
    UcxRequest r;
    r.worker = std::move(*worker);
    r.tag = *tag;
    r.consumer = lenient_str(args, "ucx_consumer").value_or("?").substr(0, kMaxConsumer);
    r.proto = lenient_str(args, "ucx_proto").value_or("auto");
    auto address = strict_u64(args, "ucx_window");
    auto size = strict_u64(args, "ucx_window_size");
    auto rkey = lenient_str(args, "ucx_rkey");
    if (address && size && rkey) r.window = Window{*address, *size, std::move(*rkey)};
    return r;
}

void UcxRequest::build_into(nlohmann::json& args) const {
    if (!args.is_object()) args = nlohmann::json::object();
    args["ucx_worker"] = worker;
    args["ucx_tag"] = tag;
    args["ucx_consumer"] = consumer;
    args["ucx_proto"] = proto;
    if (window) {
        args["ucx_rkey"] = window->rkey;
        args["ucx_window"] = window->address;
        args["ucx_window_size"] = window->size;
    }
}

nlohmann::json UcxRequest::build() const {
    nlohmann::json j = nlohmann::json::object();
    build_into(j);
    return j;
}

Result<UcxStart> UcxStart::parse(const nlohmann::json& meta) {
    UcxStart s;
    s.start = lenient_start(meta);
    s.chunk = lenient_u64(meta, "chunk");
    s.mode = lenient_str(meta, "mode");
    if (!lenient_u64(meta, "size") || (s.chunk && (*s.chunk == 0 || *s.chunk > kMaxChunk)))
        return Status(DYAD_RC_BADRPC, "bad first answer in a UCX fetch: " + shown(meta), EPROTO);
    return s;
}

nlohmann::json UcxStart::build() const {
    nlohmann::json extra = nlohmann::json::object();
    if (chunk) extra["chunk"] = *chunk;
    if (mode) extra["mode"] = *mode;
    return start.build(std::move(extra));
}

Result<UcxPutNotice> UcxPutNotice::parse(const nlohmann::json& meta) {
    auto slot = lenient_u64(meta, "slot");
    auto len = lenient_u64(meta, "len");
    if (!slot || !len)
        return Status(DYAD_RC_BADFETCH,
                      "UCX put notice " + shown(meta) + ": field '" +
                          std::string(slot ? "len" : "slot") + "' missing",
                      EPROTO);
    return UcxPutNotice{*slot, *len};
}

nlohmann::json UcxPutNotice::build() const {
    return {{"slot", slot}, {"len", len}};
}

UcxAck UcxAck::parse(const nlohmann::json& update) {
    return UcxAck{lenient_u64(update, "ack"), lenient_u64(update, "credit")};
}

nlohmann::json UcxAck::build() const {
    nlohmann::json j = nlohmann::json::object();
    if (ack) j["ack"] = *ack;
    if (credit) j["credit"] = *credit;
    return j;
}

// ---- MARGO ----

Result<OfiRequest> OfiRequest::parse(const nlohmann::json& args) {
    auto proto = lenient_str(args, "ofi_proto");
    if (!proto) return Status(DYAD_RC_BADUNPACK, "OFI fetch without ofi_proto", EINVAL);
    return OfiRequest{std::move(*proto)};
}

void OfiRequest::build_into(nlohmann::json& args) const {
    if (!args.is_object()) args = nlohmann::json::object();
    args["ofi_proto"] = proto;
}

nlohmann::json OfiRequest::build() const {
    nlohmann::json j = nlohmann::json::object();
    build_into(j);
    return j;
}

Result<OfiStart> OfiStart::parse(const nlohmann::json& meta) {
    if (!lenient_u64(meta, "size"))
        return Status(DYAD_RC_BADRPC, "bad first answer in an OFI fetch: " + shown(meta), EPROTO);
    OfiStart s;
    s.start = lenient_start(meta);
    s.chunk = lenient_u64(meta, "chunk");
    s.proto = lenient_str(meta, "proto").value_or("");
    s.address = lenient_str(meta, "ofi_addr").value_or("");
    return s;
}

nlohmann::json OfiStart::build() const {
    nlohmann::json extra = {{"proto", proto}, {"ofi_addr", address}};
    if (chunk) extra["chunk"] = *chunk;
    return start.build(std::move(extra));
}

OfiChunk OfiChunk::parse(const nlohmann::json& meta) {
    OfiChunk c;
    c.seq = lenient_u64(meta, "seq").value_or(~0ull);
    c.addr = lenient_u64(meta, "addr").value_or(0);
    c.key = lenient_u64(meta, "key").value_or(0);
    c.len = lenient_u64(meta, "len").value_or(0);
    return c;
}

nlohmann::json OfiChunk::build() const {
    return {{"seq", seq}, {"addr", addr}, {"key", key}, {"len", len}};
}

std::optional<uint64_t> ChunkAck::seq_of(const nlohmann::json& update) {
    return lenient_u64(update, "ack");
}

nlohmann::json ChunkAck::build() const {
    return {{"ack", seq}};
}

// ---- The AUTO selector's records ----

Result<TransportRecord> TransportRecord::parse(const nlohmann::json& j) {
    if (!lenient_str(j, "name"))
        return Status(DYAD_RC_BADMETADATA, "transport record without a name", EPROTO);
    TransportRecord r;
    try {
        r.name = j.at("name").get<std::string>();
        r.reach = j.value("reach", std::string(kReachNetwork));
        r.latency_us = j.value("latency_us", 0.0);
        r.bandwidth_gbps = j.value("bandwidth_gbps", 0.0);
        r.rma_native = j.value("rma_native", false);
        r.max_message = j.value("max_message", static_cast<uint64_t>(0));
        r.address = j.value("address", std::string());
        r.detail = j.value("detail", std::string());
        r.source = j.value("source", std::string());
    } catch (const std::exception& e) {
        return Status(DYAD_RC_BADMETADATA, std::string("malformed transport record: ") + e.what(),
                      EPROTO);
    }
    return r;
}

nlohmann::json TransportRecord::build() const {
    return {{"name", name},
            {"reach", reach},
            {"latency_us", latency_us},
            {"bandwidth_gbps", bandwidth_gbps},
            {"rma_native", rma_native},
            {"max_message", max_message},
            {"address", address},
            {"detail", detail},
            {"source", source}};
}

// ---- LOCAL ----

Result<LocalCopied> LocalCopied::parse(const nlohmann::json& update) {
    auto copied = lenient_u64(update, "copied");
    if (!copied) return Status(DYAD_RC_BADRPC, "LOCAL update without 'copied'", EPROTO);
    return LocalCopied{*copied};
}

nlohmann::json LocalCopied::build() const {
    return {{"copied", copied}};
}

std::optional<uint64_t> start_size(const nlohmann::json& meta) {
    return lenient_u64(meta, "size");
}

}  // namespace dyad::proto
