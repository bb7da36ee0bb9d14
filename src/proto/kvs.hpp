// SPDX-License-Identifier: Apache-2.0
// The metadata store's topics (docs/wire-protocol.md): the arguments and
// answers of kvs.put, kvs.get (with wait-for-create), kvs.list (one page)
// and kvs.get_many. Each parses through proto::Fields (every field checked,
// one error style) and builds its one JSON form.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.hpp"

namespace dyad::proto::kvs {

// The topics.
inline constexpr const char* kPut = "kvs.put";
inline constexpr const char* kGet = "kvs.get";
inline constexpr const char* kList = "kvs.list";
inline constexpr const char* kGetMany = "kvs.get_many";
// Unpublish: a service removes a key it wrote (the answer: {}).
inline constexpr const char* kRemove = "kvs.remove";
// The records put in a namespace after a revision (etcd; `dyad sync
// --follow`): docs/wire-protocol.md, "Changes after a revision".
inline constexpr const char* kChanges = "kvs.changes";

// Bounds of what a peer sends.
// A put's key and value are bounded by the store, whose refusal says its
// limits (StoreLimits): these only keep a peer's text finite.
inline constexpr size_t kMaxValue = 64u << 20;
inline constexpr size_t kMaxKeys = 1024;  // keys of one kvs.get_many

struct PutArgs {
    std::string ns, key, value;
    uint64_t replaces = 0;  // 0: none (not sent)
    // The arguments a server keeps of a request (rpc::Server::reads_args).
    static std::vector<std::string> names();
    static Result<PutArgs> parse(const nlohmann::json& j);
    nlohmann::json build() const;
};

struct RemoveArgs {
    std::string ns, key;
    static std::vector<std::string> names();
    static Result<RemoveArgs> parse(const nlohmann::json& j);
    nlohmann::json build() const;
};

struct PutAnswer {
    uint64_t version = 0;
    static Result<PutAnswer> parse(const nlohmann::json& j);
    nlohmann::json build() const;
};

struct GetArgs {
    std::string ns, key;
    bool wait = false;  // wait-for-create
    static std::vector<std::string> names();
    static Result<GetArgs> parse(const nlohmann::json& j);
    nlohmann::json build() const;
};

// The answer of kvs.get: one entry.
struct EntryAnswer {
    std::string value;
    uint64_t version = 0;
    static Result<EntryAnswer> parse(const nlohmann::json& j);
    nlohmann::json build() const;
};

struct ListArgs {
    std::string ns, prefix, after;  // after: "" from the first
    uint64_t limit = 0;             // 0: the store's default
    bool raw = false;               // "answer": "raw": the compact answer
    static std::vector<std::string> names();
    static Result<ListArgs> parse(const nlohmann::json& j);
    nlohmann::json build() const;
};

struct ListEntry {
    std::string key, value;
    uint64_t version = 0;
};

// The answer of kvs.list: the entries in the meta, or (a request with
// "answer": "raw") the compact form, {"format": "raw", "count": n, "more":
// m} with the entries in the frame's data, each: the key's length (u32,
// little-endian), the key, the version (u64), the value's length (u32), the
// value; so that a value, a record's JSON, is not escaped into the meta and
// parsed twice (docs/wire-protocol.md, "Listing in pages").
struct ListAnswer {
    std::vector<ListEntry> entries;
    bool more = false;  // ask again with after = the last key
    bool raw = false;   // parsed: the entries are in the data (count of them)
    uint64_t count = 0;
    static Result<ListAnswer> parse(nlohmann::json&& j);
    nlohmann::json build() const;
    static nlohmann::json build_raw(uint64_t count, bool more);
    static void append_raw(std::string* data, const ListEntry& e);
    // `count` entries that fill `data` exactly (keys of kMaxText bytes at
    // most, values of kMaxValue).
    static Result<std::vector<ListEntry>> parse_raw(const std::string& data, uint64_t count);
};

struct GetManyArgs {
    std::string ns;
    std::vector<std::string> keys;  // at most kMaxKeys
    bool raw = false;               // "answer": "raw": the compact answer
    static std::vector<std::string> names();
    static Result<GetManyArgs> parse(const nlohmann::json& j);
    nlohmann::json build() const;
};

// The meta of kvs.get_many's answer: the compact form ({"format": "raw",
// "count": n}, the entries in the frame's data), or the entries in the
// meta (an older service): per key [value, version], 0 absent, null later.
struct GetManyAnswer {
    bool raw = false;
    uint64_t count = 0;      // raw: entries in the data
    nlohmann::json entries;  // not raw: the array (moved out of the answer)
    static Result<GetManyAnswer> parse(nlohmann::json&& j);
    static nlohmann::json build_raw(uint64_t count);
    static nlohmann::json build_entries(nlohmann::json entries);
};

// kvs.changes: the records put in `ns` after revision `after` (0: none, only
// the revision now, to list from), waiting up to `wait` seconds for the
// first (the service caps it).
struct ChangesArgs {
    std::string ns;
    uint64_t after = 0;
    double wait = 0;
    static std::vector<std::string> names();
    static Result<ChangesArgs> parse(const nlohmann::json& j);
    nlohmann::json build() const;
};

// Its answer: {"entries": [{key, value, version}...], "next": R,
// "compacted": bool}: every record put after `after` up to revision `next`
// (ask again with after = next); compacted: the store no longer holds the
// changes after `after` (list again).
struct ChangesAnswer {
    std::vector<ListEntry> entries;
    uint64_t next = 0;
    bool compacted = false;
    static Result<ChangesAnswer> parse(nlohmann::json&& j);
    nlohmann::json build() const;
};

}  // namespace dyad::proto::kvs
