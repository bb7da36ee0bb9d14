// SPDX-License-Identifier: Apache-2.0
// The namespace's records as a whole: Client::list, page by page (dyad ls,
// dyad sync), one page fetched ahead while the caller reads the last; and
// Client::unpublish (dyad rm), which takes one of this node's out.
#include <future>

#include "client.hpp"
#include "common/log.hpp"
#include "proto/publish.hpp"

namespace dyad::client {
namespace {
constexpr double kListTimeout = 30.0;     // one page
constexpr double kControlTimeout = 30.0;  // dyad.unpublish
constexpr const char* kSub = "client";
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

Status Client::unpublish(const std::string& path) {
    if (prod_.empty())
        return Status(
            DYAD_RC_BADMANAGEDPATH,
            "cannot unpublish '" + path + "': no producer directory (set DYAD_PATH_PRODUCER)",
            EINVAL);
    auto up = producer_upath(path);
    if (!up)
        return Status(DYAD_RC_UNTRACKED,
                      "'" + path + "' is not inside the producer directory " + prod_.path() +
                          " (DYAD_PATH_PRODUCER): only files under it are unpublished",
                      EINVAL);
    auto svc = service();
    if (!svc) return svc.status();
    proto::UnpublishRequest req;
    req.upath = up.value();
    req.ns = ns(svc.value());
    req.key_depth = cfg_.key_depth;
    req.key_bins = cfg_.key_bins;
    bool connect_failed = false;
    auto v = pool_->call(cfg_.service_uri, "dyad.unpublish", req.build(),
                         Deadline::after(kControlTimeout), 0, false, &connect_failed);
    if (!v && connect_failed)
        return Status(DYAD_RC_CONNFAIL,
                      "cannot unpublish '" + path + "': " + v.status().to_string(),
                      v.status().err());
    if (!v) {
        Status e = v.status();
        return Status(e.rc(), "cannot unpublish '" + path + "': " + e.message(), e.err());
    }
    DYAD_DEBUG(kSub, "unpublished %s", up->c_str());
    return Status::ok();
}

}  // namespace dyad::client
