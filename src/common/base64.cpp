// SPDX-License-Identifier: Apache-2.0
#include "base64.hpp"

#include <cerrno>

namespace dyad {
namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
int value_of(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}
}  // namespace

std::string base64_encode(std::string_view in) {
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 3 <= in.size(); i += 3) {
        uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
        out += kAlphabet[v >> 18];
        out += kAlphabet[(v >> 12) & 63];
        out += kAlphabet[(v >> 6) & 63];
        out += kAlphabet[v & 63];
    }
    size_t rest = in.size() - i;
    if (rest) {
        uint32_t v = uint8_t(in[i]) << 16;
        if (rest == 2) v |= uint8_t(in[i + 1]) << 8;
        out += kAlphabet[v >> 18];
        out += kAlphabet[(v >> 12) & 63];
        out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

Result<std::string> base64_decode(std::string_view in) {
    if (in.size() % 4 != 0)
        return Status(DYAD_RC_BAD_B64DECODE, "base64 length is not a multiple of 4", EINVAL);
    std::string out;
    out.reserve(in.size() / 4 * 3);
    for (size_t i = 0; i < in.size(); i += 4) {
        int a = value_of(in[i]), b = value_of(in[i + 1]);
        bool pad2 = in[i + 2] == '=', pad3 = in[i + 3] == '=';
        int c = pad2 ? 0 : value_of(in[i + 2]), d = pad3 ? 0 : value_of(in[i + 3]);
        if (a < 0 || b < 0 || c < 0 || d < 0 || (pad2 && !pad3) ||
            ((pad2 || pad3) && i + 4 != in.size()))
            return Status(DYAD_RC_BAD_B64DECODE, "invalid base64", EINVAL);
        uint32_t v = (uint32_t(a) << 18) | (uint32_t(b) << 12) | (uint32_t(c) << 6) | uint32_t(d);
        out += char(v >> 16);
        if (!pad2) out += char((v >> 8) & 0xff);
        if (!pad3) out += char(v & 0xff);
    }
    return out;
}

}  // namespace dyad
