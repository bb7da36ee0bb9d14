// SPDX-License-Identifier: Apache-2.0
// Path rules: managed-directory matching on canonical paths, validation of
// paths relative to a managed directory, traversal-safe opening beneath a
// directory, and small file helpers.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "fd.hpp"
#include "status.hpp"

namespace dyad {

// Absolute, with "." / ".." / "//" removed lexically, symlinks not followed.
std::string lexical_absolute(std::string_view path);

// realpath() of the longest existing prefix, the rest appended lexically.
std::string canonical_path(std::string_view path);

// DYAD's own directory inside a managed directory (the consumer's locks).
inline constexpr const char* kReservedDir = ".dyad";

// Whether s is well-formed UTF-8 (no overlong forms, surrogates, or code
// points past U+10FFFF).
bool valid_utf8(std::string_view s);

// Checks a path relative to a managed directory and returns its normal form
// ("a//./b" -> "a/b", "sub/../f" -> "f"). Refuses empty, not UTF-8 (EILSEQ),
// absolute, NUL, a ".." that leaves the directory, and paths under
// kReservedDir.
Result<std::string> normalize_upath(std::string_view upath);

// A managed directory: remembers its given and canonical forms.
class ManagedDir {
  public:
    ManagedDir() = default;
    explicit ManagedDir(std::string_view dir);
    bool empty() const { return given_.empty(); }
    const std::string& path() const { return canonical_; }
    const std::string& given() const { return given_; }
    // The path relative to this directory, if `path` lies strictly inside it.
    // With relative_mode, a path not starting with '/' is taken verbatim.
    std::optional<std::string> relative(std::string_view path, bool relative_mode) const;
    // Absolute target of a relative path inside this directory.
    std::string join(std::string_view upath) const { return canonical_ + "/" + std::string(upath); }

  private:
    std::string given_;
    std::string lexical_;
    std::string canonical_;
};

// Opens `upath` beneath the directory `dirfd`: symlinks may be followed only
// while they stay inside it (openat2 RESOLVE_BENEATH). Escapes give EXDEV.
Result<UniqueFd> open_beneath(int dirfd, const std::string& upath, int flags, mode_t mode = 0);

// mkdir -p; mode applies to the directories it creates.
Status mkdir_p(const std::string& dir, mode_t mode = 0775);

}  // namespace dyad
