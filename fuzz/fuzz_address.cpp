// SPDX-License-Identifier: Apache-2.0
// Transport address blobs: UCX worker addresses and rkeys and the OFI
// service address travel as base64 in JSON (ucx_worker, ucx_rkey, ofi_addr)
// and are decoded before anything else looks at them; service addresses
// travel as URIs (parse_uri). A UCX worker address then goes through
// parse_ucx_worker_address and ucx_address_fits, a window key through
// parse_ucx_rkey, a libfabric one through
// check_ofi_peer_address (src/dtl/peer_address.hpp), before UCX or
// libfabric see it; what they make of an accepted one needs a live worker
// or fabric and is not fuzzed here. Properties: no crash; base64 decoding
// refuses what is not base64 and inverts encoding; a parsed URI prints as a
// URI that parses to the same address; an accepted UCX address has a
// transport and a version UCX knows, and is refused as our own address.
#include <cstdint>
#include <string>

#include "common/base64.hpp"
#include "dtl/peer_address.hpp"
#include "fuzz_check.hpp"
#include "rpc/wire.hpp"

using namespace dyad;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string text(reinterpret_cast<const char*>(data), size);

    // The input as a blob: encode, decode back.
    std::string enc = base64_encode(text);
    FUZZ_CHECK(enc.size() == (size + 2) / 3 * 4);
    auto dec = base64_decode(enc);
    FUZZ_CHECK(dec && dec.value() == text);

    // The input as peer-sent base64.
    auto blob = base64_decode(text);
    if (blob) {
        FUZZ_CHECK(size % 4 == 0 && blob->size() <= size / 4 * 3);
        FUZZ_CHECK(base64_decode(base64_encode(blob.value())).value() == blob.value());
    }

    // The input as a UCX worker address (raw and as base64 of it).
    for (const std::string* b : {&text, blob ? &blob.value() : nullptr}) {
        if (!b) continue;
        auto ucx = dtl::parse_ucx_worker_address(*b);
        if (ucx) {
            FUZZ_CHECK(!ucx->entries.empty() && ucx->version <= 1 && !b->empty());
            FUZZ_CHECK((static_cast<uint8_t>((*b)[0]) & 0x0f) == ucx->version);
            Status self = dtl::ucx_address_fits(ucx.value(), ucx.value());
            FUZZ_CHECK(ucx->has_uuid ? !self.is_ok() : self.is_ok());
        } else {
            FUZZ_CHECK(ucx.status().rc() == DYAD_RC_UCXEP_FAIL);
        }
    }
    // The input as a UCX window key: an accepted one ends inside the blob
    // with one key per bit of its map.
    for (const std::string* b : {&text, blob ? &blob.value() : nullptr}) {
        if (!b) continue;
        auto key = dtl::parse_ucx_rkey(*b);
        if (key) {
            FUZZ_CHECK(key->key_bytes <= b->size() && key->md_map != 0 &&
                       key->keys == static_cast<size_t>(__builtin_popcountll(key->md_map)));
        } else {
            FUZZ_CHECK(key.status().rc() == DYAD_RC_UCXRKEY_UNPACK_FAILED);
        }
    }
    // The input as a libfabric address next to itself and a sockaddr_in.
    FUZZ_CHECK(dtl::check_ofi_peer_address(text, text, true).is_ok());
    FUZZ_CHECK(dtl::check_ofi_peer_address(text, std::string(16, '\2'), true).is_ok() ==
               (size == 16 && text.compare(0, 2, std::string(2, '\2')) == 0));

    // The input as a service URI.
    auto u = rpc::parse_uri(text);
    if (u) {
        auto again = rpc::parse_uri(u->str());
        if (!u->is_unix && u->host.find(':') != std::string::npos)
            return 0;  // an IPv6 host prints without its brackets
        FUZZ_CHECK(again);
        FUZZ_CHECK(again->is_unix == u->is_unix && again->host == u->host &&
                   again->port == u->port && again->path == u->path);
    } else {
        // Logged, and in JSON output with replacement of invalid UTF-8.
        (void)nlohmann::json({{"msg", u.status().message()}})
            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    return 0;
}
