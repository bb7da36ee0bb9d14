// SPDX-License-Identifier: Apache-2.0
#include "paths.hpp"

#include <cstdio>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

namespace dyad {
namespace {

std::vector<std::string_view> split(std::string_view p) {
    std::vector<std::string_view> parts;
    size_t i = 0;
    while (i <= p.size()) {
        size_t j = p.find('/', i);
        if (j == std::string_view::npos) j = p.size();
        if (j > i) parts.push_back(p.substr(i, j - i));
        i = j + 1;
    }
    return parts;
}

std::string cwd() {
    char buf[PATH_MAX];
    if (!getcwd(buf, sizeof buf)) return "/";
    return buf;
}

}  // namespace

std::string lexical_absolute(std::string_view path) {
    std::string full =
        (!path.empty() && path[0] == '/') ? std::string(path) : cwd() + "/" + std::string(path);
    std::vector<std::string_view> out;
    for (auto part : split(full)) {
        if (part == ".") continue;
        if (part == "..") {
            if (!out.empty()) out.pop_back();
            continue;
        }
        out.push_back(part);
    }
    std::string r;
    for (auto part : out) {
        r += '/';
        r += part;
    }
    return r.empty() ? "/" : r;
}

std::string canonical_path(std::string_view path) {
    std::string abs = lexical_absolute(path);
    char buf[PATH_MAX];
    if (realpath(abs.c_str(), buf)) return buf;
    // Walk back to the longest existing prefix.
    std::string rest;
    std::string head = abs;
    while (head.size() > 1) {
        size_t slash = head.rfind('/');
        rest = head.substr(slash) + rest;
        head = slash == 0 ? "/" : head.substr(0, slash);
        if (realpath(head.c_str(), buf)) {
            std::string base = buf;
            if (base == "/") return rest;
            return base + rest;
        }
    }
    return abs;
}

namespace {

// Length of the UTF-8 sequence at s[i] (1 to 4), or 0 if it is not one:
// a stray continuation byte, a truncated sequence, an overlong form, a
// surrogate or a code point past U+10FFFF.
size_t utf8_at(std::string_view s, size_t i) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    if (c < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0) lo = 0xa0;  // overlong
        if (c == 0xed) hi = 0x9f;  // surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0) lo = 0x90;  // overlong
        if (c == 0xf4) hi = 0x8f;  // past U+10FFFF
    } else {
        return 0;
    }
    if (i + n > s.size() || b(i + 1) < lo || b(i + 1) > hi) return 0;
    for (size_t k = 2; k < n; ++k)
        if (b(i + k) < 0x80 || b(i + k) > 0xbf) return 0;
    return n;
}

// The path as text a message can carry: bytes that are not UTF-8 as \xNN.
std::string shown(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
        size_t n = utf8_at(s, i);
        if (n) {
            out.append(s.substr(i, n));
            i += n;
        } else {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02X", static_cast<unsigned char>(s[i]));
            out += hex;
            ++i;
        }
    }
    return out;
}

}  // namespace

bool valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        size_t n = utf8_at(s, i);
        if (!n) return false;
        i += n;
    }
    return true;
}

Result<std::string> normalize_upath(std::string_view upath) {
    if (upath.empty()) return Status(DYAD_RC_BADFIO, "empty file path", EINVAL);
    if (upath.find('\0') != std::string_view::npos)
        return Status(DYAD_RC_BADFIO, "file path contains a NUL byte", EINVAL);
    // Paths travel in JSON (docs/wire-protocol.md), which holds UTF-8 only.
    if (!valid_utf8(upath))
        return Status(DYAD_RC_BADFIO,
                      "file path '" + shown(upath) +
                          "' is not UTF-8: DYAD moves files whose paths are UTF-8 (rename it)",
                      EILSEQ);
    if (upath[0] == '/')
        return Status(DYAD_RC_BADFIO,
                      "absolute path '" + std::string(upath) +
                          "' refused: give a path relative to the managed directory",
                      EINVAL);
    // `sub/../f` is `f`; a `..` that would leave the directory is refused.
    // (Lexical: the service opens the result beneath its directory, so a
    // symbolic link cannot lead out either.)
    std::vector<std::string_view> parts;
    for (auto part : split(upath)) {
        if (part == ".") continue;
        if (part == "..") {
            if (parts.empty())
                return Status(DYAD_RC_BADFIO,
                              "path '" + std::string(upath) +
                                  "' refused: '..' may not leave the managed directory",
                              EINVAL);
            parts.pop_back();
            continue;
        }
        parts.push_back(part);
    }
    if (!parts.empty() && parts.front() == kReservedDir)
        return Status(DYAD_RC_BADFIO,
                      "path '" + std::string(upath) + "' refused: " + kReservedDir +
                          "/ holds DYAD's own files (locks) and is never produced nor consumed",
                      EACCES);
    std::string out;
    for (auto part : parts) {
        if (!out.empty()) out += '/';
        out += part;
    }
    if (out.empty())
        return Status(DYAD_RC_BADFIO,
                      "path '" + std::string(upath) + "' names the managed directory itself",
                      EISDIR);
    if (out.size() > 4096)
        return Status(DYAD_RC_BADFIO, "file path longer than 4096 bytes", ENAMETOOLONG);
    return out;
}

ManagedDir::ManagedDir(std::string_view dir)
    : given_(dir), lexical_(lexical_absolute(dir)), canonical_(canonical_path(dir)) {}

std::optional<std::string> ManagedDir::relative(std::string_view path, bool relative_mode) const {
    if (given_.empty() || path.empty()) return std::nullopt;
    if (relative_mode && path[0] != '/') {
        auto n = normalize_upath(path);
        if (!n) return std::nullopt;
        return n.value();
    }
    auto inside = [](const std::string& base, const std::string& p) -> std::optional<std::string> {
        if (base == "/") {
            if (p.size() > 1) return p.substr(1);
            return std::nullopt;
        }
        if (p.size() > base.size() + 1 && p.compare(0, base.size(), base) == 0 &&
            p[base.size()] == '/')
            return p.substr(base.size() + 1);
        return std::nullopt;
    };
    std::string lex = lexical_absolute(path);
    if (auto r = inside(lexical_, lex)) return r;
    if (auto r = inside(canonical_, lex)) return r;
    std::string canon = canonical_path(path);
    if (auto r = inside(canonical_, canon)) return r;
    return std::nullopt;
}

Result<UniqueFd> open_beneath(int dirfd, const std::string& upath, int flags, mode_t mode,
                              Links links) {
    struct open_how how;
    std::memset(&how, 0, sizeof how);
    how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
    how.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    if (links == Links::none) how.resolve |= RESOLVE_NO_SYMLINKS;
    for (;;) {
        long fd = syscall(SYS_openat2, dirfd, upath.c_str(), &how, sizeof how);
        if (fd >= 0) return UniqueFd(static_cast<int>(fd));
        if (errno == EINTR) continue;
        if (errno != ENOSYS) return Status::sys("open '" + upath + "'");
        break;
    }
    // Kernels without openat2: walk component by component refusing symlinks.
    auto parts = split(upath);
    UniqueFd cur(::dup(dirfd));
    if (!cur.valid()) return Status::sys("dup");
    for (size_t i = 0; i < parts.size(); ++i) {
        std::string part(parts[i]);
        if (part == "..") return Status(DYAD_RC_BADFIO, "'..' refused", EXDEV);
        bool last = i + 1 == parts.size();
        int f = last ? (flags | O_NOFOLLOW | O_CLOEXEC)
                     : (O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int fd = ::openat(cur.get(), part.c_str(), f, mode);
        if (fd < 0) {
            if (errno == ELOOP && links == Links::beneath) errno = EXDEV;
            return Status::sys("open '" + upath + "'");
        }
        cur.reset(fd);
    }
    return cur;
}

std::string first_symlink(int dirfd, const std::string& rel) {
    auto parts = split(rel);
    UniqueFd cur(::dup(dirfd));
    std::string prefix;
    for (size_t i = 0; cur.valid() && i < parts.size(); ++i) {
        std::string part(parts[i]);
        prefix += (prefix.empty() ? "" : "/") + part;
        struct stat st;
        if (::fstatat(cur.get(), part.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return "";
        if (S_ISLNK(st.st_mode)) return prefix;
        if (!S_ISDIR(st.st_mode)) return "";
        cur.reset(::openat(cur.get(), part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    }
    return "";
}

namespace {

// `prefix` beneath dirfd is a symbolic link: says so, and where it points.
Status symlink_refused(int dirfd, const std::string& prefix) {
    char to[PATH_MAX];
    ssize_t n = ::readlinkat(dirfd, prefix.c_str(), to, sizeof to - 1);
    std::string where = n > 0 ? " (-> '" + std::string(to, static_cast<size_t>(n)) + "')" : "";
    return Status(DYAD_RC_BADFIO, "'" + prefix + "' is a symbolic link" + where, ELOOP);
}

}  // namespace

Result<UniqueFd> dir_beneath(int dirfd, const std::string& rel, bool create, mode_t mode) {
    constexpr int kDir = O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    if (rel.empty() || rel == ".") {
        int fd = ::openat(dirfd, ".", kDir);
        if (fd < 0) return Status::sys("open the directory");
        return UniqueFd(fd);
    }
    auto fd = open_beneath(dirfd, rel, O_PATH | O_DIRECTORY, 0, Links::none);
    if (fd) return fd;
    const int e = fd.status().err();
    if (e != ENOENT || !create) {
        if (e == ELOOP || e == ENOTDIR) {
            std::string link = first_symlink(dirfd, rel);
            if (!link.empty()) return symlink_refused(dirfd, link);
        }
        return fd.status();
    }
    // Missing components: made one at a time, none of them followed.
    auto parts = split(rel);
    UniqueFd cur(::dup(dirfd));
    if (!cur.valid()) return Status::sys("dup");
    std::string prefix;
    for (auto p : parts) {
        std::string part(p);
        prefix += (prefix.empty() ? "" : "/") + part;
        if (part == "..") return Status(DYAD_RC_BADFIO, "'" + rel + "': '..' refused", EXDEV);
        int f = ::openat(cur.get(), part.c_str(), kDir);
        if (f < 0 && errno == ENOENT) {
            if (::mkdirat(cur.get(), part.c_str(), mode) != 0 && errno != EEXIST)
                return Status(DYAD_RC_BADFIO, "cannot create directory '" + prefix + "'", errno);
            f = ::openat(cur.get(), part.c_str(), kDir);
        }
        if (f < 0) {
            const int err = errno;
            struct stat st;
            if (::fstatat(cur.get(), part.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
                if (S_ISLNK(st.st_mode)) return symlink_refused(dirfd, prefix);
                if (!S_ISDIR(st.st_mode))
                    return Status(DYAD_RC_BADFIO, "'" + prefix + "' exists and is not a directory",
                                  ENOTDIR);
            }
            return Status(DYAD_RC_BADFIO, "cannot open directory '" + prefix + "'", err);
        }
        cur.reset(f);
    }
    return cur;
}

Result<UniqueFd> open_beneath_unreserved(int dirfd, const std::string& dir,
                                         const std::string& upath, int flags) {
    auto fd = open_beneath(dirfd, upath, flags, 0, Links::none);
    if (fd || fd.status().err() != ELOOP) return fd;
    // Through a symlink (that stays beneath the directory): where it
    // leads, as the kernel says, must not be DYAD's own directory.
    fd = open_beneath(dirfd, upath, flags, 0, Links::beneath);
    if (!fd) return fd;
    char self[64];
    std::snprintf(self, sizeof self, "/proc/self/fd/%d", fd->get());
    char buf[PATH_MAX];
    ssize_t n = ::readlink(self, buf, sizeof buf);
    const std::string reserved = (dir == "/" ? "" : dir) + "/" + kReservedDir;
    if (n <= 0 || static_cast<size_t>(n) >= sizeof buf)
        return Status(DYAD_RC_BADFIO,
                      "'" + upath +
                          "' goes through a symbolic link and without /proc DYAD cannot "
                          "tell whether it leads into " +
                          reserved + ": refused",
                      EACCES);
    std::string real(buf, static_cast<size_t>(n));
    if (real == reserved || real.compare(0, reserved.size() + 1, reserved + "/") == 0)
        return Status(DYAD_RC_BADFIO,
                      "'" + upath + "' leads through a symbolic link into " + reserved +
                          " (DYAD's own files: never produced nor consumed): refused",
                      EACCES);
    return fd;
}

Status mkdir_p(const std::string& dir, mode_t mode) {
    if (dir.empty()) return Status::ok();
    struct stat st;
    if (::stat(dir.c_str(), &st) == 0) {
        if (S_ISDIR(st.st_mode)) return Status::ok();
        return Status(DYAD_RC_BADFIO, "'" + dir + "' exists and is not a directory", ENOTDIR);
    }
    size_t slash = dir.rfind('/');
    if (slash != std::string::npos && slash > 0) {
        Status s = mkdir_p(dir.substr(0, slash), mode);
        if (!s) return s;
    }
    if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST)
        return Status(DYAD_RC_BADFIO, "cannot create directory '" + dir + "'", errno);
    return Status::ok();
}

std::string dir_part(const std::string& upath) {
    size_t slash = upath.rfind('/');
    return slash == std::string::npos ? std::string() : upath.substr(0, slash);
}
std::string base_part(const std::string& upath) {
    size_t slash = upath.rfind('/');
    return slash == std::string::npos ? upath : upath.substr(slash + 1);
}

}  // namespace dyad
