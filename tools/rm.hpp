// SPDX-License-Identifier: Apache-2.0
// `dyad rm FILE...`: unpublish files this node produced.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "client/client.hpp"

namespace dyad::tools {

// Reports a failed file (its message, its JSON line) and returns its exit code.
using Report = std::function<int(const Status&, const std::string&)>;

// One line per file ("unpublished F", or a JSON line with --json); returns
// 0, or the exit code of the last file that failed.
int unpublish_files(client::Client& c, const std::vector<std::string>& files, bool json,
                    const Report& report);

}  // namespace dyad::tools
