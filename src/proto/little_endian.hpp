// SPDX-License-Identifier: Apache-2.0
// Little-endian integers of the wire's compact (raw) forms: kvs.list's
// "answer": "raw" pages and kvs.get_many's raw answer (docs/wire-protocol.md).
#pragma once

#include <cstdint>
#include <string>

namespace dyad::proto {

// Appends the low `bytes` bytes of v, least significant first.
inline void put_le(std::string* out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Reads `bytes` bytes at p, least significant first (the caller checked
// that they are there).
inline uint64_t get_le(const char* p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i)
        v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
    return v;
}

}  // namespace dyad::proto
