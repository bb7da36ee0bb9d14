#include <strings.h>

#include "dtl.hpp"

namespace dyad::dtl {

Result<const Backend*> find_backend(const std::string& name) {
    std::string built;
    for (const auto& b : backends()) {
        if (strcasecmp(b.name.c_str(), name.c_str()) == 0) return &b;
        for (const auto& a : b.aliases)
            if (strcasecmp(a.c_str(), name.c_str()) == 0) return &b;
        if (!built.empty()) built += ", ";
        built += b.name;
    }
    return Status(DYAD_RC_BADDTLMODE,
                  "transport '" + name + "' is not available in this build (available: " + built +
                      "); set DYAD_DTL_MODE to one of those",
                  ENOTSUP);
}

}  // namespace dyad::dtl
