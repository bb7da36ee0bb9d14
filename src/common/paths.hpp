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

// Which symbolic links a walk beneath a directory may follow.
enum class Links {
    beneath,  // those that stay inside the directory (RESOLVE_BENEATH)
    none,     // none, in any component (RESOLVE_NO_SYMLINKS): ELOOP
};

// Opens `upath` beneath the directory `dirfd` (openat2; on kernels without
// it, one component at a time with O_NOFOLLOW, refusing every symlink).
// Escapes give EXDEV; with Links::none a symlink anywhere gives ELOOP.
Result<UniqueFd> open_beneath(int dirfd, const std::string& upath, int flags, mode_t mode = 0,
                              Links links = Links::beneath);

// The directory `rel` beneath `dirfd`, following no symbolic link; with
// `create`, missing components are made (mkdirat, `mode`). A component that
// is a symlink: ELOOP, the message naming it; one that is not a directory:
// ENOTDIR. The fd is O_PATH unless `create` (then O_RDONLY: fchmod works).
Result<UniqueFd> dir_beneath(int dirfd, const std::string& rel, bool create, mode_t mode);

// The first leading part of `rel` beneath `dirfd` that is a symbolic link
// ("run1/x" of "run1/x/passwd"), or "" if there is none.
std::string first_symlink(int dirfd, const std::string& rel);

// A file opened beneath the managed directory `dir` (its fd `dirfd`), as
// open_beneath(Links::beneath), that is not inside its kReservedDir through
// a symlink (`m -> .dyad`, then `m/x`): EACCES.
Result<UniqueFd> open_beneath_unreserved(int dirfd, const std::string& dir,
                                         const std::string& upath, int flags);

// mkdir -p; mode applies to the directories it creates.
Status mkdir_p(const std::string& dir, mode_t mode = 0775);

// The directory and the last component of a relative path: "a/b/c" ->
// "a/b" and "c"; "c" -> "" and "c".
std::string dir_part(const std::string& upath);
std::string base_part(const std::string& upath);

}  // namespace dyad
