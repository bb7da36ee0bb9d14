// SPDX-License-Identifier: Apache-2.0
// End-to-end checksum: XXH3-64 computed while bytes stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dyad {

class Xxh3 {
  public:
    Xxh3();
    ~Xxh3();
    Xxh3(const Xxh3&) = delete;
    Xxh3& operator=(const Xxh3&) = delete;
    void update(const void* p, size_t n);
    uint64_t digest() const;
    std::string hex() const { return to_hex(digest()); }
    static std::string to_hex(uint64_t v);
    // The digest of one buffer (what update() of it alone then digest() give).
    static uint64_t of(const void* p, size_t n);

  private:
    void* state_;
};

}  // namespace dyad
