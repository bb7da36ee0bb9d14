// SPDX-License-Identifier: Apache-2.0
// The epoch of an embedded metadata store: a number kept in a file of the
// hosting dyadd's state directory and incremented at every start, so the
// generations of one run (epoch in the high 32 bits) never repeat those of
// an earlier run (docs/design.md, "Generations across restarts").
#pragma once

#include <cstdint>
#include <string>

#include "common/status.hpp"

namespace dyad::kvs {

// The name of the epoch file inside the state directory.
constexpr const char* kEpochFile = "store-epoch";

// Creates `state_dir` if needed, reads `<state_dir>/store-epoch` (absent:
// this is the first run, epoch 0), writes back the next number durably
// (fsync) under an exclusive lock and returns the epoch of this run.
Result<uint32_t> next_epoch(const std::string& state_dir);

}  // namespace dyad::kvs
