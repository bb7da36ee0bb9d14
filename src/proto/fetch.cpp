// SPDX-License-Identifier: Apache-2.0
#include "proto/fetch.hpp"

#include <cerrno>
#include <charconv>

#include "common/checksum.hpp"
#include "common/json_text.hpp"
#include "proto/fields.hpp"

namespace dyad::proto {
std::string FetchRequest::transport_of(const nlohmann::json& args) {
    return transport_asked(args).value_or("");
}

std::optional<std::string> FetchRequest::transport_asked(const nlohmann::json& args) {
    return lenient_str(args, "transport");
}

Result<FetchRequest> FetchRequest::parse(const nlohmann::json& args) {
    FetchRequest r;
    auto up = lenient_str(args, "upath");
    if (!up) return Status(DYAD_RC_BADUNPACK, "fetch request without 'upath'", EINVAL);
    r.upath = std::move(*up);
    r.transport = transport_of(args);
    r.generation = lenient_u64(args, "generation").value_or(0);
    r.ns = lenient_str(args, "ns");
    r.key = lenient_str(args, "key");
    r.replica = args.is_object() && args.contains("replica") && args["replica"].is_boolean() &&
                args["replica"].get<bool>();
    const bool has_off = args.is_object() && args.contains("offset");
    const bool has_len = args.is_object() && args.contains("length");
    if (has_off || has_len) {
        r.offset = lenient_u64(args, "offset");
        r.length = lenient_u64(args, "length");
        if (!r.offset || !r.length)
            return Status(DYAD_RC_BADUNPACK,
                          "fetch request of '" + r.upath +
                              "' with a bad byte range: 'offset' and 'length' must both be "
                              "given, as unsigned integers",
                          EINVAL);
        if (*r.offset + *r.length < *r.offset)
            return Status(DYAD_RC_BADUNPACK,
                          "fetch request of '" + r.upath + "' with a bad byte range: offset " +
                              std::to_string(*r.offset) + " + length " + std::to_string(*r.length) +
                              " overflows (their sum must be at most 2^64-1)",
                          EINVAL);
    }
    return r;
}

void FetchRequest::build_into(nlohmann::json& args) const {
    args["upath"] = upath;
    if (!transport.empty()) args["transport"] = transport;
    args["generation"] = generation;
    if (ns) args["ns"] = *ns;
    if (key) args["key"] = *key;
    if (replica) args["replica"] = true;
    if (offset && length) {
        args["offset"] = *offset;
        args["length"] = *length;
    }
}

nlohmann::json FetchRequest::build() const {
    nlohmann::json a = nlohmann::json::object();
    build_into(a);
    return a;
}

Result<FetchEnd> FetchEnd::parse(const nlohmann::json& meta, const std::string& upath) {
    auto size = lenient_u64(meta, "size");
    auto hex = lenient_str(meta, "xxh3");
    if (!size || !hex)
        return Status(DYAD_RC_BADRPC,
                      "the end of the fetch of '" + upath + "' lacks its size or checksum: " +
                          meta.dump(-1, ' ', false, kBadUtf8Replaced),
                      EPROTO);
    return FetchEnd{*size, std::move(*hex)};
}

std::optional<uint64_t> digest_of_hex(const std::string& hex) {
    if (hex.empty() || hex.size() > 16) return std::nullopt;
    uint64_t v = 0;
    const char* last = hex.data() + hex.size();
    auto r = std::from_chars(hex.data(), last, v, 16);
    if (r.ec != std::errc() || r.ptr != last) return std::nullopt;
    return v;
}

FetchEnd FetchEnd::of(uint64_t size, uint64_t digest) {
    return FetchEnd{size, Xxh3::to_hex(digest)};
}

nlohmann::json FetchEnd::build() const {
    return {{"size", size}, {"xxh3", xxh3}};
}

nlohmann::json FetchStart::build(nlohmann::json extra) const {
    if (!extra.is_object()) extra = nlohmann::json::object();
    extra["size"] = size;
    extra["transport"] = transport;
    return extra;
}

Result<FetchStart> FetchStart::parse(const nlohmann::json& meta) {
    Fields f(meta, "the first answer of a fetch");
    FetchStart s;
    s.size = f.u64("size");
    s.transport = f.opt_str("transport").value_or("");
    return finish(f, std::move(s));
}

Result<FetchManyRequest> FetchManyRequest::parse(const nlohmann::json& args) {
    auto fs = args.is_object() ? args.find("files") : args.end();
    if (!args.is_object() || fs == args.end() || !fs->is_array() || fs->empty() ||
        fs->size() > kFetchManyFiles)
        return Status(DYAD_RC_BADUNPACK,
                      "fetch_many request without 'files' (1 to " +
                          std::to_string(kFetchManyFiles) + " of them)",
                      EINVAL);
    FetchManyRequest r;
    r.transport = FetchRequest::transport_of(args);
    r.raw_answer = lenient_str(args, "answer").value_or("") == "raw";
    r.files.resize(fs->size());
    for (size_t i = 0; i < fs->size(); ++i) {
        const auto& e = (*fs)[i];
        auto& f = r.files[i];
        f.upath = lenient_str(e, "upath");
        f.generation = lenient_u64(e, "generation").value_or(0);
        f.ns = lenient_str(e, "ns");
        f.key = lenient_str(e, "key");
    }
    return r;
}

nlohmann::json FetchManyRequest::build() const {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& f : files) {
        nlohmann::json e = nlohmann::json::object();
        if (f.upath) e["upath"] = *f.upath;
        e["generation"] = f.generation;
        if (f.ns) e["ns"] = *f.ns;
        if (f.key) e["key"] = *f.key;
        list.push_back(std::move(e));
    }
    nlohmann::json a = {{"files", std::move(list)}};
    if (!transport.empty()) a["transport"] = transport;
    if (raw_answer) a["answer"] = "raw";
    return a;
}

FetchRequest FetchManyRequest::one(size_t i) const {
    FetchRequest r;
    const auto& f = files.at(i);
    r.upath = f.upath.value_or("");
    r.transport = transport;
    r.generation = f.generation;
    r.ns = f.ns;
    r.key = f.key;
    return r;
}

Result<FetchRequest> FetchManyRequest::entry(size_t i) const {
    if (!files.at(i).upath)
        return Status(DYAD_RC_BADUNPACK, "fetch_many entry without 'upath'", EINVAL);
    return one(i);
}

FetchManyItem FetchManyItem::served(uint64_t index, uint64_t size, std::string xxh3) {
    FetchManyItem it;
    it.index = index;
    it.size = size;
    it.xxh3 = std::move(xxh3);
    return it;
}

FetchManyItem FetchManyItem::refusal(uint64_t index, const Status& st) {
    FetchManyItem it;
    it.index = index;
    it.refused = true;
    it.rc = static_cast<int>(st.rc());
    it.err = st.err() ? st.err() : EIO;
    it.msg = st.message();
    return it;
}

nlohmann::json FetchManyItem::build() const {
    if (refused) return {{"i", index}, {"rc", rc}, {"errno", err}, {"msg", msg}};
    return {{"i", index}, {"size", size}, {"xxh3", xxh3}};
}

Result<FetchManyItem> FetchManyItem::parse(const nlohmann::json& meta) {
    Fields f(meta, "an answer of dyad.fetch_many");
    FetchManyItem it;
    it.index = f.u64("i");
    if (f.ok() && f.has("rc")) {
        it.refused = true;
        it.rc = static_cast<int>(f.i64("rc"));
        it.err = static_cast<int>(f.opt_i64("errno").value_or(0));
        it.msg = f.opt_str("msg", kMaxText).value_or("");
    } else if (f.ok()) {
        it.size = f.u64("size");
        it.xxh3 = f.str("xxh3");
    }
    return finish(f, std::move(it));
}

nlohmann::json FetchManyEnd::build() const {
    nlohmann::json e = {{"files", files}};
    if (raw) e["format"] = "raw";
    return e;
}

}  // namespace dyad::proto
