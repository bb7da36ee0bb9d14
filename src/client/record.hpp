// SPDX-License-Identifier: Apache-2.0
// The metadata record lives with the store (kvs/record.hpp); the client
// layer knows it by its old name.
#pragma once

#include "kvs/record.hpp"

namespace dyad::client {
using kvs::Record;
}  // namespace dyad::client
