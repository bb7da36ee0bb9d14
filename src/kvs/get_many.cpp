// SPDX-License-Identifier: Apache-2.0
#include "get_many.hpp"

#include <cerrno>

#include "proto/kvs.hpp"
#include "proto/little_endian.hpp"

namespace dyad::kvs {

namespace {

enum : uint8_t { kRawMissing = 0, kRawFound = 1, kRawLater = 2 };

using proto::get_le;
using proto::put_le;

}  // namespace

void append_raw_entry(std::string* out, const Lookup& l) {
    switch (l.state) {
        case Lookup::State::missing:
            out->push_back(static_cast<char>(kRawMissing));
            return;
        case Lookup::State::later:
            out->push_back(static_cast<char>(kRawLater));
            return;
        case Lookup::State::found:
            out->push_back(static_cast<char>(kRawFound));
            put_le(out, l.entry.version, 8);
            put_le(out, l.entry.value.size(), 4);
            out->append(l.entry.value);
            return;
    }
}

Result<std::vector<Lookup>> parse_raw_entries(const std::string& data, size_t count) {
    auto bad = [](const std::string& why) {
        return Status(DYAD_RC_BADRPC, "malformed kvs.get_many answer: " + why, EPROTO);
    };
    std::vector<Lookup> out(count);
    size_t at = 0;
    for (size_t i = 0; i < count; ++i) {
        if (at >= data.size()) return bad("fewer entries than keys");
        const uint8_t tag = static_cast<uint8_t>(data[at++]);
        if (tag == kRawMissing) {
            out[i].state = Lookup::State::missing;
        } else if (tag == kRawLater) {
            out[i].state = Lookup::State::later;
        } else if (tag == kRawFound) {
            if (data.size() - at < 12) return bad("an entry cut short");
            out[i].entry.version = get_le(data.data() + at, 8);
            const uint64_t len = get_le(data.data() + at + 8, 4);
            at += 12;
            if (data.size() - at < len) return bad("a value cut short");
            out[i].entry.value.assign(data, at, static_cast<size_t>(len));
            at += static_cast<size_t>(len);
            out[i].state = Lookup::State::found;
        } else {
            return bad("unknown entry type " + std::to_string(tag));
        }
    }
    if (at != data.size()) return bad("bytes after the last entry");
    return out;
}

Result<std::vector<Lookup>> get_many(rpc::ConnectionPool& pool, const std::string& uri,
                                     const std::string& ns, const std::vector<std::string>& keys,
                                     Deadline deadline) {
    bool connect_failed = false;
    std::string data;
    proto::kvs::GetManyArgs args{ns, keys, true};
    auto r = pool.call(uri, proto::kvs::kGetMany, args.build(), deadline, 0, true, &connect_failed,
                       &data);
    if (!r && connect_failed) return Status(r.status()).wrap("metadata store");
    if (!r) return r.status();
    auto bad = [&uri](const std::string& why) {
        return Status(DYAD_RC_BADRPC,
                      "the metadata store at " + uri + " answered kvs.get_many " + why, EPROTO);
    };
    auto answer = proto::kvs::GetManyAnswer::parse(std::move(r.value()));
    if (!answer || (answer->raw && answer->count != keys.size()))
        return bad("in a form this DYAD does not read");
    if (answer->raw) {  // the compact answer
        auto got = parse_raw_entries(data, keys.size());
        if (!got) return Status(got.status()).wrap("the metadata store at " + uri);
        return got;
    }
    // An older service, which ignores "answer": the entries in the meta.
    auto& entries = answer->entries;  // its strings are moved out
    if (entries.size() != keys.size()) return bad("without one entry per key");
    std::vector<Lookup> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
        auto& e = entries[i];
        if (e.is_null()) continue;  // later
        if (e.is_number()) {
            out[i].state = Lookup::State::missing;
            continue;
        }
        if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number_unsigned())
            return bad("with a malformed entry");
        out[i].state = Lookup::State::found;
        out[i].entry.value = std::move(e[0].get_ref<std::string&>());
        out[i].entry.version = e[1].get<uint64_t>();
    }
    return out;
}

Result<std::vector<Lookup>> Store::get_many(const std::string& ns,
                                            const std::vector<std::string>& keys, Deadline d) {
    std::vector<Lookup> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
        auto e = get(ns, keys[i], d);
        if (!e && e.status().rc() != DYAD_RC_NOTFOUND) return e.status();
        out[i].state = e ? Lookup::State::found : Lookup::State::missing;
        if (e) out[i].entry = std::move(e.value());
    }
    return out;
}

Result<std::vector<Lookup>> RpcStore::get_many(const std::string& ns,
                                               const std::vector<std::string>& keys, Deadline d) {
    return kvs::get_many(*pool_, uri_, ns, keys, d);
}

}  // namespace dyad::kvs
