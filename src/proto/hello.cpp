// SPDX-License-Identifier: Apache-2.0
#include "proto/hello.hpp"

#include "common/config.hpp"
#include "proto/fields.hpp"

namespace dyad::proto {

Result<Hello> Hello::parse(const nlohmann::json& j) {
    auto id = Identity::parse(j);
    if (!id) return Status(id.status()).wrap("the service's hello");
    Hello h{std::move(id.value())};
    if (h.service.ns.empty()) h.service.ns = kDefaultNamespace;
    if (h.service.kvs.empty()) h.service.kvs = kStoreHere;
    return h;
}

nlohmann::json DirHolder::build() const {
    return {{"service_id", service_id}, {"pid", pid}};
}

Result<DirHolder> DirHolder::parse(const nlohmann::json& j) {
    Fields f(j, "the lock file's holder");
    DirHolder h;
    h.service_id = f.str("service_id");
    h.pid = f.i64("pid");
    return finish(f, std::move(h));
}

}  // namespace dyad::proto
