// SPDX-License-Identifier: Apache-2.0
// The publish ledger's durable copy in SQLite (Debian's libsqlite3-dev):
// one table in <state dir>/published.sqlite, one row per file a service
// published, keyed by (service id, producer directory, path). Linked into
// dyadd alone (libdyad.so, loaded into arbitrary programs, stays free of
// it). docs/design.md, "The embedded store across restarts", says why and
// what it costs per publish.
#pragma once

#include <memory>
#include <string>

#include "common/status.hpp"
#include "publish_ledger.hpp"

namespace dyad::service {

// The file's name inside the state directory.
constexpr const char* kLedgerFile = "published.sqlite";

// Opens (creating it and `state_dir` if needed) the journal of service `id`
// serving `producer_dir`. Errors name the file and what to do.
Result<std::unique_ptr<LedgerJournal>> open_sqlite_journal(const std::string& state_dir,
                                                           const std::string& id,
                                                           const std::string& producer_dir);

}  // namespace dyad::service
