// SPDX-License-Identifier: Apache-2.0
// How dyadd pulls a replica: as a consumer of the file's owner, through the
// client's fetch path (client/consume.cpp: staging, XXH3 against the
// owner's END, the generation stamp, rename). Linked into dyadd alone: the
// service layer does not depend on the client.
#pragma once

#include "replicas.hpp"

namespace dyad::service {

// transfer_timeout: seconds without progress before a pull fails.
PullFn make_replica_puller(double transfer_timeout);

}  // namespace dyad::service
