// SPDX-License-Identifier: Apache-2.0
// `dyad rm FILE...`: unpublish files this node produced (the files stay).
#include "rm.hpp"

#include <cstdio>
#include <iostream>

#include "common/json_text.hpp"

namespace dyad::tools {

namespace {
// `dyad ls` prints names relative to the managed directory: a relative name
// that is not under the producer directory when taken from the current
// directory is taken from the producer directory.
std::string producer_path(client::Client& c, const std::string& f) {
    if (f.empty() || f[0] == '/' || c.producer_dir().empty() || c.producer_upath(f)) return f;
    return c.producer_dir().join(f);
}
}  // namespace

int unpublish_files(client::Client& c, const std::vector<std::string>& files, bool json,
                    const Report& report) {
    int rc = 0;
    for (const auto& given : files) {
        const std::string f = producer_path(c, given);
        Status s = c.unpublish(f);
        if (!s) {
            rc = report(s, f);
            continue;
        }
        if (json)
            std::cout << nlohmann::json{{"file", f}, {"action", "unpublished"}, {"ok", true}}.dump(
                             -1, ' ', false, kBadUtf8Replaced)
                      << "\n";
        else
            std::cout << "unpublished " << f << " (the file stays on disk)\n";
    }
    std::cout.flush();
    return rc;
}

}  // namespace dyad::tools
