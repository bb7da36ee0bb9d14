// SPDX-License-Identifier: Apache-2.0
// The compact answer of dyad.fetch_many: the binary header before a served
// file's bytes (the request and the JSON answers are proto/fetch.hpp's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.hpp"
#include "dtl/channel.hpp"
#include "dtl/dtl.hpp"

namespace dyad::dtl {

// Whether a transport's small files (at most kFetchManyFileMax bytes) of a
// consume of many files travel in dyad.fetch_many's answers, eagerly over
// the request connection, rather than one transfer each: the stream's, and
// UCX's unless DYAD_UCX_PROTO forces a UCX protocol (tag or put) for every
// file. UCX's per-file set-up (a lane, a tag, the owner's endpoint) costs
// more than 64 KiB of bytes: 1,000 x 64 KiB moved at 0.35x the stream one
// at a time (docs/design.md, "UCX for small files"). The request names the
// transport and the owner counts the files under it.
bool batches_small_files(const Backend& b);
// Whether an owner counts a dyad.fetch_many asking for `b` under it (the
// consumer's side decided: batches_small_files).
inline bool may_batch(const Backend& b) {
    return b.universal || b.kind == Kind::ucx;
}

// The compact answer (docs/wire-protocol.md, dyad.fetch_many): a served
// file's frame has no meta, and its data starts with this header, the
// file's index in files (u32, little-endian) and the XXH3-64 of its bytes
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

}  // namespace dyad::dtl
