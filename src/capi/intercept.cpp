// SPDX-License-Identifier: Apache-2.0
#include "intercept.hpp"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace dyad::capi {

OpenIntent intent_of_oflag(int oflag) {
    switch (oflag & O_ACCMODE) {
        case O_RDONLY:
            return {true, false};
        case O_WRONLY:
            return {false, true};
        default:
            return {true, true};
    }
}

OpenIntent intent_of_fmode(const char* mode) {
    OpenIntent i;
    if (!mode || !*mode) return i;
    bool plus = std::strchr(mode, '+') != nullptr;
    switch (mode[0]) {
        case 'r':
            i.read = true;
            i.write = plus;
            break;
        case 'w':
        case 'a':
            i.write = true;
            i.read = plus;
            break;
        default:
            break;
    }
    return i;
}

int oflag_of_fmode(const char* mode) {
    if (!mode || !*mode) return O_RDONLY;
    bool plus = std::strchr(mode, '+') != nullptr;
    switch (mode[0]) {
        case 'r':
            return plus ? O_RDWR : O_RDONLY;
        case 'w':
            return (plus ? O_RDWR : O_WRONLY) | O_CREAT | O_TRUNC;
        case 'a':
            return (plus ? O_RDWR : O_WRONLY) | O_CREAT | O_APPEND;
        default:
            return O_RDONLY;
    }
}

namespace {
// The n characters at s are letters or digits.
bool alnum(const char* s, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9')))
            return false;
    return true;
}
}  // namespace

bool is_tool_temporary(const char* base) {
    if (!base) return false;
    const size_t n = std::strlen(base);
    // sed -i: "sed" and six letters or digits (mkostemp's suffix).
    if (n == 9 && std::strncmp(base, "sed", 3) == 0 && alnum(base + 3, 6)) return true;
    // rsync: "." NAME "." and six letters or digits, NAME not empty.
    if (n >= 9 && base[0] == '.' && base[n - 7] == '.' && alnum(base + n - 6, 6)) return true;
    return false;
}

ConsumeMode consume_mode(const OpenFacts& f) {
    if (!InterceptPolicy::should_consume(f.oflag) || f.temporary || f.is_dir)
        return ConsumeMode::none;
    // Opened for writing too (O_RDWR: h5py's 'w' probes so, r+): never waits.
    if ((f.oflag & O_ACCMODE) != O_RDONLY) return ConsumeMode::look;
    // A file that is here is read as it is (once its writer is done), or as
    // its latest produce.
    if (f.exists) return f.being_written ? ConsumeMode::wait : ConsumeMode::look;
    // Relative to a directory descriptor: programs that walk directories
    // (rsync's receiver opening its destination as a delta basis, tar, cp
    // -r) read what they listed or probe their own destination.
    if (f.via_dirfd) return ConsumeMode::look;
    return ConsumeMode::wait;
}

InterceptPolicy::InterceptPolicy(const client::Client& c) {
    if (!c.producer_dir().empty()) {
        prod_ = lexical_absolute(c.producer_dir().given());
        prod_canon_ = c.producer_dir().path();
    }
    if (!c.consumer_dir().empty()) {
        cons_ = lexical_absolute(c.consumer_dir().given());
        cons_canon_ = c.consumer_dir().path();
    }
}

bool InterceptPolicy::absolute(int dirfd, const char* path, char* out, size_t cap) {
    if (!path || !*path) return false;
    char base[PATH_MAX];
    size_t n = 0;
    if (path[0] != '/') {
        if (dirfd == AT_FDCWD) {
            if (!::getcwd(base, sizeof base)) return false;
        } else {
            char link[64];
            std::snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t r = ::readlink(link, base, sizeof base - 1);
            if (r <= 0) return false;
            base[r] = '\0';
        }
        n = std::strlen(base);
    }
    // Normalise base + "/" + path lexically into out.
    size_t len = 0;
    auto push = [&](const char* seg, size_t sl) -> bool {
        if (sl == 0 || (sl == 1 && seg[0] == '.')) return true;
        if (sl == 2 && seg[0] == '.' && seg[1] == '.') {
            while (len > 0 && out[len - 1] != '/') --len;
            if (len > 0) --len;  // drop the slash
            return true;
        }
        if (len + 1 + sl + 1 > cap) return false;
        out[len++] = '/';
        std::memcpy(out + len, seg, sl);
        len += sl;
        return true;
    };
    auto walk = [&](const char* s, size_t sn) -> bool {
        size_t i = 0;
        while (i < sn) {
            while (i < sn && s[i] == '/') ++i;
            size_t j = i;
            while (j < sn && s[j] != '/') ++j;
            if (!push(s + i, j - i)) return false;
            i = j;
        }
        return true;
    };
    if (n && !walk(base, n)) return false;
    if (!walk(path, std::strlen(path))) return false;
    if (len == 0) {
        if (cap < 2) return false;
        out[len++] = '/';
    }
    out[len] = '\0';
    return true;
}

bool InterceptPolicy::under(const std::string& dir, const char* abs) {
    if (dir.empty()) return false;
    size_t n = dir.size();
    if (std::strncmp(abs, dir.c_str(), n) != 0) return false;
    if (n == 1) return abs[1] != '\0';  // "/"
    return abs[n] == '/' && abs[n + 1] != '\0';
}

bool InterceptPolicy::under_producer(const char* abs) const {
    return under(prod_, abs) || (prod_canon_ != prod_ && under(prod_canon_, abs));
}
// DYAD's own files in a consumer directory (<dir>/.dyad/..., temporary
// ".<name>.dyad-XXXXXX" files) are never consumed.
static bool is_dyad_internal(const char* abs, size_t dir_len) {
    const char* rel = abs + dir_len + 1;
    if (std::strncmp(rel, ".dyad/", 6) == 0) return true;
    const char* base = std::strrchr(abs, '/') + 1;
    const char* tag = base[0] == '.' ? std::strstr(base, ".dyad-") : nullptr;
    return tag && std::strlen(tag) == 12;
}

bool InterceptPolicy::under_consumer(const char* abs) const {
    if (under(cons_, abs)) return !is_dyad_internal(abs, cons_.size());
    if (cons_canon_ != cons_ && under(cons_canon_, abs))
        return !is_dyad_internal(abs, cons_canon_.size());
    return false;
}

bool InterceptPolicy::should_consume(int oflag) {
    // Probes and directories are not reads of a file's contents.
    if (oflag & (O_PATH | O_DIRECTORY)) return false;
    if ((oflag & O_TMPFILE) == O_TMPFILE) return false;
    int acc = oflag & O_ACCMODE;
    if (acc == O_WRONLY) return false;
    if (acc == O_RDWR && (oflag & (O_CREAT | O_TRUNC))) return false;
    return true;
}

int errno_for(const Status& s) {
    switch (s.rc()) {
        case DYAD_RC_TIMEOUT:
            return ETIMEDOUT;
        case DYAD_RC_NOTFOUND:
            return ENOENT;
        case DYAD_RC_CONNFAIL:
            return ECONNREFUSED;
        case DYAD_RC_BADCHECKSUM:
        case DYAD_RC_BADFETCH:
            return EIO;
        case DYAD_RC_BADFIO:
            return s.err() ? s.err() : EIO;
        default:
            return s.err() ? s.err() : EIO;
    }
}

}  // namespace dyad::capi
