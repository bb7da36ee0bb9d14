// SPDX-License-Identifier: Apache-2.0
// The job key and the proofs of the hello handshake (docs/security.md,
// docs/wire-protocol.md section 4). A key file holds at least 32 random
// bytes (`dyad keygen` writes 64 hex digits) and must not be readable by
// group or others. Both sides prove they hold the key with an HMAC-SHA-256
// (libsodium) over the whole hello transcript (both hellos as sent, with
// both nonces, roles, service ids and the service's view of the
// connection), each side's proof under its own label so one can never stand
// for the other; proofs are compared in constant time. The transcript also
// gives each direction a key of its own, and every later frame carries a
// tag under it (FrameMac): a frame cannot be injected, replayed, reordered
// or moved to another connection.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "status.hpp"

namespace dyad::auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMinKeyBytes = 32;
inline constexpr const char* kScheme = "hmac-sha256-transcript";
inline constexpr size_t kTagBytes = 16;  // a frame's tag (keyed BLAKE2b)
using SessionKey = std::array<uint8_t, 32>;

class Key {
  public:
    // Reads and checks a key file: regular file, no group/other permissions,
    // at least kMinKeyBytes (trailing white space does not count).
    static Result<std::shared_ptr<const Key>> load(const std::string& path);
    // Writes a new key file (64 hex digits of 32 random bytes, mode 0600);
    // refuses to overwrite an existing file.
    static Status generate(const std::string& path);
    // A key from bytes (tests).
    static std::shared_ptr<const Key> from_secret(std::string secret);

    // Hex HMAC-SHA-256 of the label and the parts, each part preceded by
    // its length (8 bytes, little-endian): no two lists of parts give the
    // same input.
    std::string proof(std::string_view label, std::initializer_list<std::string_view> parts) const;
    // True when `proof` (hex, from the peer) is proof(label, parts); constant time.
    bool verify(std::string_view proof, std::string_view label,
                std::initializer_list<std::string_view> parts) const;
    // A key for one direction of one connection: the raw HMAC of the label
    // and the parts (the transcript), as proof() computes it.
    SessionKey derive(std::string_view label, std::initializer_list<std::string_view> parts) const;
    const std::string& path() const { return path_; }

  private:
    explicit Key(std::string secret, std::string path)
        : secret_(std::move(secret)), path_(std::move(path)) {}
    std::string secret_;
    std::string path_;
};

// The tags of one direction of a connection: the n-th frame's tag is the
// keyed BLAKE2b (16 bytes) of n (8 bytes, little-endian), the frame's
// header, its meta and the part of its data its header's flags name (none
// for most frames). Inactive (no tags) until given a key. Not
// thread-safe: one per direction, used by whoever sends (or reads) there.
class FrameMac {
  public:
    FrameMac() = default;
    explicit FrameMac(const SessionKey& key) : key_(key), active_(true) {}
    bool active() const { return active_; }
    // The tag of the next frame sent.
    void sign(const uint8_t* header, size_t header_len, std::string_view meta,
              uint8_t out[kTagBytes], std::string_view data = {});
    // True when `tag` is the next frame's; the count moves on either way
    // (a connection whose tag failed is closed).
    bool check(const uint8_t* header, size_t header_len, std::string_view meta,
               const uint8_t tag[kTagBytes], std::string_view data = {});
    uint64_t frames() const { return seq_; }

  private:
    void compute(const uint8_t* header, size_t header_len, std::string_view meta,
                 std::string_view data, uint8_t out[kTagBytes]);
    SessionKey key_{};
    bool active_ = false;
    uint64_t seq_ = 0;
};

// A fresh random nonce, hex (2 * kNonceBytes digits).
std::string new_nonce();
// True for exactly 2 * kNonceBytes hex digits (what a peer must send).
bool valid_nonce(std::string_view s);

}  // namespace dyad::auth
