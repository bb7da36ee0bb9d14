// SPDX-License-Identifier: Apache-2.0
#include "core.hpp"

#include "common/paths.hpp"
#include "common/timeouts.hpp"

namespace dyad::service {
Result<uint64_t> StoreCalls::put(const std::string& ns, const std::string& key,
                                 const std::string& value, uint64_t replaces) {
    ScopedTimer timed(calls_[0]);
    return store_->put(ns, key, value, id_, replaces, Deadline::after(timeouts::kStoreCall));
}

Result<kvs::Entry> StoreCalls::get(const std::string& ns, const std::string& key) {
    ScopedTimer timed(calls_[1]);
    return store_->get(ns, key, Deadline::after(timeouts::kStoreCall));
}

std::string Core::state_dir() const {
    return opts.state_dir.empty() ? prod_dir + "/" + kReservedDir : opts.state_dir;
}

}  // namespace dyad::service
