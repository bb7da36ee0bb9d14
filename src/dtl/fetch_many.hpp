// SPDX-License-Identifier: Apache-2.0
// dyad.fetch_many's request, as the service reads it before anything else
// (src/service/fetch_many.cpp; fuzzed by fuzz/fuzz_request.cpp): "files", an
// array of 1 to kFetchManyFiles entries, each an object with a "upath" (and
// the generation, ns and key a single fetch carries). A malformed request is
// refused whole; a malformed entry is that file's error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/paths.hpp"
#include "common/status.hpp"
#include "dtl/channel.hpp"
#include "dtl/dtl.hpp"

namespace dyad::dtl {

// The compact answer (docs/wire-protocol.md, dyad.fetch_many): a served
// file's frame has no meta, and its data starts with this header, the
// file's index in "files" (u32, little-endian) and the XXH3-64 of its bytes
// (u64, little-endian); the bytes follow.
inline constexpr size_t kRawFileHeader = 12;

inline void put_raw_file_header(char* out, size_t index, uint64_t digest) {
    for (int b = 0; b < 4; ++b) out[b] = static_cast<char>((index >> (8 * b)) & 0xff);
    for (int b = 0; b < 8; ++b) out[4 + b] = static_cast<char>((digest >> (8 * b)) & 0xff);
}

struct RawFileHeader {
    uint32_t index = 0;
    uint64_t digest = 0;
};

inline RawFileHeader get_raw_file_header(const char* in) {
    RawFileHeader h;
    for (int b = 0; b < 4; ++b)
        h.index |= static_cast<uint32_t>(static_cast<unsigned char>(in[b])) << (8 * b);
    for (int b = 0; b < 8; ++b)
        h.digest |= static_cast<uint64_t>(static_cast<unsigned char>(in[4 + b])) << (8 * b);
    return h;
}

struct FetchManyEntry {
    std::string upath;    // normalized; empty with an error
    nlohmann::json args;  // the entry (generation, ns, key)
    Status error;         // set: this file is answered with it
};

inline Result<std::vector<FetchManyEntry>> parse_fetch_many(const nlohmann::json& a) {
    auto fs = a.is_object() ? a.find("files") : a.end();
    if (!a.is_object() || fs == a.end() || !fs->is_array() || fs->empty() ||
        fs->size() > kFetchManyFiles)
        return Status(DYAD_RC_BADUNPACK,
                      "fetch_many request without 'files' (1 to " +
                          std::to_string(kFetchManyFiles) + " of them)",
                      EINVAL);
    std::vector<FetchManyEntry> out(fs->size());
    for (size_t i = 0; i < fs->size(); ++i) {
        const auto& f = (*fs)[i];
        auto raw = f.is_object() ? meta_str(f, "upath") : std::nullopt;
        if (!raw) {
            out[i].error = Status(DYAD_RC_BADUNPACK, "fetch_many entry without 'upath'", EINVAL);
            continue;
        }
        auto up = normalize_upath(*raw);
        if (!up) {
            out[i].error = up.status();
            continue;
        }
        out[i].upath = std::move(up.value());
        out[i].args = f;
    }
    return out;
}

}  // namespace dyad::dtl
