// SPDX-License-Identifier: Apache-2.0
#include "checksum.hpp"

#include <cstdio>
#include <new>
#include <xxhash.h>
// On x86, libxxhash's runtime dispatch: XXH3 with the widest vectors the
// CPU has (AVX2, AVX-512) instead of the SSE2 the library is built for.
// Same digests. Measured on 1 MiB buffers here (AVX-512): 19 -> 40 GB/s.
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>
#endif

namespace dyad {

Xxh3::Xxh3() : state_(XXH3_createState()) {
    if (!state_) throw std::bad_alloc();
    XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Xxh3::~Xxh3() {
    XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}
void Xxh3::update(const void* p, size_t n) {
    if (n) XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), p, n);
}
uint64_t Xxh3::digest() const {
    return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}
uint64_t Xxh3::of(const void* p, size_t n) {
    return XXH3_64bits(p, n);
}
std::string Xxh3::to_hex(uint64_t v) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
    return b;
}

}  // namespace dyad
