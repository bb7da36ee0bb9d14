// SPDX-License-Identifier: Apache-2.0
// DYAD wire format (docs/wire-protocol.md): every frame is a 24-byte
// little-endian header, then meta_len bytes of JSON, then data_len raw bytes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.hpp"

namespace dyad::rpc {

constexpr uint32_t kMagic = 0x44415944;  // bytes "DYAD" on the wire
// 2: authenticated hello; 3: the hello's proofs cover its whole transcript
// and the connection's addresses, and every later frame of a keyed
// connection carries a tag (docs/wire-protocol.md section 4).
constexpr uint16_t kVersion = 3;
constexpr size_t kHeaderSize = 24;
constexpr uint32_t kMaxMeta = 1u << 20;
constexpr uint32_t kMaxData = 64u << 20;
// The most meta a frame may carry before its sender is admitted (a hello is
// ~300 bytes): a bare header never reserves more than this of a service's
// memory for a peer it does not know.
constexpr uint32_t kMaxHelloMeta = 4096;
// The hello's deadlines, one for each side and for a different purpose:
// - a client gives a service kHelloAnswerTimeout to answer its hello once
//   the connection is up (Connection::connect). A dyadd answers in
//   milliseconds; anything slower is not a DYAD service (a silent listener,
//   an HTTP server...) or one that is stopped, and is reported as such well
//   before the caller's own deadline.
// - a service gives a peer kHelloAdmitTimeout from the accept to its
//   admission (its hello and, with a key, its proof; the Session), then
//   drops it: a connection that says nothing holds no slot for long, while
//   a client on a loaded node still has ample time.
constexpr std::chrono::milliseconds kHelloAnswerTimeout{2500};
// How long a client tries again a Unix socket that is there and refuses
// (a service still starting: client.cpp).
constexpr double kStartingSocketWait = 2.0;
constexpr std::chrono::seconds kHelloAdmitTimeout{10};

enum class Type : uint8_t {
    hello = 1,     // first frame each way: version check, identities
    request = 2,   // meta: {"topic": ..., "timeout_ms": ..., args...}
    response = 3,  // one part of a (possibly streaming) answer; more follow
    end = 4,       // last frame of a successful answer (DYAD's ENODATA)
    error = 5,     // last frame of a failed answer: errnum + {"msg": ..., "rc": ...}
    cancel = 6,    // client -> server: stop working on request `tag`
    update = 7,    // client -> server: more input for request `tag` (e.g. credits)
};

// The header's flags: how much of a frame's data its tag covers (section 2
// of docs/wire-protocol.md). Without either, none: file bytes are checked
// end to end by their size and XXH3, which come in tagged meta. A service
// sets one on the compact answers, whose metadata travels in the data:
// kvs.list's and kvs.get_many's (all of the data) and fetch_many's files
// (the index and XXH3 before the bytes). Set only on tagged frames.
constexpr uint8_t kFlagTagData = 0x01;  // the tag covers all of the data
constexpr uint8_t kFlagTagHead = 0x02;  // the tag covers the data's first kTagHead bytes
constexpr uint8_t kTagFlags = kFlagTagData | kFlagTagHead;
constexpr uint32_t kTagHead = 12;

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
// Checks magic, version, type and lengths (and that a frame whose tag covers
// its data's head has one); a bad header is EPROTO.
Status decode_header(const uint8_t in[kHeaderSize], Header* h);
// The bytes of the frame's data its tag covers (its flags say how many).
inline uint32_t tagged_data_len(const Header& h) {
    if (h.flags & kFlagTagData) return h.data_len;
    if (h.flags & kFlagTagHead) return h.data_len < kTagHead ? h.data_len : kTagHead;
    return 0;
}
const char* type_name(Type t);

// Parses a frame's JSON meta, refusing nesting deeper than kMaxJsonDepth
// (deep nesting would overflow the stack when the value is copied).
// Returns a discarded value on any error.
constexpr int kMaxJsonDepth = 32;
nlohmann::json parse_meta(const std::string& text);

// "IP:PORT" ("[IPv6]:PORT"; an IPv4-mapped IPv6 address as IPv4) of a
// TCP socket's own end, or of its peer's; "" for other sockets or on error.
// Both ends of one connection see the same pair, swapped: the hello binds
// its proofs to them (a relay has two connections, and two pairs).
std::string socket_endpoint(int fd, bool peer);

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
