// SPDX-License-Identifier: Apache-2.0
// The metadata record of a produced file: a wire shape (the value of a
// metadata entry), defined in proto/record.hpp; named here too for the
// store's users.
#pragma once

#include "proto/record.hpp"

namespace dyad::kvs {
using proto::Record;
namespace detail = proto::record_detail;
}  // namespace dyad::kvs
