// SPDX-License-Identifier: Apache-2.0
#include "proto/kvs.hpp"

#include "proto/fields.hpp"
#include "proto/little_endian.hpp"

namespace dyad::proto::kvs {

std::vector<std::string> PutArgs::names() {
    return {"ns", "key", "value", "replaces"};
}

Result<PutArgs> PutArgs::parse(const nlohmann::json& j) {
    Fields f(j, kPut);
    PutArgs a;
    a.ns = f.str("ns", kMaxText);
    a.key = f.str("key", kMaxText);
    a.value = f.str("value", kMaxValue);
    a.replaces = f.opt_u64("replaces").value_or(0);
    return finish(f, std::move(a));
}

nlohmann::json PutArgs::build() const {
    nlohmann::json j = {{"ns", ns}, {"key", key}, {"value", value}};
    if (replaces) j["replaces"] = replaces;
    return j;
}

std::vector<std::string> RemoveArgs::names() {
    return {"ns", "key"};
}

Result<RemoveArgs> RemoveArgs::parse(const nlohmann::json& j) {
    Fields f(j, kRemove);
    RemoveArgs a;
    a.ns = f.str("ns", kMaxText);
    a.key = f.str("key", kMaxText);
    return finish(f, std::move(a));
}

nlohmann::json RemoveArgs::build() const {
    return {{"ns", ns}, {"key", key}};
}

Result<PutAnswer> PutAnswer::parse(const nlohmann::json& j) {
    Fields f(j, "kvs.put answer");
    PutAnswer a;
    a.version = f.u64("version");
    return finish(f, a);
}

nlohmann::json PutAnswer::build() const {
    return {{"version", version}};
}

std::vector<std::string> GetArgs::names() {
    return {"ns", "key", "wait"};
}

Result<GetArgs> GetArgs::parse(const nlohmann::json& j) {
    Fields f(j, kGet);
    GetArgs a;
    // (Longer than any key the store takes: answered, never waited for.)
    a.ns = f.str("ns", kMaxText);
    a.key = f.str("key", kMaxText);
    a.wait = f.opt_bool("wait").value_or(false);
    return finish(f, std::move(a));
}

nlohmann::json GetArgs::build() const {
    nlohmann::json j = {{"ns", ns}, {"key", key}};
    if (wait) j["wait"] = true;
    return j;
}

Result<EntryAnswer> EntryAnswer::parse(const nlohmann::json& j) {
    Fields f(j, "kvs.get answer");
    EntryAnswer a;
    a.value = f.str("value", kMaxValue);
    a.version = f.u64("version");
    return finish(f, std::move(a));
}

nlohmann::json EntryAnswer::build() const {
    return {{"value", value}, {"version", version}};
}

std::vector<std::string> ListArgs::names() {
    return {"ns", "prefix", "after", "limit", "answer"};
}

Result<ListArgs> ListArgs::parse(const nlohmann::json& j) {
    Fields f(j, kList);
    ListArgs a;
    a.ns = f.str("ns");
    a.prefix = f.opt_str("prefix").value_or("");
    a.after = f.opt_str("after").value_or("");
    a.limit = f.opt_u64("limit").value_or(0);
    a.raw = f.opt_str("answer").value_or("") == "raw";
    return finish(f, std::move(a));
}

nlohmann::json ListArgs::build() const {
    nlohmann::json j = {{"ns", ns}, {"prefix", prefix}};
    if (!after.empty()) j["after"] = after;
    if (limit) j["limit"] = limit;
    if (raw) j["answer"] = "raw";
    return j;
}

Result<ListAnswer> ListAnswer::parse(nlohmann::json&& j) {
    Fields f(j, "kvs.list answer");
    ListAnswer a;
    a.more = f.opt_bool("more").value_or(false);
    if (auto format = f.opt_str("format")) {
        if (*format != "raw") f.fail("format", "is not \"raw\"");
        a.raw = true;
        a.count = f.u64("count");
        return finish(f, std::move(a));
    }
    (void)f.array("entries");
    if (!f.ok()) return f.status();
    auto& arr = j["entries"];
    a.entries.reserve(arr.size());
    // (Its strings are moved out: j is the caller's to let go.)
    for (auto& e : arr) {
        Fields ef(e, "kvs.list answer entry");
        auto key = ef.opt_str("key", kMaxText);
        auto value = ef.opt_str("value", kMaxValue);
        if (!ef.ok() || !key || !value) continue;  // (one it cannot read is skipped)
        a.entries.push_back(
            {std::move(*key), std::move(*value), ef.opt_u64("version").value_or(0)});
    }
    return a;
}

nlohmann::json ListAnswer::build_raw(uint64_t count, bool more) {
    return {{"format", "raw"}, {"count", count}, {"more", more}};
}

void ListAnswer::append_raw(std::string* data, const ListEntry& e) {
    put_le(data, e.key.size(), 4);
    data->append(e.key);
    put_le(data, e.version, 8);
    put_le(data, e.value.size(), 4);
    data->append(e.value);
}

Result<std::vector<ListEntry>> ListAnswer::parse_raw(const std::string& data, uint64_t count) {
    auto bad = [](const std::string& why) {
        return Status(DYAD_RC_BADRPC, "malformed kvs.list answer: " + why, EPROTO);
    };
    // Each entry takes 16 bytes at least: a count past that is a lie.
    if (count > data.size() / 16) return bad("more entries than its data holds");
    std::vector<ListEntry> out;
    out.reserve(static_cast<size_t>(count));
    size_t at = 0;
    for (uint64_t i = 0; i < count; ++i) {
        ListEntry e;
        if (data.size() - at < 4) return bad("an entry cut short");
        const uint64_t klen = get_le(data.data() + at, 4);
        at += 4;
        if (klen > kMaxText) return bad("a key of " + std::to_string(klen) + " bytes");
        if (data.size() - at < klen + 12) return bad("an entry cut short");
        e.key.assign(data, at, static_cast<size_t>(klen));
        at += static_cast<size_t>(klen);
        e.version = get_le(data.data() + at, 8);
        const uint64_t vlen = get_le(data.data() + at + 8, 4);
        at += 12;
        if (vlen > kMaxValue || data.size() - at < vlen) return bad("a value cut short");
        e.value.assign(data, at, static_cast<size_t>(vlen));
        at += static_cast<size_t>(vlen);
        out.push_back(std::move(e));
    }
    if (at != data.size()) return bad("bytes after the last entry");
    return out;
}

nlohmann::json ListAnswer::build() const {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& e : entries)
        arr.push_back({{"key", e.key}, {"value", e.value}, {"version", e.version}});
    return {{"entries", std::move(arr)}, {"more", more}};
}

std::vector<std::string> GetManyArgs::names() {
    return {"ns", "keys", "answer"};
}

Result<GetManyArgs> GetManyArgs::parse(const nlohmann::json& j) {
    Fields f(j, kGetMany);
    GetManyArgs a;
    a.ns = f.str("ns");
    const nlohmann::json* keys = f.array("keys");
    if (keys && keys->size() > kMaxKeys)
        f.fail("keys", "holds " + std::to_string(keys->size()) + " keys (at most " +
                           std::to_string(kMaxKeys) + " keys per request)");
    if (f.ok()) a.keys = f.strings("keys", kMaxKeys, kMaxText);
    a.raw = f.opt_str("answer").value_or("") == "raw";
    return finish(f, std::move(a));
}

nlohmann::json GetManyArgs::build() const {
    nlohmann::json j = {{"ns", ns}, {"keys", keys}};
    if (raw) j["answer"] = "raw";
    return j;
}

Result<GetManyAnswer> GetManyAnswer::parse(nlohmann::json&& j) {
    Fields f(j, "kvs.get_many answer");
    GetManyAnswer a;
    auto format = f.opt_str("format");
    if (format) {
        if (*format != "raw") f.fail("format", "is not \"raw\"");
        a.raw = true;
        a.count = f.u64("count");
    } else if (f.array("entries")) {
        a.entries = std::move(j["entries"]);
    }
    return finish(f, std::move(a));
}

nlohmann::json GetManyAnswer::build_raw(uint64_t count) {
    return {{"format", "raw"}, {"count", count}};
}

nlohmann::json GetManyAnswer::build_entries(nlohmann::json entries) {
    return {{"entries", std::move(entries)}};
}

std::vector<std::string> ChangesArgs::names() {
    return {"ns", "after", "wait"};
}

Result<ChangesArgs> ChangesArgs::parse(const nlohmann::json& j) {
    Fields f(j, kChanges);
    ChangesArgs a;
    a.ns = f.str("ns", kMaxText);
    a.after = f.opt_u64("after").value_or(0);
    a.wait = f.opt_number("wait").value_or(0);
    if (!(a.wait >= 0) || a.wait > 3600) f.fail("wait", "is not a number of seconds in 0..3600");
    return finish(f, std::move(a));
}

nlohmann::json ChangesArgs::build() const {
    nlohmann::json j = {{"ns", ns}, {"after", after}};
    if (wait > 0) j["wait"] = wait;
    return j;
}

Result<ChangesAnswer> ChangesAnswer::parse(nlohmann::json&& j) {
    Fields f(j, "kvs.changes answer");
    ChangesAnswer a;
    a.next = f.u64("next");
    a.compacted = f.opt_bool("compacted").value_or(false);
    (void)f.array("entries");
    if (!f.ok()) return f.status();
    auto& arr = j["entries"];
    a.entries.reserve(arr.size());
    for (auto& e : arr) {
        Fields ef(e, "kvs.changes answer entry");
        ListEntry le;
        le.key = ef.str("key", kMaxText);
        le.value = ef.str("value", kMaxValue);
        le.version = ef.u64("version");
        if (!ef.ok()) return ef.status();
        a.entries.push_back(std::move(le));
    }
    return a;
}

nlohmann::json ChangesAnswer::build() const {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& e : entries)
        arr.push_back({{"key", e.key}, {"value", e.value}, {"version", e.version}});
    return {{"entries", std::move(arr)}, {"next", next}, {"compacted", compacted}};
}

}  // namespace dyad::proto::kvs
