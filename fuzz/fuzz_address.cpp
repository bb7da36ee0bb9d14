// SPDX-License-Identifier: Apache-2.0
// Transport address blobs: UCX worker addresses and rkeys and the OFI
// service address travel as base64 in JSON (ucx_worker, ucx_rkey, ofi_addr)
// and are decoded before anything else looks at them; service addresses
// travel as URIs (parse_uri). What UCX or libfabric then make of the bytes
// needs a live worker or fabric and is not fuzzed here. Properties: no
// crash; base64 decoding refuses what is not base64 and inverts encoding;
// a parsed URI prints as a URI that parses to the same address.
#include <cstdint>
#include <string>

#include "common/base64.hpp"
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
