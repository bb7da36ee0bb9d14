// SPDX-License-Identifier: Apache-2.0
// Interception policy for the LD_PRELOAD wrapper: decides, without
// allocating, whether an open/close concerns a managed directory, and maps
// DYAD failures to errno. The wrapper itself only resolves symbols and calls
// this.
#pragma once

#include <cstddef>
#include <string>

#include "client/client.hpp"

namespace dyad::capi {

// Access intent of an open, from oflag & O_ACCMODE (never from the mode).
struct OpenIntent {
    bool read = false;
    bool write = false;
};
OpenIntent intent_of_oflag(int oflag);
// fopen/freopen mode strings: "r", "rb", "r+", "w", "a+", "wx", "re", ...
OpenIntent intent_of_fmode(const char* mode);
// The oflag equivalent of an fopen mode (for the consume decision).
int oflag_of_fmode(const char* mode);

class InterceptPolicy {
  public:
    explicit InterceptPolicy(const client::Client& c);
    bool inert() const { return prod_.empty() && cons_.empty(); }
    // Makes `path` (relative to the cwd, or to directory fd `dirfd` when not
    // AT_FDCWD) absolute and lexically normal into out[cap]. No allocation;
    // false if it does not fit or the dirfd cannot be resolved.
    static bool absolute(int dirfd, const char* path, char* out, size_t cap);
    // Lexical prefix tests against the managed directories (given and
    // canonical forms); `abs` must come from absolute().
    bool under_producer(const char* abs) const;
    bool under_consumer(const char* abs) const;
    // Whether an open with this oflag of a consumer path must consume first.
    static bool should_consume(int oflag);

  private:
    static bool under(const std::string& dir, const char* abs);
    std::string prod_, prod_canon_, cons_, cons_canon_;
};

// Whether the file name `base` (no directory) is a tool's temporary that is
// renamed into place once written: rsync's ".NAME.XXXXXX" and sed -i's
// "sedXXXXXX" (X: a letter or digit). The wrapper does not publish those at
// close (the rename publishes the real name) and never waits for them. Other
// temporaries (mkstemp's, tempfile's) exist when a tool opens them again,
// and a present file is never waited for (consume_mode): their names need
// no rule (docs/user-guide.md, "The wrapper and everyday tools").
bool is_tool_temporary(const char* base);

// What the wrapper knows of an open of a consumer path when it decides.
struct OpenFacts {
    int oflag = 0;
    bool via_dirfd = false;      // openat relative to a directory descriptor (not AT_FDCWD)
    bool exists = false;         // the path exists now
    bool is_dir = false;         // ... and is a directory
    bool temporary = false;      // is_tool_temporary(its name)
    bool being_written = false;  // exists, and another process has it open for writing
};
// What an open of a consumer path does first:
//   none  nothing (opens that write new contents, directories, probes,
//         temporaries);
//   look  looks the file up once without waiting: produced, it is consumed
//         (fetched, or used in place); not produced, the open goes on as it
//         would without DYAD (ENOENT for an absent file);
//   wait  waits for its produce (DYAD_WAIT_TIMEOUT), then consumes it.
// Only a read-only open of an absent path by name (open, fopen, openat from
// the current directory), or of a present file another process is still
// writing, waits.
enum class ConsumeMode { none, look, wait };
ConsumeMode consume_mode(const OpenFacts& f);

// errno for a failed consume: ETIMEDOUT, ENOENT, ECONNREFUSED, EIO, ...
int errno_for(const Status& s);

}  // namespace dyad::capi
