// SPDX-License-Identifier: Apache-2.0
// Client::list: the records of the namespace, page by page (dyad ls, dyad
// sync), one page fetched ahead while the caller reads the last.
#include <future>

#include "client.hpp"

namespace dyad::client {
namespace {
constexpr double kListTimeout = 30.0;  // one page
}  // namespace

Status Client::list(const std::string& prefix, const std::function<bool(const Record&)>& each) {
    auto svc = service();
    if (!svc) return svc.status();
    auto st = store();
    if (!st) return st.status();
    // Keys are the relative path behind DYAD_KEY_DEPTH hashed levels: only
    // without them can the store itself select by the path's prefix.
    const std::string key_prefix = cfg_.key_depth == 0 ? prefix : std::string();
    const std::string space = ns(svc.value());
    kvs::Store* store = st.value();
    auto fetch = [store, &space, &key_prefix](const std::string& after) {
        return store->list_page(space, key_prefix, after, 0, Deadline::after(kListTimeout));
    };
    // One page ahead: the store makes the next page while this one is
    // read (two pages in memory at most).
    auto page = fetch("");
    for (;;) {
        if (!page) return store_failure(page.status(), svc.value());
        std::future<Result<kvs::Page>> next;
        if (page->more) next = std::async(std::launch::async, fetch, page->entries.back().first);
        for (auto& [k, e] : page->entries) {
            auto r = Record::from_json(e.value, e.version);
            if (!r || r->upath.compare(0, prefix.size(), prefix) != 0) continue;
            if (!each(r.value())) return Status::ok();  // (next ends with its future)
        }
        if (!next.valid()) return Status::ok();
        page = next.get();
    }
}

Result<std::vector<Record>> Client::list() {
    std::vector<Record> out;
    Status s = list("", [&out](const Record& r) {
        out.push_back(r);
        return true;
    });
    if (!s) return s;
    return out;
}

}  // namespace dyad::client
