// SPDX-License-Identifier: Apache-2.0
// The UCX transport's shared pieces and its row of the table of backends.
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "common/config.hpp"
#include "ucx.hpp"

namespace dyad::dtl {
namespace ucx {

Attributes ucx_attributes() {
    Attributes a;
    a.name = "UCX";
    a.latency_us = 160;
    a.bandwidth_gbps = 1.0;
    a.rma_native = false;  // this backend moves bytes by tagged messages
    a.max_message = kUcxChunk;
    unsigned maj = 0, min = 0, rel = 0;
    ucp_get_version(&maj, &min, &rel);
    const char* tls = std::getenv("UCX_TLS");  // UCX's own variable
    a.info = "UCX " + std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel) +
             ", UCX_TLS=" + (tls ? tls : "all");
    return a;
}

std::string process_identity() {
    std::string start = "0";
    std::ifstream f("/proc/self/stat");
    std::string line;
    if (std::getline(f, line)) {
        size_t rp = line.rfind(')');
        if (rp != std::string::npos) {
            std::string rest = line.substr(rp + 2);
            size_t field = 3, pos = 0;  // rest starts at field 3 (state)
            while (field < 22 && pos != std::string::npos) {
                pos = rest.find(' ', pos);
                if (pos != std::string::npos) ++pos;
                ++field;
            }
            if (pos != std::string::npos) start = rest.substr(pos, rest.find(' ', pos) - pos);
        }
    }
    return hostname() + "/" + std::to_string(::getpid()) + "/" + start;
}

}  // namespace ucx

Backend ucx_backend() {
    return {"UCX", {}, ucx::ucx_attributes, ucx::make_receiver, ucx::make_sender, ucx::warmup};
}

}  // namespace dyad::dtl
