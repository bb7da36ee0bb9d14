// SPDX-License-Identifier: Apache-2.0
// DYAD's "hierarchical file locator": the metadata key of a managed path,
// bit-compatible with the original gen_path_key (MurmurHash3_x64_128 levels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "status.hpp"

namespace dyad {

// MurmurHash3_x64_128 (Appleby's algorithm), little-endian output words.
void murmur3_x64_128(const void* data, size_t len, uint32_t seed, uint64_t out[2]);

// "bin.bin.bin.upath" for depth levels of `bins` bins each. bins must be > 0.
Result<std::string> gen_path_key(std::string_view upath, unsigned depth, unsigned bins);

}  // namespace dyad
