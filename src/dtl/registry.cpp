#include <strings.h>

#include "dtl.hpp"

namespace dyad::dtl {

Backend stream_backend();
#ifdef DYAD_ENABLE_UCX
Backend ucx_backend();
#endif
#ifdef DYAD_ENABLE_OFI
Backend ofi_backend();
#endif

// Every transport of this build, in one explicit list.
const std::vector<Backend>& backends() {
    static const std::vector<Backend> table = {
        stream_backend(),
#ifdef DYAD_ENABLE_UCX
        ucx_backend(),
#endif
#ifdef DYAD_ENABLE_OFI
        ofi_backend(),
#endif
    };
    return table;
}

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
