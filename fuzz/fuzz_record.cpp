// SPDX-License-Identifier: Apache-2.0
// The store's records: a value as a (possibly buggy or hostile) service put
// it, read by consumers with Record::from_json, and checked by the store's
// check_put before it is kept. Properties: no crash, no exception, no
// undefined conversion; a record that parses survives to_json and back
// unchanged; the one-pass reading agrees with the full one; check_put lets
// a service write only records naming it owner.
#include <cstdint>
#include <string>

#include "fuzz_check.hpp"
#include "kvs/get_many.hpp"
#include "kvs/record.hpp"
#include "kvs/store.hpp"

using namespace dyad;

namespace {
// Every field a record's text carries (not the generation, which the store gives).
bool same_fields(const kvs::Record& a, const kvs::Record& b) {
    return a.upath == b.upath && a.owner == b.owner && a.node == b.node &&
           a.producer_dir == b.producer_dir && a.endpoints == b.endpoints && a.size == b.size &&
           a.mtime_ns == b.mtime_ns && a.mode == b.mode && a.ino == b.ino && a.rank == b.rank;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string text(reinterpret_cast<const char*>(data), size);
    auto r = kvs::Record::from_json(text, 7);
    // The one-pass reading of canonical text reads what the SAX reading
    // reads, where it reads at all.
    if (auto fast = kvs::detail::read_canonical(text)) {
        auto full = kvs::detail::read_any(text);
        FUZZ_CHECK(full);
        FUZZ_CHECK(same_fields(*fast, full.value()));
    }
    if (r) {
        const kvs::Record& a = r.value();
        (void)a.owner_rank();
        auto back = kvs::Record::from_json(a.to_json().dump(), 7);
        FUZZ_CHECK(back);
        FUZZ_CHECK(same_fields(a, back.value()) && back.value().generation == 7);
        // A service may put the record it names as owner.
        FUZZ_CHECK(kvs::check_put(a.owner, "dyad", "k", text) || a.owner.empty());
    } else {
        (void)nlohmann::json({{"msg", r.status().message()}}).dump();
    }
    Status st = kvs::check_put("svc-1", "dyad", "k", text);
    if (st) {
        auto j = nlohmann::json::parse(text, nullptr, false);
        FUZZ_CHECK(j.is_object() && j["owner"] == "svc-1");
    }
    FUZZ_CHECK(!kvs::check_put("", "dyad", "k", text));
    FUZZ_CHECK(
        !kvs::check_put("svc-1", kvs::kServicesNamespace, text == "svc-1" ? "x" : text, text));
    // The same bytes as kvs.get_many's compact answer (from a store that may
    // be hostile), for a key count taken from the first byte: refused with
    // EPROTO or read, and then written back to the very same bytes.
    if (!text.empty()) {
        const size_t count = static_cast<uint8_t>(text[0]) % 8;
        const std::string data = text.substr(1);
        auto got = kvs::parse_raw_entries(data, count);
        if (got) {
            FUZZ_CHECK(got->size() == count);
            std::string again;
            for (const auto& l : got.value()) kvs::append_raw_entry(&again, l);
            FUZZ_CHECK(again == data);
        } else {
            FUZZ_CHECK(got.status().err() == EPROTO);
        }
    }
    return 0;
}
