// SPDX-License-Identifier: Apache-2.0
#include "keygen.hpp"

#include <cstring>

namespace dyad {
namespace {

inline uint64_t rotl64(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

inline uint64_t fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

inline uint64_t load64_le(const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

constexpr uint32_t kLevelPrimes[10] = {104677, 104681, 104683, 104693, 104701,
                                       104707, 104711, 104717, 104723, 104729};
constexpr size_t kPadTo = 128;

}  // namespace

void murmur3_x64_128(const void* data, size_t len, uint32_t seed, uint64_t out[2]) {
    const auto* bytes = static_cast<const uint8_t*>(data);
    const uint64_t c1 = 0x87c37b91114253d5ULL;
    const uint64_t c2 = 0x4cf5ad432745937fULL;
    uint64_t h1 = seed, h2 = seed;
    const size_t nblocks = len / 16;
    for (size_t i = 0; i < nblocks; ++i) {
        uint64_t k1 = load64_le(bytes + i * 16);
        uint64_t k2 = load64_le(bytes + i * 16 + 8);
        k1 *= c1;
        k1 = rotl64(k1, 31);
        k1 *= c2;
        h1 ^= k1;
        h1 = rotl64(h1, 27);
        h1 += h2;
        h1 = h1 * 5 + 0x52dce729;
        k2 *= c2;
        k2 = rotl64(k2, 33);
        k2 *= c1;
        h2 ^= k2;
        h2 = rotl64(h2, 31);
        h2 += h1;
        h2 = h2 * 5 + 0x38495ab5;
    }
    const uint8_t* tail = bytes + nblocks * 16;
    const size_t rem = len & 15;
    uint64_t k1 = 0, k2 = 0;
    // Bytes 8..14 of the tail feed k2, bytes 0..7 feed k1.
    for (size_t i = rem; i > 8; --i) k2 ^= static_cast<uint64_t>(tail[i - 1]) << (8 * (i - 9));
    if (rem > 8) {
        k2 *= c2;
        k2 = rotl64(k2, 33);
        k2 *= c1;
        h2 ^= k2;
    }
    for (size_t i = (rem < 8 ? rem : 8); i > 0; --i)
        k1 ^= static_cast<uint64_t>(tail[i - 1]) << (8 * (i - 1));
    if (rem > 0) {
        k1 *= c1;
        k1 = rotl64(k1, 31);
        k1 *= c2;
        h1 ^= k1;
    }
    h1 ^= len;
    h2 ^= len;
    h1 += h2;
    h2 += h1;
    h1 = fmix64(h1);
    h2 = fmix64(h2);
    h1 += h2;
    h2 += h1;
    out[0] = h1;
    out[1] = h2;
}

Result<std::string> gen_path_key(std::string_view upath, unsigned depth, unsigned bins) {
    if (upath.empty()) return Status(DYAD_RC_BADFIO, "cannot make a key for an empty path");
    if (bins == 0) return Status(DYAD_RC_BADMETADATA, "DYAD_KEY_BINS must be at least 1");
    std::string input(upath);
    if (input.size() < kPadTo) input.resize(kPadTo, '@');
    std::string key;
    uint32_t seed = 57;
    char buf[16];
    for (unsigned d = 0; d < depth; ++d) {
        seed += kLevelPrimes[d % 10];
        uint64_t h[2];
        murmur3_x64_128(input.data(), input.size(), seed, h);
        uint32_t x = static_cast<uint32_t>(h[0]) ^ static_cast<uint32_t>(h[0] >> 32) ^
                     static_cast<uint32_t>(h[1]) ^ static_cast<uint32_t>(h[1] >> 32);
        std::snprintf(buf, sizeof buf, "%x.", x % bins);
        key += buf;
    }
    key += upath;
    return key;
}

}  // namespace dyad
