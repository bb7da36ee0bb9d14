// SPDX-License-Identifier: Apache-2.0
// Xxh3 (src/common/checksum.cpp) takes libxxhash's runtime-dispatched XXH3
// on x86 (AVX2 or AVX-512 where the CPU has them). Its digests are the ones
// every DYAD exchanges end to end, so they must be those of the library's
// plain XXH3_64bits: compared here on sizes around each of XXH3's code
// paths (0, 1-3, 4-8, 9-16, 17-128, 129-240, then the vectorized stripes
// and blocks), in one call and streamed in pieces.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <string>
#include <vector>

#include "common/checksum.hpp"

using dyad::Xxh3;

TEST(Xxh3, DigestsAreThoseOfPlainXxh3) {
    EXPECT_EQ(Xxh3::of(nullptr, 0), 0x2D06800538D394C2ull);  // XXH3's published empty digest
    std::vector<unsigned char> bytes((1u << 20) + 4099);
    uint32_t x = 12345;
    for (auto& b : bytes) {
        x = x * 1103515245u + 12345u;
        b = static_cast<unsigned char>(x >> 24);
    }
    for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{4}, size_t{8}, size_t{9}, size_t{16},
                     size_t{17}, size_t{128}, size_t{129}, size_t{240}, size_t{241}, size_t{1023},
                     size_t{1024}, size_t{4096}, size_t{65537}, bytes.size()}) {
        SCOPED_TRACE(n);
        const uint64_t want = XXH3_64bits(bytes.data(), n);
        EXPECT_EQ(Xxh3::of(bytes.data(), n), want);
        Xxh3 streamed;
        for (size_t at = 0, piece = 1; at < n; at += piece, piece = piece * 3 + 1)
            streamed.update(bytes.data() + at, std::min(piece, n - at));
        EXPECT_EQ(streamed.digest(), want);
        EXPECT_EQ(Xxh3::to_hex(want).size(), 16u);
    }
}
