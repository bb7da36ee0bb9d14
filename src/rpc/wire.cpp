// SPDX-License-Identifier: Apache-2.0
#include "wire.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace dyad::rpc {
namespace {
void put16(uint8_t* p, uint16_t v) {
    p[0] = v & 0xff;
    p[1] = v >> 8;
}
void put32(uint8_t* p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = (v >> (8 * i)) & 0xff;
}
uint16_t get16(const uint8_t* p) {
    return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint32_t get32(const uint8_t* p) {
    return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
           (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
}  // namespace

void encode_header(const Header& h, uint8_t out[kHeaderSize]) {
    put32(out, kMagic);
    put16(out + 4, h.version);
    out[6] = static_cast<uint8_t>(h.type);
    out[7] = h.flags;
    put32(out + 8, h.tag);
    put32(out + 12, static_cast<uint32_t>(h.errnum));
    put32(out + 16, h.meta_len);
    put32(out + 20, h.data_len);
}

Status decode_header(const uint8_t in[kHeaderSize], Header* h) {
    if (get32(in) != kMagic)
        return Status(DYAD_RC_BADRPC, "not a DYAD peer (bad magic): is the URI pointing at dyadd?",
                      EPROTO);
    h->version = get16(in + 4);
    if (h->version != kVersion)
        return Status(DYAD_RC_BADRPC,
                      "peer speaks wire protocol version " + std::to_string(h->version) +
                          ", this build speaks " + std::to_string(kVersion) +
                          ": run the same DYAD version on both sides",
                      EPROTO);
    uint8_t t = in[6];
    if (t < 1 || t > 7)
        return Status(DYAD_RC_BADRPC, "unknown frame type " + std::to_string(t), EPROTO);
    h->type = static_cast<Type>(t);
    h->flags = in[7];
    h->tag = get32(in + 8);
    h->errnum = static_cast<int32_t>(get32(in + 12));
    h->meta_len = get32(in + 16);
    h->data_len = get32(in + 20);
    if (h->meta_len > kMaxMeta || h->data_len > kMaxData)
        return Status(DYAD_RC_BADRPC, "frame too large", EMSGSIZE);
    if ((h->flags & kTagFlags) == kTagFlags)
        return Status(DYAD_RC_BADRPC,
                      "a frame whose flags say its tag covers both all its data and its head",
                      EPROTO);
    // The receiver reads what the tag covers before it can check it: no
    // more than a meta may be (compact answers are far smaller).
    if ((h->flags & kFlagTagData) && h->data_len > kMaxMeta)
        return Status(DYAD_RC_BADRPC,
                      "a frame whose tag covers " + std::to_string(h->data_len) +
                          " bytes of data, more than the " + std::to_string(kMaxMeta) + " it may",
                      EPROTO);
    if ((h->flags & kFlagTagHead) && h->data_len < kTagHead)
        return Status(DYAD_RC_BADRPC,
                      "a frame whose tag covers its data's first " + std::to_string(kTagHead) +
                          " bytes has only " + std::to_string(h->data_len),
                      EPROTO);
    return Status::ok();
}

std::string socket_endpoint(int fd, bool peer) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    auto* sa = reinterpret_cast<sockaddr*>(&ss);
    if ((peer ? ::getpeername(fd, sa, &len) : ::getsockname(fd, sa, &len)) != 0) return "";
    char buf[INET6_ADDRSTRLEN] = {0};
    if (ss.ss_family == AF_INET) {
        auto* in = reinterpret_cast<sockaddr_in*>(&ss);
        ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
        return std::string(buf) + ":" + std::to_string(ntohs(in->sin_port));
    }
    if (ss.ss_family == AF_INET6) {
        auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
        const uint16_t port = ntohs(in6->sin6_port);
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
            in_addr v4;
            std::memcpy(&v4, in6->sin6_addr.s6_addr + 12, sizeof v4);
            ::inet_ntop(AF_INET, &v4, buf, sizeof buf);
            return std::string(buf) + ":" + std::to_string(port);
        }
        ::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
        return "[" + std::string(buf) + "]:" + std::to_string(port);
    }
    return "";
}

const char* type_name(Type t) {
    switch (t) {
        case Type::hello:
            return "hello";
        case Type::request:
            return "request";
        case Type::response:
            return "response";
        case Type::end:
            return "end";
        case Type::error:
            return "error";
        case Type::cancel:
            return "cancel";
        case Type::update:
            return "update";
    }
    return "?";
}

nlohmann::json parse_meta(const std::string& text) {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (char c : text) {
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"')
            in_string = true;
        else if (c == '[' || c == '{') {
            if (++depth > kMaxJsonDepth) return nlohmann::json(nlohmann::json::value_t::discarded);
        } else if (c == ']' || c == '}')
            --depth;
    }
    return nlohmann::json::parse(text, nullptr, false);
}

std::string Uri::str() const {
    // "unix://P" is read as "unix:P": a path that itself starts with "//"
    // keeps that prefix only behind one more (found by fuzz_address).
    if (is_unix) return (path.rfind("//", 0) == 0 ? "unix://" : "unix:") + path;
    return "tcp://" + host + ":" + std::to_string(port);
}

Result<Uri> parse_uri(const std::string& s) {
    Uri u;
    auto bad = [&](const std::string& why) {
        return Status(DYAD_RC_CONNFAIL,
                      "bad service URI '" + s + "': " + why + " (use tcp://HOST:PORT or unix:PATH)",
                      EINVAL);
    };
    if (s.rfind("unix:", 0) == 0) {
        u.is_unix = true;
        u.path = s.substr(5);
        if (u.path.rfind("//", 0) == 0) u.path = u.path.substr(2);
        if (u.path.empty()) return bad("empty socket path");
        if (u.path.size() >= 108) return bad("socket path longer than 107 bytes");
        return u;
    }
    std::string rest = s;
    if (rest.rfind("tcp://", 0) == 0)
        rest = rest.substr(6);
    else if (rest.find("://") != std::string::npos)
        return bad("unknown scheme");
    size_t colon = rest.rfind(':');
    if (colon == std::string::npos) return bad("missing port");
    u.host = rest.substr(0, colon);
    if (u.host.size() > 2 && u.host.front() == '[' && u.host.back() == ']')
        u.host = u.host.substr(1, u.host.size() - 2);
    if (u.host.empty()) return bad("missing host");
    std::string port = rest.substr(colon + 1);
    char* end = nullptr;
    long p = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end || p < 0 || p > 65535) return bad("bad port");
    u.port = static_cast<uint16_t>(p);
    return u;
}

}  // namespace dyad::rpc
