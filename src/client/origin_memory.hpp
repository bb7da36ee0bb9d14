// SPDX-License-Identifier: Apache-2.0
// What a range read learned of a path only in the origin, kept for a while
// (DYAD_ORIGIN_RECHECK; docs/user-guide.md, "Byte ranges of origin files"):
// "`upath` has no record; the origin's file is `rec`". Within that time a
// range read of the path uses `rec` without asking the store or the origin
// again, so a range of blocks the node holds touches neither; after it the
// next range asks again, and sees a record published meanwhile or the
// origin file changed (its blocks then start over: origin_blocks.hpp).
// A remembered answer that fails (blocks to read from an origin file that
// changed: ESTALE; a range past its end) is forgotten and asked again at
// once.
//
// Per process (one Client): its threads share it. At most kMaxPaths paths;
// beyond, the expired ones go, then any.
#pragma once

#include <chrono>
#include <cstddef>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "record.hpp"

namespace dyad::client {

class OriginMemory {
  public:
    using Clock = std::chrono::steady_clock;
    static constexpr size_t kMaxPaths = 4096;

    // `recheck_s`: how long an answer is used (0: never kept).
    explicit OriginMemory(double recheck_s);
    bool enabled() const { return recheck_.count() > 0; }
    // The origin record of `upath` learned less than the recheck time ago.
    std::optional<Record> recall(const std::string& upath) const;
    // `rec` (an origin record) as the answer for `upath` looked up at `asked`.
    void remember(const std::string& upath, const Record& rec, Clock::time_point asked);
    void forget(const std::string& upath);

  private:
    struct Entry {
        Record rec;
        Clock::time_point until;
    };
    Clock::duration recheck_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, Entry> seen_;
};

}  // namespace dyad::client
