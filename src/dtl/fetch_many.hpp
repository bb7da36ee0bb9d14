// SPDX-License-Identifier: Apache-2.0
// dyad.fetch_many's request, as the service reads it before anything else
// (src/service/fetch_many.cpp; fuzzed by fuzz/fuzz_request.cpp): "files", an
// array of 1 to kFetchManyFiles entries, each an object with a "upath" (and
// the generation, ns and key a single fetch carries). A malformed request is
// refused whole; a malformed entry is that file's error.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/paths.hpp"
#include "common/status.hpp"
#include "dtl/channel.hpp"
#include "dtl/dtl.hpp"

namespace dyad::dtl {

struct FetchManyEntry {
    std::string upath;    // normalized; empty with an error
    nlohmann::json args;  // the entry (generation, ns, key)
    Status error;         // set: this file is answered with it
};

inline Result<std::vector<FetchManyEntry>> parse_fetch_many(const nlohmann::json& a) {
    auto fs = a.is_object() ? a.find("files") : a.end();
    if (!a.is_object() || fs == a.end() || !fs->is_array() || fs->empty() ||
        fs->size() > kFetchManyFiles)
        return Status(DYAD_RC_BADUNPACK,
                      "fetch_many request without 'files' (1 to " +
                          std::to_string(kFetchManyFiles) + " of them)",
                      EINVAL);
    std::vector<FetchManyEntry> out(fs->size());
    for (size_t i = 0; i < fs->size(); ++i) {
        const auto& f = (*fs)[i];
        auto raw = f.is_object() ? meta_str(f, "upath") : std::nullopt;
        if (!raw) {
            out[i].error = Status(DYAD_RC_BADUNPACK, "fetch_many entry without 'upath'", EINVAL);
            continue;
        }
        auto up = normalize_upath(*raw);
        if (!up) {
            out[i].error = up.status();
            continue;
        }
        out[i].upath = std::move(up.value());
        out[i].args = f;
    }
    return out;
}

}  // namespace dyad::dtl
