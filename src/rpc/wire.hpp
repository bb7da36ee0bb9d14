// SPDX-License-Identifier: Apache-2.0
// DYAD wire format (docs/wire-protocol.md): every frame is a 24-byte
// little-endian header, then meta_len bytes of JSON, then data_len raw bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.hpp"

namespace dyad::rpc {

constexpr uint32_t kMagic = 0x44415944;  // bytes "DYAD" on the wire
constexpr uint16_t kVersion = 2;         // 2: authenticated hello (docs/wire-protocol.md)
constexpr size_t kHeaderSize = 24;
constexpr uint32_t kMaxMeta = 1u << 20;
constexpr uint32_t kMaxData = 64u << 20;

enum class Type : uint8_t {
    hello = 1,     // first frame each way: version check, identities
    request = 2,   // meta: {"topic": ..., "timeout_ms": ..., args...}
    response = 3,  // one part of a (possibly streaming) answer; more follow
    end = 4,       // last frame of a successful answer (DYAD's ENODATA)
    error = 5,     // last frame of a failed answer: errnum + {"msg": ..., "rc": ...}
    cancel = 6,    // client -> server: stop working on request `tag`
    update = 7,    // client -> server: more input for request `tag` (e.g. credits)
};

struct Header {
    uint16_t version = kVersion;
    Type type = Type::request;
    uint8_t flags = 0;
    uint32_t tag = 0;
    int32_t errnum = 0;
    uint32_t meta_len = 0;
    uint32_t data_len = 0;
};

void encode_header(const Header& h, uint8_t out[kHeaderSize]);
// Checks magic, version, type and lengths; a bad header is EPROTO.
Status decode_header(const uint8_t in[kHeaderSize], Header* h);
const char* type_name(Type t);

// Parses a frame's JSON meta, refusing nesting deeper than kMaxJsonDepth
// (deep nesting would overflow the stack when the value is copied).
// Returns a discarded value on any error.
constexpr int kMaxJsonDepth = 32;
nlohmann::json parse_meta(const std::string& text);

// Parsed service address: "tcp://HOST:PORT" or "unix:PATH".
struct Uri {
    bool is_unix = false;
    std::string host;
    uint16_t port = 0;
    std::string path;
    std::string str() const;
};
Result<Uri> parse_uri(const std::string& s);

}  // namespace dyad::rpc
