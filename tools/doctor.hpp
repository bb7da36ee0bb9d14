// SPDX-License-Identifier: Apache-2.0
// `dyad doctor`: what a new user gets wrong, checked in one go.
#pragma once

namespace dyad::tools {

// Prints one line per check (ok, note, warn, FAIL) with what to fix, or one
// JSON object with --json. Returns 0 when nothing failed, else 1.
int doctor(bool json);

}  // namespace dyad::tools
