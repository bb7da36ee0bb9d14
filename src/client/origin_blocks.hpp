// SPDX-License-Identifier: Apache-2.0
// Byte ranges of origin files kept per block on the node (DYAD_PATH_ORIGIN;
// docs/user-guide.md, "Byte ranges of origin files"): a range read of a
// path only in the origin reads the blocks it covers from the origin once
// and keeps them under the consumer directory's `.dyad/origin-blocks/`, so
// that a later range read of the same blocks does not touch the origin.
//
// Per origin file two files, named by a hash of its path:
//  - `H.data`: the blocks held, each at its offset (a sparse file);
//  - `H.held`, the sidecar: a header (magic, block size, the origin file's
//    identity: size, mtime, ctime, inode; and its path) then one XXH3-64
//    per 4 KiB chunk (0: not held). Blocks are read from the origin and
//    kept whole; a range reads and checks the chunks it covers. A chunk is
//    used only while the origin file is the one the header names and its
//    bytes hash to its entry (torn by a crash, or written over: its block
//    is read from the origin again).
// Processes of one node share them: flock on the sidecar, shared to read
// the held blocks, exclusive to add blocks or start over (the origin file
// changed: everything held of it goes). Truncated only under the exclusive
// lock.
//
// A process keeps the two files of the last kKeptOpen origin files it read
// open, the data file mapped: a range of held blocks is then a shared lock,
// the header and the entries read, and its chunks hashed and copied out of
// the mapping (its length checked against the file's first, under the
// lock). Files found removed are closed (opened again at the next range). The blocks a range
// reads from the origin are mapped in at once (MADV_POPULATE_READ): a
// pread of held blocks costs a kernel copy that in the measurements took
// as long as everything else of a range, and a mapping's first touch a
// page fault per 16 pages.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/status.hpp"
#include "origin.hpp"
#include "record.hpp"

namespace dyad::client {

// The bytes of one block (the last block of a file is shorter).
inline constexpr uint64_t kOriginBlock = 1 << 20;

class OriginBlocks {
  public:
    static constexpr size_t kKeptOpen = 64;
    // `cons_dir`: the consumer directory ("" : none, nothing kept).
    explicit OriginBlocks(std::string cons_dir) : dir_(std::move(cons_dir)) {}
    ~OriginBlocks();
    // The bytes [offset, offset + length) of the origin file `rec` (a
    // record of origin.stat) into `dst`: from the blocks held, the others
    // read from `origin` (and kept). `from_origin`: how many blocks were
    // read from the origin. ESTALE: the origin file is no longer `rec`.
    // Where blocks cannot be kept (no consumer directory, a path too long,
    // the directory not writable), the range is read from the origin
    // directly, as without blocks.
    Status read(const Origin& origin, const std::string& upath, const Record& rec, uint64_t offset,
                uint64_t length, char* dst, uint64_t* from_origin) const;

    // The same if every chunk of the range is held, and nothing of the
    // origin touched; false (dst undefined) if not.
    bool held(const std::string& upath, const Record& rec, uint64_t offset, uint64_t length,
              char* dst) const;
    // The files of origin files kept open (after a fork: the child's own).
    struct Open;

  private:
    std::shared_ptr<Open> opened(const std::string& upath) const;
    // The mapping's pages of the blocks of the range filled in.
    void prefault(const std::string& upath, const Record& rec, uint64_t offset,
                  uint64_t length) const;
    void close(const std::string& upath) const;
    std::string dir_;
    mutable std::mutex mu_;
    mutable std::unordered_map<std::string, std::shared_ptr<Open>> open_;
};

}  // namespace dyad::client
