// SPDX-License-Identifier: Apache-2.0
// dyad::dyad_stream_core over the public C API (dyad_ctx.h, dyad_client.h):
// the context is opaque here. See include/dyad/stream/dyad_stream_core.hpp.
#include <dyad/stream/dyad_stream_core.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <dyad/client/dyad_client.h>
#include <dyad/common/dyad_envs.h>
#include <dyad/core/dyad_ctx.h>

#include "common/log.hpp"
#include "common/settings.hpp"
#include "dtl/dtl.hpp"

namespace dyad {

namespace {

constexpr const char* kSub = "stream";

// A DYAD boolean from the settings table (environment, DYAD_CONFIG_FILE):
// unset or a "no" spelling is false, anything else true.
bool setting_flag(const char* name) {
    auto b = settings::flag(name);
    return b && b.value();
}

std::vector<std::string> components(const std::string& path) {
    std::vector<std::string> out;
    size_t i = 0;
    while (i < path.size()) {
        size_t j = path.find('/', i);
        if (j == std::string::npos) j = path.size();
        if (j > i) out.push_back(path.substr(i, j - i));
        i = j + 1;
    }
    return out;
}

std::string join(const std::vector<std::string>& parts, size_t n) {
    std::string s;
    for (size_t i = 0; i < n; ++i) s += "/" + parts[i];
    return s.empty() ? std::string("/") : s;
}

// Absolute, "." and ".." resolved lexically, symbolic links not followed.
std::string lexical_absolute(const std::string& path) {
    std::string full = path;
    if (full.empty() || full[0] != '/') {
        char cwd[PATH_MAX];
        if (!::getcwd(cwd, sizeof cwd)) return std::string();
        full = std::string(cwd) + "/" + full;
    }
    std::vector<std::string> out;
    for (const auto& c : components(full)) {
        if (c == ".") continue;
        if (c == "..") {
            if (!out.empty()) out.pop_back();
            continue;
        }
        out.push_back(c);
    }
    return join(out, out.size());
}

// realpath() of the longest existing prefix, the rest appended: a file that
// does not exist yet still gets the canonical form of its directory.
std::string canonical(const std::string& path) {
    std::string lex = lexical_absolute(path);
    if (lex.empty()) return lex;
    std::vector<std::string> parts = components(lex);
    for (size_t n = parts.size() + 1; n-- > 0;) {
        char buf[PATH_MAX];
        if (!::realpath(join(parts, n).c_str(), buf)) continue;
        std::string s(buf);
        for (size_t i = n; i < parts.size(); ++i) s += (s == "/" ? "" : "/") + parts[i];
        return s;
    }
    return lex;
}

// The part of `p` below directory `base`, if p lies strictly inside it.
bool inside(const std::string& base, const std::string& p, std::string* rel) {
    if (base.empty() || p.empty()) return false;
    if (base == "/") {
        if (p.size() < 2) return false;
        *rel = p.substr(1);
        return true;
    }
    if (p.size() > base.size() + 1 && p.compare(0, base.size(), base) == 0 &&
        p[base.size()] == '/') {
        *rel = p.substr(base.size() + 1);
        return true;
    }
    return false;
}

// A path relative to a managed directory, in normal form; false if it leaves it.
bool normalize_relative(const std::string& path, std::string* rel) {
    std::vector<std::string> out;
    for (const auto& c : components(path)) {
        if (c == ".") continue;
        if (c == "..") {
            if (out.empty()) return false;
            out.pop_back();
            continue;
        }
        out.push_back(c);
    }
    if (out.empty()) return false;
    *rel = join(out, out.size()).substr(1);
    return true;
}

const char* or_null(const std::string& s) {
    return s.empty() ? nullptr : s.c_str();
}

dyad_rc_t init_with(const dyad_params& p) {
    // dyad_params has no cache or origin settings: theirs come from the
    // environment (dyad_init_16).
    return dyad_init_16(p.m_debug, false, p.m_shared_storage, p.m_reinit, p.m_async_publish,
                        p.m_fsync_write, p.m_key_depth, p.m_key_bins, p.m_service_mux,
                        or_null(p.m_kvs_namespace), or_null(p.m_prod_managed_path),
                        or_null(p.m_cons_managed_path), p.m_relative_to_managed_path,
                        // The original DYAD's transport number (dyad_params::m_dtl_mode), or
                        // none: DYAD_DTL_MODE from the settings.
                        dtl::name_of_dyad_mode(p.m_dtl_mode), DYAD_COMM_RECV, nullptr);
}

// A whole-file lock: an open file description lock, or a POSIX record lock
// on kernels without those (EINVAL).
int set_lock(int fd, short type) {
    struct flock fl;
    std::memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    int cmd = type == F_UNLCK ? F_OFD_SETLK : F_OFD_SETLKW;
    for (;;) {
        if (::fcntl(fd, cmd, &fl) == 0) return DYAD_RC_OK;
        if (errno == EINTR) continue;
        if (errno == EINVAL && (cmd == F_OFD_SETLK || cmd == F_OFD_SETLKW)) {
            cmd = type == F_UNLCK ? F_SETLK : F_SETLKW;
            continue;
        }
        return DYAD_RC_BADFIO;
    }
}

}  // namespace

dyad_stream_core::dyad_stream_core()
    : m_initialized(false),
      m_from_params(false),
      m_is_prod(false),
      m_is_cons(false),
      m_fsync_write(false),
      m_relative(false),
      m_rc(DYAD_RC_OK) {}

dyad_stream_core::~dyad_stream_core() = default;

void dyad_stream_core::read_env() {
    m_prod_path = settings::text(DYAD_PATH_PRODUCER_ENV);
    m_cons_path = settings::text(DYAD_PATH_CONSUMER_ENV);
    m_is_prod = !m_prod_path.empty();
    m_is_cons = !m_cons_path.empty();
    m_fsync_write = setting_flag(DYAD_FSYNC_WRITE_ENV);
    m_relative = setting_flag(DYAD_PATH_RELATIVE_ENV);
}

void dyad_stream_core::init(const bool reinit) {
    const bool again = reinit || setting_flag(DYAD_REINIT_ENV);
    if (m_initialized && !again) return;
    read_env();
    m_from_params = false;
    // dyad_init_env reinitialises the context itself when DYAD_REINIT says so.
    if (again || !dyad_ctx_get())
        record(dyad_init_env(DYAD_COMM_RECV, nullptr));
    else
        record(DYAD_RC_OK);
    m_initialized = true;
    log_info("stream core initialised from the environment");
}

void dyad_stream_core::init(const dyad_params& p) {
    m_params = p;
    m_from_params = true;
    m_prod_path = p.m_prod_managed_path;
    m_cons_path = p.m_cons_managed_path;
    m_is_prod = !m_prod_path.empty();
    m_is_cons = !m_cons_path.empty();
    m_fsync_write = p.m_fsync_write;
    m_relative = p.m_relative_to_managed_path;
    record(init_with(p));
    m_initialized = true;
    log_info("stream core initialised from parameters");
}

void dyad_stream_core::log_info(const std::string& msg_head) const {
    DYAD_INFO(kSub,
              "%s: producer directory '%s', consumer directory '%s', relative paths %s, "
              "fsync %s, initialised %s%s%s",
              msg_head.c_str(), m_prod_path.c_str(), m_cons_path.c_str(), m_relative ? "on" : "off",
              m_fsync_write ? "on" : "off",
              !m_initialized ? "no" : (m_from_params ? "from parameters" : "from the environment"),
              DYAD_IS_ERROR(m_rc) ? ", last error: " : "", m_error.c_str());
}

void dyad_stream_core::finalize() {
    m_initialized = false;
    m_from_params = false;
    m_is_prod = m_is_cons = false;
    m_fsync_write = m_relative = false;
    m_prod_path.clear();
    m_cons_path.clear();
    m_upath.clear();
}

bool dyad_stream_core::is_dyad_producer() const {
    return m_is_prod;
}

bool dyad_stream_core::is_dyad_consumer() const {
    return m_is_cons;
}

void dyad_stream_core::record(dyad_rc_t rc) {
    m_rc = rc;
    if (DYAD_IS_ERROR(rc))
        m_error = dyad_last_error();
    else
        m_error.clear();
}

// A context to call with: this core initialised, and the process's context
// initialised again the same way if it was torn down since (dyad_finalize).
// False if that fails (m_rc says why).
bool dyad_stream_core::context_ready() {
    if (!m_initialized)
        init();
    else if (!dyad_ctx_get())
        record(m_from_params ? init_with(m_params) : dyad_init_env(DYAD_COMM_RECV, nullptr));
    if (dyad_ctx_get()) return true;
    if (!DYAD_IS_ERROR(m_rc)) {  // torn down again meanwhile
        m_rc = DYAD_RC_NOCTX;
        m_error = "DYAD has no context (dyad_finalize was called)";
    }
    return false;
}

bool dyad_stream_core::open_sync(const char* path) {
    if (!path || !*path) {
        record(DYAD_RC_OK);
        return true;
    }
    if (!context_ready()) {
        if (m_is_cons) return false;
        record(DYAD_RC_OK);  // not a consumer: the file is an ordinary one
        return true;
    }
    dyad_rc_t rc = dyad_consume(dyad_ctx_get(), path);
    // No consumer directory (or DYAD inert) in a process that is not known
    // as a consumer: nothing to consume.
    if ((rc == DYAD_RC_NOCTX || rc == DYAD_RC_BADMANAGEDPATH) && !m_is_cons) rc = DYAD_RC_OK;
    record(rc);
    if (DYAD_IS_ERROR(rc)) DYAD_DEBUG(kSub, "open_sync '%s': %s", path, m_error.c_str());
    return !DYAD_IS_ERROR(rc);
}

bool dyad_stream_core::close_sync(const char* path) {
    if (!path || !*path) {
        record(DYAD_RC_OK);
        return true;
    }
    if (!context_ready()) {
        if (m_is_prod) return false;
        record(DYAD_RC_OK);
        return true;
    }
    dyad_rc_t rc = dyad_produce(dyad_ctx_get(), path);
    if ((rc == DYAD_RC_NOCTX || rc == DYAD_RC_BADMANAGEDPATH) && !m_is_prod) rc = DYAD_RC_OK;
    record(rc);
    if (DYAD_IS_ERROR(rc)) DYAD_DEBUG(kSub, "close_sync '%s': %s", path, m_error.c_str());
    return !DYAD_IS_ERROR(rc);
}

void dyad_stream_core::set_initialized() {
    m_initialized = true;
}

bool dyad_stream_core::chk_initialized() const {
    return m_initialized;
}

bool dyad_stream_core::chk_fsync_write() const {
    return m_fsync_write;
}

bool dyad_stream_core::cmp_canonical_path_prefix(bool is_prod, const char* path) {
    if (!m_initialized) init();
    m_upath.clear();
    const std::string& dir = is_prod ? m_prod_path : m_cons_path;
    if (dir.empty() || !path || !*path) return false;
    std::string rel;
    if (m_relative && path[0] != '/') {
        if (!normalize_relative(path, &rel)) return false;
        m_upath = rel;
        return true;
    }
    const std::string lex_dir = lexical_absolute(dir);
    const std::string can_dir = canonical(dir);
    const std::string lex = lexical_absolute(path);
    if (inside(lex_dir, lex, &rel) || inside(can_dir, lex, &rel) ||
        inside(can_dir, canonical(path), &rel)) {
        m_upath = rel;
        return true;
    }
    return false;
}

std::string dyad_stream_core::get_upath() const {
    return m_upath;
}

int dyad_stream_core::file_lock_exclusive(int fd) const {
    return set_lock(fd, F_WRLCK);
}

int dyad_stream_core::file_lock_shared(int fd) const {
    return set_lock(fd, F_RDLCK);
}

int dyad_stream_core::file_unlock(int fd) const {
    return set_lock(fd, F_UNLCK);
}

dyad_rc_t dyad_stream_core::dyad_rc() const {
    return m_rc;
}

const std::string& dyad_stream_core::dyad_error() const {
    return m_error;
}

}  // namespace dyad
