// SPDX-License-Identifier: Apache-2.0
// The deadlines of the service's own calls, in one table (seconds). Every
// wait has one (docs/design.md); the ones that must fit inside another are
// said so here, where both are seen. The client's control requests (hello,
// publish, lookup, status) take kControl.
#pragma once

namespace dyad::timeouts {

// A client's control request to its node's service: connect, publish,
// unpublish, status.
inline constexpr double kControl = 30.0;
// A call of the service to its metadata store (a publish's put, a fetch's
// check, a replica's entry, the registry's pages): within kControl, so that
// a store that stops answering meanwhile is what the client's error names,
// not the client's own deadline.
inline constexpr double kStoreCall = 25.0;
// A lookup, put or page the service's store topics serve (kvs.*) for a client.
inline constexpr double kServeCall = 30.0;
// A kvs.get wait answers TIMEOUT after this long; the client asks again
// until its own deadline (it slices its waits at kControl).
inline constexpr double kWaitAnswer = 30.0;
// The service's registration at start-up and after a store lost it, and a
// file published again then.
inline constexpr double kRegister = 30.0;
// The look at the registry for a live dyadd of the same id at start-up.
inline constexpr double kRegistryLook = 10.0;
// Registering again after a store lost the service (short: the store's
// rejoin tries again until it succeeds).
inline constexpr double kRegisterAgain = 10.0;
// How long a registered service with our id has to answer before its
// registration is taken as stale (it crashed).
inline constexpr double kHolderProbe = 3.0;
// Replicas: asking a holder to take a file (plus the file's size at the
// slowest pull a deadline allows for), and to drop one.
inline constexpr double kAskReplica = 60.0;
inline constexpr double kDropReplica = 10.0;

}  // namespace dyad::timeouts
