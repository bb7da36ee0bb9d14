// SPDX-License-Identifier: Apache-2.0
// The bounded node-local cache of consumer copies (DYAD_CACHE_*): which
// copies a consumer directory holds, when each was installed and last
// consumed, and the removal of the least recently consumed (LRU) or oldest
// (FIFO) ones once their bytes pass the capacity, down to the low watermark.
//
// Every process consuming into one directory shares one record of it under
// `.dyad/cache/` (docs/user-guide.md, "Cache and origin"):
//   lock     flock()ed by whoever reads or changes the others: one at a time,
//            so one evictor at a time and consumers that agree;
//   state    one line: the bytes held (an upper bound between two folds)
//            and the counters (hits, misses, evictions, evicted bytes);
//   journal  one line appended per install ("I") or consume of a present
//            copy ("A"): cheap per consume, whatever the number of files;
//   index    the journal folded: one line per copy (size, installed,
//            consumed, path), rewritten whole (temporary file + rename).
// Access times are DYAD's own (wall-clock ns at each consume), not the file
// system's atime, which relatime leaves stale.
//
// A copy is removed only if all of these hold (else it is kept, and the
// cache may stay over its capacity: a warning once per process says so):
//  - it was consumed longer ago than the grace period;
//  - its per-file lock is free (no consume of it is moving it: the lock is
//    tried, never waited for);
//  - no process has it open (a write lease can be taken: the wrapper's and
//    any reader's descriptors keep it), where the file system has leases;
//  - it is still the copy DYAD installed (its install stamp names its size
//    and mtime): a file rewritten since is the user's;
//  - it has not been produced since by this node (Client::produce forgets
//    it), and is not inside DYAD_PATH_PRODUCER when that is another
//    directory: a producer's own published files are never evicted.
// Eviction never fails a consume: its errors are logged and the copy kept.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/config.hpp"
#include "common/fd.hpp"
#include "common/status.hpp"

namespace dyad::client {

struct CacheFold;

struct CacheStats {
    uint64_t bytes = 0;  // held by the copies the cache knows of
    uint64_t files = 0;
    uint64_t hits = 0;    // consumes that found their copy present
    uint64_t misses = 0;  // consumes that installed a copy (fetched or read through)
    uint64_t evictions = 0;
    uint64_t evicted_bytes = 0;
    nlohmann::json to_json() const;
};

class Cache {
  public:
    // The per-file lock of a relative path if it is free now (nullopt if
    // another consume holds it): ConsumerStore::try_lock.
    using TryLock = std::function<std::optional<UniqueFd>(const std::string& upath)>;
    // `consumer_dir`, `producer_dir`: canonical ("" if unset).
    Cache(const Config& cfg, std::string consumer_dir, std::string producer_dir, TryLock try_lock);
    Cache(const Cache&) = delete;
    Cache& operator=(const Cache&) = delete;

    // DYAD_CACHE_CAPACITY > 0 and a consumer directory: nothing is recorded
    // otherwise.
    bool enabled() const { return capacity_ > 0 && !dir_.empty(); }
    // A consume found the copy of `upath` present (a hit): its access time.
    void hit(const std::string& upath);
    // A consume installed a copy of `upath` of `size` bytes (a miss), then
    // evicts if the cache is over its capacity.
    void installed(const std::string& upath, uint64_t size);
    // `upath` was produced by this node: never evicted from now on.
    void forget(const std::string& upath);
    // The record folded and checked against the directory (sizes as they
    // are, files gone dropped); nothing removed.
    Result<CacheStats> stats();

  private:
    enum class Note { hit, installed, forget };
    void note(Note what, const std::string& upath, uint64_t size);
    Status note_locked(Note what, const std::string& upath, uint64_t size);
    Status note_in(CacheFold& f, Note what, const std::string& upath, uint64_t size);
    // Opens the record (.dyad/cache), takes its lock and reads its state,
    // then runs `work` on it under the lock.
    Status with_record(const std::function<Status(CacheFold&)>& work);
    // .dyad/cache (made if missing; a real directory of this euid, 0700).
    Result<UniqueFd> cache_dir();

    uint64_t capacity_;
    enum class Policy { lru, fifo, none } policy_;
    double low_;
    double grace_s_;
    std::string dir_;
    std::string producer_dir_;
    TryLock try_lock_;

    friend struct CacheFold;
};

}  // namespace dyad::client
