// SPDX-License-Identifier: Apache-2.0
// RFC 4648 base64 (standard alphabet, padded), for binary blobs such as UCX
// worker addresses carried in JSON.
#pragma once

#include <string>
#include <string_view>

#include "status.hpp"

namespace dyad {
std::string base64_encode(std::string_view bytes);
Result<std::string> base64_decode(std::string_view text);
}  // namespace dyad
