// SPDX-License-Identifier: Apache-2.0
// The job key and the proofs of the hello handshake (docs/security.md,
// docs/wire-protocol.md section 4). A key file holds at least 32 random
// bytes (`dyad keygen` writes 64 hex digits) and must not be readable by
// group or others. Both sides prove they hold the key with an HMAC-SHA-256
// (libsodium) over the nonces both sides chose for this connection, each
// side's proof under its own label so one can never stand for the other;
// proofs are compared in constant time.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "status.hpp"

namespace dyad::auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMinKeyBytes = 32;
inline constexpr const char* kScheme = "hmac-sha256";

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

    // Hex HMAC-SHA-256 of (label, client nonce, service nonce).
    std::string proof(std::string_view label, std::string_view client_nonce,
                      std::string_view service_nonce) const;
    // True when `proof` (hex, from the peer) is proof(label, ...); constant time.
    bool verify(std::string_view proof, std::string_view label, std::string_view client_nonce,
                std::string_view service_nonce) const;
    const std::string& path() const { return path_; }

  private:
    explicit Key(std::string secret, std::string path)
        : secret_(std::move(secret)), path_(std::move(path)) {}
    std::string secret_;
    std::string path_;
};

// A fresh random nonce, hex (2 * kNonceBytes digits).
std::string new_nonce();
// True for exactly 2 * kNonceBytes hex digits (what a peer must send).
bool valid_nonce(std::string_view s);

}  // namespace dyad::auth
