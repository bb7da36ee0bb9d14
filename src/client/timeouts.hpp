// SPDX-License-Identifier: Apache-2.0
// The client's timeouts, in one table (seconds). Waits for a produce have
// their own deadline (DYAD_WAIT_TIMEOUT) and transfers theirs
// (DYAD_TRANSFER_TIMEOUT): these are the limits of the control messages.
#pragma once

namespace dyad::client::timeouts {

// Connecting to a service, one store operation, dyad.status, dyad.publish
// and dyad.unpublish, opening a fetch.
inline constexpr double kControl = 30.0;
// One page of a listing (kvs.list), the replicas of a file.
inline constexpr double kList = 30.0;
// One batch of lookups (kvs.get_many).
inline constexpr double kLookupMany = 30.0;
// One kvs.changes of a follow (dyad sync --follow).
inline constexpr double kChanges = 30.0;
// The first connect to an owner while a replica could serve the file
// instead: a cut-off owner does not refuse, its connect would wait kControl.
inline constexpr double kQuickConnect = 2.0;

}  // namespace dyad::client::timeouts
