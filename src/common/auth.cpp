// SPDX-License-Identifier: Apache-2.0
#include "auth.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <mutex>

#include "fd.hpp"

namespace dyad::auth {
namespace {

void init_sodium() {
    static std::once_flag once;
    std::call_once(once, [] {
        if (::sodium_init() < 0) std::abort();  // no randomness source: nothing is safe
    });
}

std::string to_hex(const unsigned char* p, size_t n) {
    std::string out(2 * n + 1, '\0');
    ::sodium_bin2hex(out.data(), out.size(), p, n);
    out.pop_back();
    return out;
}

void mac(const std::string& secret, std::string_view label,
         std::initializer_list<std::string_view> parts,
         unsigned char out[crypto_auth_hmacsha256_BYTES]) {
    crypto_auth_hmacsha256_state st;
    ::crypto_auth_hmacsha256_init(&st, reinterpret_cast<const unsigned char*>(secret.data()),
                                  secret.size());
    auto update = [&st](std::string_view part) {
        unsigned char len[8];
        uint64_t n = part.size();
        for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
        ::crypto_auth_hmacsha256_update(&st, len, sizeof len);
        ::crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(part.data()),
                                        part.size());
    };
    update(label);
    for (std::string_view part : parts) update(part);
    ::crypto_auth_hmacsha256_final(&st, out);
    ::sodium_memzero(&st, sizeof st);
}

}  // namespace

Result<std::shared_ptr<const Key>> Key::load(const std::string& path) {
    init_sodium();
    const std::string what = "key file '" + path + "'";
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
    if (!fd.valid())
        return Status(DYAD_RC_NOAUTH,
                      "cannot open " + what + ": create one with `dyad keygen FILE`", errno);
    struct stat sb;
    if (::fstat(fd.get(), &sb) != 0) return Status(DYAD_RC_NOAUTH, "cannot stat " + what, errno);
    if (!S_ISREG(sb.st_mode))
        return Status(DYAD_RC_NOAUTH, what + " is not a regular file", EINVAL);
    if (sb.st_mode & 077) {
        char mode[8];
        std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(sb.st_mode & 07777));
        return Status(DYAD_RC_NOAUTH,
                      what + " is readable or writable by others (mode " + mode +
                          "): refused; run `chmod 600 " + path + "`",
                      EACCES);
    }
    if (sb.st_size > (1 << 16))
        return Status(DYAD_RC_NOAUTH, what + " is larger than 64 KiB: not a key file", EINVAL);
    std::string secret(static_cast<size_t>(sb.st_size), '\0');
    size_t got = 0;
    while (got < secret.size()) {
        ssize_t r = ::read(fd.get(), secret.data() + got, secret.size() - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return Status(DYAD_RC_NOAUTH, "cannot read " + what, errno);
        if (r == 0) break;
        got += static_cast<size_t>(r);
    }
    secret.resize(got);
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r' ||
                               secret.back() == ' ' || secret.back() == '\t'))
        secret.pop_back();
    if (secret.size() < kMinKeyBytes)
        return Status(DYAD_RC_NOAUTH,
                      what + " holds " + std::to_string(secret.size()) +
                          " bytes; a key needs at least " + std::to_string(kMinKeyBytes) +
                          ": create one with `dyad keygen FILE`",
                      EINVAL);
    return std::shared_ptr<const Key>(new Key(std::move(secret), path));
}

Status Key::generate(const std::string& path) {
    init_sodium();
    unsigned char raw[32];
    ::randombytes_buf(raw, sizeof raw);
    std::string text = to_hex(raw, sizeof raw) + "\n";
    ::sodium_memzero(raw, sizeof raw);
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd.valid())
        return Status(DYAD_RC_BADFIO,
                      "cannot create key file '" + path + "'" +
                          (errno == EEXIST ? std::string(": it exists (a key is never overwritten)")
                                           : std::string()),
                      errno);
    // The umask may have narrowed it, never widened: make it exactly 0600.
    if (::fchmod(fd.get(), 0600) != 0 ||
        ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
        ::fsync(fd.get()) != 0) {
        int e = errno;
        ::unlink(path.c_str());
        return Status(DYAD_RC_BADFIO, "cannot write key file '" + path + "'", e);
    }
    return Status::ok();
}

std::shared_ptr<const Key> Key::from_secret(std::string secret) {
    init_sodium();
    return std::shared_ptr<const Key>(new Key(std::move(secret), "(memory)"));
}

std::string Key::proof(std::string_view label,
                       std::initializer_list<std::string_view> parts) const {
    unsigned char out[crypto_auth_hmacsha256_BYTES];
    mac(secret_, label, parts, out);
    return to_hex(out, sizeof out);
}

bool Key::verify(std::string_view proof, std::string_view label,
                 std::initializer_list<std::string_view> parts) const {
    unsigned char got[crypto_auth_hmacsha256_BYTES];
    size_t len = 0;
    if (proof.size() != 2 * sizeof got ||
        ::sodium_hex2bin(got, sizeof got, proof.data(), proof.size(), nullptr, &len, nullptr) !=
            0 ||
        len != sizeof got)
        return false;
    unsigned char want[crypto_auth_hmacsha256_BYTES];
    mac(secret_, label, parts, want);
    return ::crypto_verify_32(got, want) == 0;
}

SessionKey Key::derive(std::string_view label,
                       std::initializer_list<std::string_view> parts) const {
    static_assert(sizeof(SessionKey) == crypto_auth_hmacsha256_BYTES);
    SessionKey k;
    mac(secret_, label, parts, k.data());
    return k;
}

void FrameMac::compute(const uint8_t* header, size_t header_len, std::string_view meta,
                       std::string_view data, uint8_t out[kTagBytes]) {
    crypto_generichash_blake2b_state st;
    ::crypto_generichash_blake2b_init(&st, key_.data(), key_.size(), kTagBytes);
    unsigned char seq[8];
    for (int i = 0; i < 8; ++i) seq[i] = static_cast<unsigned char>(seq_ >> (8 * i));
    ::crypto_generichash_blake2b_update(&st, seq, sizeof seq);
    ::crypto_generichash_blake2b_update(&st, header, header_len);
    ::crypto_generichash_blake2b_update(&st, reinterpret_cast<const unsigned char*>(meta.data()),
                                        meta.size());
    if (!data.empty())
        ::crypto_generichash_blake2b_update(
            &st, reinterpret_cast<const unsigned char*>(data.data()), data.size());
    ::crypto_generichash_blake2b_final(&st, out, kTagBytes);
    ++seq_;
}

void FrameMac::sign(const uint8_t* header, size_t header_len, std::string_view meta,
                    uint8_t out[kTagBytes], std::string_view data) {
    compute(header, header_len, meta, data, out);
}

bool FrameMac::check(const uint8_t* header, size_t header_len, std::string_view meta,
                     const uint8_t tag[kTagBytes], std::string_view data) {
    uint8_t want[kTagBytes];
    compute(header, header_len, meta, data, want);
    return ::crypto_verify_16(want, tag) == 0;
}

std::string new_nonce() {
    init_sodium();
    unsigned char raw[kNonceBytes];
    ::randombytes_buf(raw, sizeof raw);
    return to_hex(raw, sizeof raw);
}

bool valid_nonce(std::string_view s) {
    if (s.size() != 2 * kNonceBytes) return false;
    for (char c : s)
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return false;
    return true;
}

}  // namespace dyad::auth
