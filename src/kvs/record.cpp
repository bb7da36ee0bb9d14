// SPDX-License-Identifier: Apache-2.0
#include "record.hpp"

#include <cstdlib>

#include "common/keygen.hpp"

namespace dyad::kvs {

nlohmann::json Record::to_json() const {
    nlohmann::json j = {{"path", upath},
                        {"owner", owner},
                        {"node", node},
                        {"producer_dir", producer_dir},
                        {"endpoints", endpoints},
                        {"size", size},
                        {"mtime_ns", mtime_ns},
                        {"mode", mode},
                        {"ino", ino}};
    if (rank) j["rank"] = *rank;
    return j;
}

Result<Record> Record::from_json(const std::string& text, uint64_t generation) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        return Status(DYAD_RC_BADMETADATA,
                      "metadata record is not JSON: was it written by this DYAD version?", EPROTO);
    // Numbers must be integers: a float (1e300) would be converted out of
    // range, which is undefined behaviour, not an exception.
    for (const char* k : {"size", "mtime_ns", "mode", "ino"}) {
        auto it = j.find(k);
        if (it != j.end() && it->is_number() && !it->is_number_integer())
            return Status(DYAD_RC_BADMETADATA,
                          std::string("malformed metadata record: '") + k + "' is not an integer",
                          EPROTO);
    }
    Record r;
    try {
        r.upath = j.at("path").get<std::string>();
        r.owner = j.at("owner").get<std::string>();
        r.node = j.value("node", r.owner);
        r.producer_dir = j.value("producer_dir", "");
        r.endpoints = j.at("endpoints").get<std::vector<std::string>>();
        r.size = j.at("size").get<uint64_t>();
        r.mtime_ns = j.value("mtime_ns", static_cast<int64_t>(0));
        r.mode = j.value("mode", 0644u);
        r.ino = j.value("ino", static_cast<uint64_t>(0));
        auto rk = j.find("rank");
        if (rk != j.end() && rk->is_number_unsigned() && rk->get<uint64_t>() < UINT32_MAX)
            r.rank = rk->get<uint32_t>();
    } catch (const std::exception& e) {
        return Status(DYAD_RC_BADMETADATA, std::string("malformed metadata record: ") + e.what(),
                      EPROTO);
    }
    r.generation = generation;
    return r;
}

uint32_t Record::owner_rank() const {
    if (rank) return *rank;
    // Records of services that did not say their rank (none of this release).
    char* end = nullptr;
    unsigned long v = std::strtoul(node.c_str(), &end, 10);
    if (!node.empty() && *end == '\0') return static_cast<uint32_t>(v);
    // Non-numeric node names: a stable 31-bit number.
    uint64_t h[2];
    murmur3_x64_128(node.data(), node.size(), 104723u, h);
    return static_cast<uint32_t>(h[0] & 0x7fffffff);
}

}  // namespace dyad::kvs
