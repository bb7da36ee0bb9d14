// SPDX-License-Identifier: Apache-2.0
#include "get_many.hpp"

#include <cerrno>

#include "rpc/server.hpp"

namespace dyad::kvs {

namespace {

enum : uint8_t { kRawMissing = 0, kRawFound = 1, kRawLater = 2 };

void put_le(std::string* out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i)
        v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
    return v;
}

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

void serve_get_many(rpc::Server& server, MemoryStore& store) {
    server.reads_args("kvs.get_many", {"ns", "keys", "answer"});
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
        auto format = a.find("answer");
        const bool raw = format != a.end() && format->is_string() && *format == "raw";
        // One entry per key, in order: [value, version] when found, 0 when
        // absent, null when it did not fit in this answer (ask again); or,
        // asked for "raw", the same in the end frame's data.
        nlohmann::json out = nlohmann::json::array();
        std::string data;
        if (raw) {
            size_t budget = kGetManyAnswerBudget;
            Lookup l;
            for (const auto& k : *keys) {
                auto e = budget ? store.get(nspace, k.get_ref<const std::string&>())
                                : std::optional<Entry>();
                l.state = budget == 0 ? Lookup::State::later
                          : e         ? Lookup::State::found
                                      : Lookup::State::missing;
                if (e && e->value.size() + 32 > budget) {
                    budget = 0;
                    l.state = Lookup::State::later;
                }
                if (l.state == Lookup::State::found) {
                    budget -= e->value.size() + 32;
                    l.entry = std::move(*e);
                }
                append_raw_entry(&data, l);
            }
            return r->end({{"format", "raw"}, {"count", keys->size()}}, std::move(data));
        }
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
    std::string data;
    auto r = pool.call(uri, "kvs.get_many", {{"ns", ns}, {"keys", keys}, {"answer", "raw"}},
                       deadline, 0, true, &connect_failed, &data);
    if (!r && connect_failed) return Status(r.status()).wrap("metadata store");
    if (!r) return r.status();
    auto format = r->find("format");
    if (format != r->end()) {  // the compact answer
        auto count = r->find("count");
        if (*format != "raw" || count == r->end() || *count != keys.size())
            return Status(DYAD_RC_BADRPC,
                          "the metadata store at " + uri +
                              " answered kvs.get_many in a form this DYAD does not read",
                          EPROTO);
        auto got = parse_raw_entries(data, keys.size());
        if (!got) return Status(got.status()).wrap("the metadata store at " + uri);
        return got;
    }
    // An older service, which ignores "answer": the entries in the meta.
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
