// SPDX-License-Identifier: Apache-2.0
// JSON text that never throws. nlohmann's dump() throws (type_error 316) on
// a string that is not UTF-8, and a file name or a configured directory may
// be any bytes: in dyadd or in a user's process (the C API, the wrapper)
// that would be std::terminate. Every dump of DYAD's passes kBadUtf8Replaced,
// which writes U+FFFD in place of each bad byte. Paths a client sends are
// checked before (normalize_upath refuses one that is not UTF-8, saying so),
// so a replacement never renames a file on the wire.
#pragma once

#include <nlohmann/json.hpp>

namespace dyad {

inline constexpr auto kBadUtf8Replaced = nlohmann::json::error_handler_t::replace;

}  // namespace dyad
