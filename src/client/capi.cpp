// SPDX-License-Identifier: Apache-2.0
// The C API: DYAD's names and return codes over dyad::client::Client.
// No exception crosses this boundary.
//
// The context is one static object with the original DYAD's layout
// (include/dyad/core/dyad_ctx.h): its address never changes, its public
// fields mirror the configuration in effect, and this implementation's state
// (the client, the strings the fields point to) hangs off `h`.
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <pthread.h>
#include <unordered_set>
#include <vector>

#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_consume_many.h>
#include <dyad/core/dyad_ctx.h>

#include "client.hpp"
#include "publish_queue.hpp"
#include "common/fd.hpp"
#include "common/keygen.hpp"
#include "common/log.hpp"
#include "common/json_text.hpp"

// The original's layout, field by field (x86-64 and every LP64 ABI): 152
// bytes until upstream's 2026 fields, 200 since.
static_assert(sizeof(void*) != 8 || sizeof(struct dyad_ctx) == 200, "struct dyad_ctx size");
#define DYAD_CHECK_OFFSET_(field, off) \
    static_assert(sizeof(void*) != 8 || offsetof(struct dyad_ctx, field) == off, #field)
DYAD_CHECK_OFFSET_(h, 0);
DYAD_CHECK_OFFSET_(dtl_handle, 8);
DYAD_CHECK_OFFSET_(fname, 16);
DYAD_CHECK_OFFSET_(use_fs_locks, 24);
DYAD_CHECK_OFFSET_(prod_real_path, 32);
DYAD_CHECK_OFFSET_(cons_real_path, 40);
DYAD_CHECK_OFFSET_(prod_managed_len, 48);
DYAD_CHECK_OFFSET_(cons_managed_len, 52);
DYAD_CHECK_OFFSET_(prod_real_len, 56);
DYAD_CHECK_OFFSET_(cons_real_len, 60);
DYAD_CHECK_OFFSET_(prod_managed_hash, 64);
DYAD_CHECK_OFFSET_(cons_managed_hash, 68);
DYAD_CHECK_OFFSET_(prod_real_hash, 72);
DYAD_CHECK_OFFSET_(cons_real_hash, 76);
DYAD_CHECK_OFFSET_(delim_len, 80);
DYAD_CHECK_OFFSET_(debug, 84);
DYAD_CHECK_OFFSET_(check, 85);
DYAD_CHECK_OFFSET_(reenter, 86);
DYAD_CHECK_OFFSET_(initialized, 87);
DYAD_CHECK_OFFSET_(shared_storage, 88);
DYAD_CHECK_OFFSET_(async_publish, 89);
DYAD_CHECK_OFFSET_(fsync_write, 90);
DYAD_CHECK_OFFSET_(key_depth, 92);
DYAD_CHECK_OFFSET_(key_bins, 96);
DYAD_CHECK_OFFSET_(rank, 100);
DYAD_CHECK_OFFSET_(service_mux, 104);
DYAD_CHECK_OFFSET_(node_idx, 108);
DYAD_CHECK_OFFSET_(pid, 112);
DYAD_CHECK_OFFSET_(kvs_namespace, 120);
DYAD_CHECK_OFFSET_(prod_managed_path, 128);
DYAD_CHECK_OFFSET_(cons_managed_path, 136);
DYAD_CHECK_OFFSET_(relative_to_managed_path, 144);
DYAD_CHECK_OFFSET_(cache_policy, 152);
DYAD_CHECK_OFFSET_(cache_policy_mode, 160);
DYAD_CHECK_OFFSET_(cache_capacity_bytes, 168);
DYAD_CHECK_OFFSET_(cache_low_watermark_frac, 176);
DYAD_CHECK_OFFSET_(cache_grace_period_sec, 184);
DYAD_CHECK_OFFSET_(origin_path, 192);
#undef DYAD_CHECK_OFFSET_
static_assert(offsetof(dyad_metadata_t, fpath) == 0, "dyad_metadata_t::fpath");
static_assert(sizeof(void*) != 8 || offsetof(dyad_metadata_t, owner_rank) == 8,
              "dyad_metadata_t::owner_rank");

extern "C" const struct dyad_ctx dyad_ctx_default = {
    nullptr,  // h
    nullptr,  // dtl_handle
    nullptr,  // fname
    false,    // use_fs_locks
    nullptr,  // prod_real_path
    nullptr,  // cons_real_path
    0u,       // prod_managed_len
    0u,       // cons_managed_len
    0u,       // prod_real_len
    0u,       // cons_real_len
    0u,       // prod_managed_hash
    0u,       // cons_managed_hash
    0u,       // prod_real_hash
    0u,       // cons_real_hash
    0u,       // delim_len
    false,    // debug
    false,    // check
    false,    // reenter
    true,     // initialized (as the original's)
    false,    // shared_storage
    false,    // async_publish
    false,    // fsync_write
    3u,       // key_depth
    1024u,    // key_bins
    0u,       // rank
    1u,       // service_mux
    0u,       // node_idx
    -1,       // pid
    nullptr,  // kvs_namespace
    nullptr,  // prod_managed_path
    nullptr,  // cons_managed_path
    false,    // relative_to_managed_path
    nullptr,  // cache_policy
    0,        // cache_policy_mode (DYAD_CACHE_NONE)
    0u,       // cache_capacity_bytes
    0.8,      // cache_low_watermark_frac
    5u,       // cache_grace_period_sec
    nullptr,  // origin_path
};

// Binaries linked before 2026 copied dyad_ctx_default at its size then (152
// bytes): they bind to this one, of that size, at the old symbol version
// (src/libdyad.map), so that the dynamic linker neither warns nor copies
// past it. Its bytes are dyad_ctx_default's first 152.
struct CtxBefore2026 {
    void* h;
    struct dyad_dtl* dtl_handle;
    const char* fname;
    bool use_fs_locks;
    char *prod_real_path, *cons_real_path;
    uint32_t prod_managed_len, cons_managed_len, prod_real_len, cons_real_len;
    uint32_t prod_managed_hash, cons_managed_hash, prod_real_hash, cons_real_hash;
    uint32_t delim_len;
    bool debug, check, reenter, initialized, shared_storage, async_publish, fsync_write;
    unsigned int key_depth, key_bins;
    uint32_t rank, service_mux, node_idx;
    int pid;
    char *kvs_namespace, *prod_managed_path, *cons_managed_path;
    bool relative_to_managed_path;
};
static_assert(sizeof(void*) != 8 || sizeof(CtxBefore2026) == 152, "the layout before 2026");
extern "C" const CtxBefore2026 dyad_capi_ctx_default_before_2026 = {
    nullptr, nullptr, nullptr, false, nullptr, nullptr, 0u,      0u,      0u,      0u,    0u,
    0u,      0u,      0u,      0u,    false,   false,   false,   true,    false,   false, false,
    3u,      1024u,   0u,      1u,    0u,      -1,      nullptr, nullptr, nullptr, false};
__asm__(".symver dyad_capi_ctx_default_before_2026, dyad_ctx_default@DYAD_1");

namespace {

// What hangs off ctx->h.
struct State {
    std::shared_ptr<dyad::client::Client> client;  // null: inert (no managed path)
    // DYAD_ASYNC_PUBLISH with a producer directory (publish_queue.hpp).
    std::shared_ptr<dyad::client::PublishQueue> publisher;
    dyad::Config cfg;
    dyad_dtl_comm_mode_t comm_mode = DYAD_COMM_RECV;
    // The strings the context's fields point to.
    std::string ns, prod, cons, prod_real, cons_real, origin;
};

std::mutex g_mu;
struct dyad_ctx g_ctx = dyad_ctx_default;  // under g_mu
bool g_live = false;                       // dyad_ctx_get returns &g_ctx
thread_local std::string t_last_error;

// Metadata this library allocated (dyad_get_metadata), and so may read in
// full and free; anything else passed in is the caller's.
std::mutex g_md_mu;
std::unordered_set<const dyad_metadata_t*> g_owned;

State* state() {
    return static_cast<State*>(g_ctx.h);
}

dyad_rc_t fail(const dyad::Status& s) {
    t_last_error = s.to_string();
    return s.rc();
}

dyad_rc_t ok() {
    t_last_error.clear();
    return DYAD_RC_OK;
}

// Keeps the client alive for the duration of one call even if another
// thread finalises meanwhile.
std::shared_ptr<dyad::client::Client> client_of(dyad_ctx_t* ctx, dyad_rc_t* rc) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!ctx || ctx != &g_ctx || !g_live || !g_ctx.initialized || !state()) {
        *rc = fail(dyad::Status(DYAD_RC_NOCTX,
                                "DYAD is not initialised: call dyad_init or dyad_init_env first"));
        return nullptr;
    }
    if (!state()->client) {
        *rc = fail(dyad::Status(
            DYAD_RC_NOCTX,
            "DYAD is inert: neither DYAD_PATH_PRODUCER nor DYAD_PATH_CONSUMER is set"));
        return nullptr;
    }
    // A queued publish that failed since the last call is this call's
    // error; the call itself is not carried out (docs/user-guide.md).
    if (state()->publisher) {
        if (dyad::Status e = state()->publisher->take_failures(); !e) {
            *rc = fail(e.wrap("this call was not carried out (call it again)"));
            return nullptr;
        }
    }
    return state()->client;
}

// The publish queue of the context (DYAD_ASYNC_PUBLISH), or null.
std::shared_ptr<dyad::client::PublishQueue> publisher_of() {
    std::lock_guard<std::mutex> lk(g_mu);
    return g_live && state() ? state()->publisher : nullptr;
}

// Drains and closes a context's publish queue before the context goes.
dyad::Status finish_publisher(State* st) {
    if (!st || !st->publisher) return dyad::Status::ok();
    return st->publisher->finish();
}

template <typename F>
dyad_rc_t guarded(F&& f) {
    try {
        return f();
    } catch (const std::bad_alloc&) {
        return fail(dyad::Status(DYAD_RC_SYSFAIL, "out of memory", ENOMEM));
    } catch (const std::exception& e) {
        return fail(dyad::Status(DYAD_RC_SYSFAIL, std::string("internal error: ") + e.what()));
    }
}

uint32_t hash32(const std::string& s) {
    if (s.empty()) return 0;
    uint64_t h[2];
    dyad::murmur3_x64_128(s.data(), s.size(), 0x44594144u, h);
    return static_cast<uint32_t>(h[0]);
}

// Points a path field (and its length and hash) at `storage`, or NULL.
void set_path(std::string& storage, const std::string& value, char** field, uint32_t* len,
              uint32_t* hash) {
    storage = value;
    *field = value.empty() ? nullptr : storage.data();
    *len = static_cast<uint32_t>(value.size());
    *hash = hash32(value);
}

// DYAD_CACHE_LRU, _FIFO or _NONE for a policy name (any case); -1 if none.
int cache_mode_of(const std::string& policy) {
    std::string p;
    for (char ch : policy) p += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (p == "LRU" || p.empty()) return DYAD_CACHE_LRU;
    if (p == "FIFO") return DYAD_CACHE_FIFO;
    if (p == "NONE") return DYAD_CACHE_NONE;
    return -1;
}

// The context's public fields from `st` (under g_mu). The rank is kept.
void publish_fields(State& st) {
    const dyad::Config& c = st.cfg;
    uint32_t rank = g_ctx.rank;
    g_ctx = dyad_ctx_default;
    g_ctx.h = &st;
    g_ctx.use_fs_locks = true;
    g_ctx.delim_len = 1;
    g_ctx.debug = c.debug;
    g_ctx.check = c.check;
    g_ctx.reenter = true;
    g_ctx.initialized = true;
    g_ctx.shared_storage = c.shared_storage;
    g_ctx.async_publish = c.async_publish;
    g_ctx.fsync_write = c.fsync_write;
    g_ctx.key_depth = c.key_depth;
    g_ctx.key_bins = c.key_bins;
    g_ctx.service_mux = c.service_mux ? c.service_mux : 1;
    g_ctx.rank = rank;
    g_ctx.node_idx = rank == DYAD_RANK_UNKNOWN ? rank : rank / g_ctx.service_mux;
    g_ctx.pid = static_cast<int>(::getpid());
    g_ctx.relative_to_managed_path = c.relative_to_managed_path;
    st.ns = c.kvs_namespace;
    g_ctx.kvs_namespace = st.ns.empty() ? nullptr : st.ns.data();
    set_path(st.prod, c.prod_path, &g_ctx.prod_managed_path, &g_ctx.prod_managed_len,
             &g_ctx.prod_managed_hash);
    set_path(st.cons, c.cons_path, &g_ctx.cons_managed_path, &g_ctx.cons_managed_len,
             &g_ctx.cons_managed_hash);
    std::string pr = c.prod_path.empty() ? "" : dyad::ManagedDir(c.prod_path).path();
    std::string cr = c.cons_path.empty() ? "" : dyad::ManagedDir(c.cons_path).path();
    set_path(st.prod_real, pr, &g_ctx.prod_real_path, &g_ctx.prod_real_len, &g_ctx.prod_real_hash);
    set_path(st.cons_real, cr, &g_ctx.cons_real_path, &g_ctx.cons_real_len, &g_ctx.cons_real_hash);
    // Upstream's 2026 settings, as given (the cache itself is the client's).
    g_ctx.cache_capacity_bytes = c.cache_capacity;
    g_ctx.cache_policy_mode =
        c.cache_capacity == 0 ? DYAD_CACHE_NONE : cache_mode_of(c.cache_policy);
    g_ctx.cache_low_watermark_frac = c.cache_low_watermark;
    g_ctx.cache_grace_period_sec = static_cast<unsigned int>(c.cache_grace_period);
    st.origin = c.path_origin;
    g_ctx.origin_path = st.origin.empty() ? nullptr : st.origin.data();
}

void set_rank(uint32_t rank) {
    g_ctx.rank = rank;
    g_ctx.node_idx = rank == DYAD_RANK_UNKNOWN ? rank : rank / g_ctx.service_mux;
}

// This node's rank is its service's: ask it once (the answer is cached by
// the client). Unknown while the service cannot be reached.
void learn_rank(const std::shared_ptr<dyad::client::Client>& c) {
    if (!c) return;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (g_ctx.rank != DYAD_RANK_UNKNOWN) return;
    }
    auto s = c->service();
    if (!s) {
        DYAD_DEBUG("capi", "rank of this node unknown for now: %s", s.status().to_string().c_str());
        return;
    }
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_live && state() && state()->client == c) set_rank(s->rank);
}

// Replaces the context's state by one built from `cfg` (under g_mu). On
// failure the context is left as it was.
dyad_rc_t install(dyad::Config cfg, dyad_dtl_comm_mode_t comm_mode, bool keep_rank) {
    auto st = std::make_unique<State>();
    st->comm_mode = comm_mode;
    if (cfg.prod_path.empty() && cfg.cons_path.empty()) {
        DYAD_WARN("capi",
                  "neither DYAD_PATH_PRODUCER nor DYAD_PATH_CONSUMER is set: DYAD stays inert");
    } else {
        auto c = dyad::client::Client::create(cfg);
        if (!c) {
            DYAD_ERROR("capi", "dyad_init: %s", c.status().to_string().c_str());
            return fail(c.status());
        }
        st->client = std::move(c.value());
        if (cfg.async_publish && !cfg.prod_path.empty()) {
            auto o = dyad::client::PublishQueue::Options::from_settings();
            if (!o) return fail(o.status());
            st->publisher = dyad::client::PublishQueue::create(st->client, std::move(o.value()));
        }
    }
    st->cfg = std::move(cfg);
    // The old context's queued publishes go out first (failures logged).
    if (dyad::Status q = finish_publisher(state()); !q)
        DYAD_ERROR("capi", "reinitialising: %s", q.message().c_str());
    delete state();
    if (!keep_rank) g_ctx.rank = DYAD_RANK_UNKNOWN;
    publish_fields(*st);
    st.release();
    g_live = true;
    return ok();
}

// A forked child (DataLoader workers, multiprocessing) must not share the
// parent's sockets.
void after_fork_child() {
    new (&g_mu) std::mutex();  // a parent thread may have held it at fork time
    new (&g_md_mu) std::mutex();
    if (State* st = state()) {
        if (st->client) st->client->reset_after_fork();
        g_ctx.pid = static_cast<int>(::getpid());
    }
}

dyad_rc_t init_with(dyad::Config cfg, bool reinit, dyad_dtl_comm_mode_t comm_mode) {
    static std::once_flag atfork_once;
    std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, after_fork_child); });
    std::shared_ptr<dyad::client::Client> c;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (g_live && g_ctx.initialized && state() && !reinit) return ok();
        dyad::log::set_level(cfg.log_level);
        dyad_rc_t rc = install(std::move(cfg), comm_mode, false);
        if (DYAD_IS_ERROR(rc)) return rc;
        c = state()->client;
    }
    learn_rank(c);
    return ok();
}

// Rebuilds the initialised context with one setting changed.
template <typename Change>
dyad_rc_t reconfigure(const char* what, Change&& change) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_live || !g_ctx.initialized || !state())
        return fail(dyad::Status(DYAD_RC_NOCTX, std::string(what) +
                                                    ": DYAD is not initialised: call dyad_init "
                                                    "or dyad_init_env first"));
    dyad::Config cfg = state()->cfg;
    dyad_dtl_comm_mode_t mode = state()->comm_mode;
    dyad::Status s = change(cfg, mode);
    if (!s) return fail(s);
    return install(std::move(cfg), mode, true);
}

char* dup_str(const std::string& s) {
    char* p = static_cast<char*>(std::malloc(s.size() + 1));
    if (p) std::memcpy(p, s.c_str(), s.size() + 1);
    return p;
}

// Copies n bytes from memory the caller handed us without trusting it: an
// unmapped or unreadable address is an error, never a crash.
bool read_memory(void* dst, const void* src, size_t n) {
    if (!src) return false;
    struct iovec local = {dst, n};
    struct iovec remote = {const_cast<void*>(src), n};
    ssize_t r = ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0);
    if (r == static_cast<ssize_t>(n)) return true;
    if (r >= 0 || (errno != ENOSYS && errno != EPERM)) return false;
    // Where process_vm_readv is filtered (seccomp), a pipe does the same:
    // write(2) reports EFAULT for memory we may not read.
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return false;
    dyad::UniqueFd rd(p[0]), wr(p[1]);
    return ::write(wr.get(), src, n) == static_cast<ssize_t>(n) &&
           ::read(rd.get(), dst, n) == static_cast<ssize_t>(n);
}

// A NUL-terminated string of at most `max` bytes at an untrusted address.
std::optional<std::string> read_cstring(const char* p, size_t max) {
    static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    std::string out;
    char buf[4096];
    while (out.size() < max) {
        auto a = reinterpret_cast<uintptr_t>(p) + out.size();
        size_t chunk = std::min({page - a % page, max - out.size(), sizeof buf});
        if (!read_memory(buf, reinterpret_cast<const void*>(a), chunk)) return std::nullopt;
        if (const void* z = std::memchr(buf, 0, chunk)) {
            out.append(buf, static_cast<const char*>(z) - buf);
            return out;
        }
        out.append(buf, chunk);
    }
    return std::nullopt;
}

// A path outside the managed directory: nothing to do and DYAD_RC_OK, as
// upstream DYAD (programs rely on it), but said: a warning the first time
// in the process for each direction, a debug line for the others.
void note_unmanaged(std::atomic<bool>& warned, const char* call, const char* fname,
                    const dyad::ManagedDir& dir, const char* var) {
    if (!warned.exchange(true))
        DYAD_WARN("client",
                  "%s('%s'): not under %s (%s): ignored, nothing done (DYAD_RC_OK); every path "
                  "outside it is ignored so (said once; DYAD_LOG_LEVEL=debug shows each)",
                  call, fname, dir.path().c_str(), var);
    else
        DYAD_DEBUG("client", "%s('%s'): not under %s (%s): ignored", call, fname,
                   dir.path().c_str(), var);
}
std::atomic<bool> g_warned_unmanaged_produce{false};
std::atomic<bool> g_warned_unmanaged_consume{false};

// Upstream's 2026 arguments of dyad_init (none from dyad_init_16: the
// environment's values, or the defaults).
struct Upstream2026 {
    uint64_t cache_capacity;
    std::string cache_policy;
    double cache_low_watermark;
    double cache_grace_period;
    std::string path_origin;
};

// dyad_init of either era.
dyad_rc_t init_explicit(bool debug, bool check, bool shared_storage, bool reinit,
                        bool async_publish, bool fsync_write, unsigned int key_depth,
                        unsigned int key_bins, unsigned int service_mux, const char* kvs_namespace,
                        const char* prod_managed_path, const char* cons_managed_path,
                        bool relative_to_managed_path, const char* dtl_mode_str,
                        const dyad_dtl_comm_mode_t dtl_comm_mode, const Upstream2026* extra) {
    return guarded([&]() -> dyad_rc_t {
        if (dtl_comm_mode < DYAD_COMM_NONE || dtl_comm_mode >= DYAD_COMM_END)
            return fail(dyad::Status(DYAD_RC_BAD_COMM_MODE, "invalid comm mode"));
        if ((prod_managed_path && !*prod_managed_path) ||
            (cons_managed_path && !*cons_managed_path))
            return fail(dyad::Status(DYAD_RC_BADMANAGEDPATH, "a managed path is the empty string"));
        // Settings the API does not take (service URI, timeouts) come from the environment.
        auto base = dyad::Config::from_env();
        dyad::Config cfg = base ? base.value() : dyad::Config();
        cfg.debug = debug;
        cfg.check = check;
        cfg.shared_storage = shared_storage;
        cfg.async_publish = async_publish;
        cfg.fsync_write = fsync_write;
        cfg.key_depth = key_depth;
        cfg.key_bins = key_bins;
        cfg.service_mux = service_mux ? service_mux : 1;
        cfg.kvs_namespace = kvs_namespace ? kvs_namespace : "";
        cfg.prod_path = prod_managed_path ? prod_managed_path : "";
        cfg.cons_path = cons_managed_path ? cons_managed_path : "";
        cfg.relative_to_managed_path = relative_to_managed_path;
        if (extra) {
            cfg.cache_capacity = extra->cache_capacity;
            cfg.cache_policy = extra->cache_policy;
            cfg.cache_low_watermark = extra->cache_low_watermark;
            cfg.cache_grace_period = extra->cache_grace_period;
            cfg.path_origin = extra->path_origin;
        }
        if (debug && cfg.log_level > dyad::log::Level::debug)
            cfg.log_level = dyad::log::Level::debug;
        if (dtl_mode_str && *dtl_mode_str) {
            auto m = dyad::dtl::canonical_mode(dtl_mode_str);
            if (!m) return fail(m.status());
            cfg.dtl_mode = m.value();
        }
        if (key_bins == 0) return fail(dyad::Status(DYAD_RC_NOCTX, "key_bins must be at least 1"));
        return init_with(std::move(cfg), reinit, dtl_comm_mode);
    });
}

}  // namespace

extern "C" {

dyad_ctx_t* dyad_ctx_get(void) {
    std::lock_guard<std::mutex> lk(g_mu);
    return g_live ? &g_ctx : nullptr;
}

void dyad_ctx_init(const dyad_dtl_comm_mode_t comm_mode, void* flux_handle) {
    dyad_rc_t rc = dyad_init_env(comm_mode, flux_handle);
    if (DYAD_IS_ERROR(rc)) DYAD_ERROR("capi", "DYAD initialisation failed: %s", dyad_last_error());
}

void dyad_ctx_fini(void) {
    dyad_finalize();
}

dyad_rc_t dyad_init_16(bool debug, bool check, bool shared_storage, bool reinit, bool async_publish,
                       bool fsync_write, unsigned int key_depth, unsigned int key_bins,
                       unsigned int service_mux, const char* kvs_namespace,
                       const char* prod_managed_path, const char* cons_managed_path,
                       bool relative_to_managed_path, const char* dtl_mode_str,
                       const dyad_dtl_comm_mode_t dtl_comm_mode, void* /*flux_handle*/) {
    return init_explicit(debug, check, shared_storage, reinit, async_publish, fsync_write,
                         key_depth, key_bins, service_mux, kvs_namespace, prod_managed_path,
                         cons_managed_path, relative_to_managed_path, dtl_mode_str, dtl_comm_mode,
                         nullptr);
}
// What binaries linked before 2026 call as dyad_init (src/libdyad.map).
__asm__(".symver dyad_init_16, dyad_init@DYAD_1");

dyad_rc_t dyad_init(bool debug, bool check, bool shared_storage, bool reinit, bool async_publish,
                    bool fsync_write, unsigned int key_depth, unsigned int key_bins,
                    unsigned int service_mux, const char* kvs_namespace,
                    const char* prod_managed_path, const char* cons_managed_path,
                    bool relative_to_managed_path, const char* dtl_mode_str,
                    const dyad_dtl_comm_mode_t dtl_comm_mode, void* /*flux_handle*/,
                    uint64_t cache_capacity_bytes, const char* cache_policy,
                    double cache_low_watermark, unsigned int cache_grace_period_sec,
                    const char* origin_path) {
    return guarded([&]() -> dyad_rc_t {
        const std::string policy = cache_policy ? cache_policy : "";
        if (cache_mode_of(policy) < 0)
            return fail(dyad::Status(
                DYAD_RC_NOCTX,
                "dyad_init: unknown cache policy '" + policy + "' (LRU, FIFO or NONE)", EINVAL));
        if (!(cache_low_watermark > 0 && cache_low_watermark <= 1))
            return fail(dyad::Status(DYAD_RC_NOCTX,
                                     "dyad_init: cache low watermark " +
                                         std::to_string(cache_low_watermark) +
                                         " is not a fraction in (0, 1] (upstream's default: 0.8)",
                                     EINVAL));
        Upstream2026 extra{cache_capacity_bytes, policy.empty() ? "LRU" : policy,
                           cache_low_watermark, static_cast<double>(cache_grace_period_sec),
                           origin_path ? origin_path : ""};
        return init_explicit(debug, check, shared_storage, reinit, async_publish, fsync_write,
                             key_depth, key_bins, service_mux, kvs_namespace, prod_managed_path,
                             cons_managed_path, relative_to_managed_path, dtl_mode_str,
                             dtl_comm_mode, &extra);
    });
}

dyad_rc_t dyad_init_env(const dyad_dtl_comm_mode_t dtl_comm_mode, void* /*flux_handle*/) {
    return guarded([&]() -> dyad_rc_t {
        auto cfg = dyad::Config::from_env();
        if (!cfg) {
            DYAD_ERROR("capi", "%s", cfg.status().to_string().c_str());
            return fail(cfg.status());
        }
        bool reinit = cfg->reinit;
        return init_with(std::move(cfg.value()), reinit, dtl_comm_mode);
    });
}

dyad_rc_t dyad_set_prod_path(const char* path) {
    return guarded([&]() -> dyad_rc_t {
        return reconfigure("dyad_set_prod_path", [&](dyad::Config& c, dyad_dtl_comm_mode_t&) {
            c.prod_path = path ? path : "";
            return dyad::Status::ok();
        });
    });
}

dyad_rc_t dyad_set_cons_path(const char* path) {
    return guarded([&]() -> dyad_rc_t {
        return reconfigure("dyad_set_cons_path", [&](dyad::Config& c, dyad_dtl_comm_mode_t&) {
            c.cons_path = path ? path : "";
            return dyad::Status::ok();
        });
    });
}

dyad_rc_t dyad_set_and_init_dtl_mode(const char* dtl_mode_name,
                                     dyad_dtl_comm_mode_t dtl_comm_mode) {
    return guarded([&]() -> dyad_rc_t {
        return reconfigure(
            "dyad_set_and_init_dtl_mode",
            [&](dyad::Config& c, dyad_dtl_comm_mode_t& mode) -> dyad::Status {
                if (dtl_comm_mode < DYAD_COMM_NONE || dtl_comm_mode >= DYAD_COMM_END)
                    return dyad::Status(DYAD_RC_BAD_COMM_MODE,
                                        "dyad_set_and_init_dtl_mode: invalid comm mode", EINVAL);
                if (!dtl_mode_name || !*dtl_mode_name)
                    return dyad::Status(DYAD_RC_BADDTLMODE,
                                        "dyad_set_and_init_dtl_mode: no transport named", EINVAL);
                auto m = dyad::dtl::canonical_mode(dtl_mode_name);
                if (!m) return m.status();
                c.dtl_mode = m.value();
                mode = dtl_comm_mode;
                return dyad::Status::ok();
            });
    });
}

dyad_rc_t dyad_clear(void) {
    std::unique_ptr<State> st;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        st.reset(state());  // in-flight calls keep their own reference to the client
        g_ctx = dyad_ctx_default;
        g_ctx.initialized = false;
        g_ctx.reenter = false;
    }
    dyad::Status q = finish_publisher(st.get());
    return q ? ok() : fail(q);
}

dyad_rc_t dyad_finalize(void) {
    std::unique_ptr<State> st;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        st.reset(state());
        g_ctx = dyad_ctx_default;
        g_ctx.initialized = false;
        g_live = false;
    }
    // DYAD_ASYNC_PUBLISH: the queue drains (DYAD_ASYNC_PUBLISH_TIMEOUT);
    // what failed or was left is this call's error.
    dyad::Status q = finish_publisher(st.get());
    return q ? ok() : fail(q);
}

const char* dyad_last_error(void) {
    return t_last_error.c_str();
}

dyad_rc_t dyad_produce(dyad_ctx_t* ctx, const char* fname) {
    return guarded([&]() -> dyad_rc_t {
        dyad_rc_t rc;
        auto c = client_of(ctx, &rc);
        if (!c) return rc;
        if (!fname || !*fname)
            return fail(dyad::Status(DYAD_RC_BADFIO, "dyad_produce: empty file name"));
        if (c->producer_dir().empty())
            return fail(dyad::Status(DYAD_RC_BADMANAGEDPATH,
                                     "dyad_produce: no producer directory (DYAD_PATH_PRODUCER)"));
        if (!c->producer_upath(fname)) {  // unmanaged: nothing to do, as in DYAD
            note_unmanaged(g_warned_unmanaged_produce, "dyad_produce", fname, c->producer_dir(),
                           "DYAD_PATH_PRODUCER");
            return ok();
        }
        auto q = publisher_of();  // DYAD_ASYNC_PUBLISH: queued, published by its thread
        dyad::Status s = q ? q->enqueue(fname) : c->produce(fname);
        if (!s) return fail(s);
        learn_rank(c);
        if (c->config().check) setenv("DYAD_SYNC_HEALTH", "ok", 1);
        return ok();
    });
}

dyad_rc_t dyad_get_metadata(dyad_ctx_t* ctx, const char* fname, bool should_wait,
                            dyad_metadata_t** mdata) {
    return guarded([&]() -> dyad_rc_t {
        dyad_rc_t rc;
        auto c = client_of(ctx, &rc);
        if (!c) return rc;
        if (!fname || !*fname)
            return fail(dyad::Status(DYAD_RC_BADFIO, "dyad_get_metadata: empty file name"));
        if (!mdata) return fail(dyad::Status(DYAD_RC_BADBUF, "dyad_get_metadata: mdata is NULL"));
        auto r = c->get_metadata(fname, should_wait);
        if (!r) return fail(r.status());
        learn_rank(c);
        auto* m = static_cast<dyad_metadata_t*>(std::calloc(1, sizeof(dyad_metadata_t)));
        if (!m) return fail(dyad::Status(DYAD_RC_SYSFAIL, "out of memory", ENOMEM));
        m->fpath = dup_str(r->upath);
        m->owner_rank = r->owner_rank();
        m->owner_service = dup_str(r->owner);
        m->record = dup_str(r->to_json().dump(-1, ' ', false, dyad::kBadUtf8Replaced));
        m->owner_node = dup_str(r->node);
        m->size = r->size;
        m->mtime_ns = r->mtime_ns;
        m->generation = r->generation;
        {
            std::lock_guard<std::mutex> lk(g_md_mu);
            g_owned.insert(m);
        }
        if (!m->fpath || !m->owner_service || !m->owner_node || !m->record) {
            dyad_free_metadata(&m);
            return fail(dyad::Status(DYAD_RC_SYSFAIL, "out of memory", ENOMEM));
        }
        *mdata = m;
        return ok();
    });
}

dyad_rc_t dyad_free_metadata(dyad_metadata_t** mdata) {
    if (!mdata || !*mdata) return DYAD_RC_OK;
    {
        std::lock_guard<std::mutex> lk(g_md_mu);
        if (g_owned.erase(*mdata) == 0)
            return fail(dyad::Status(DYAD_RC_BADBUF,
                                     "dyad_free_metadata: this metadata was not allocated by "
                                     "dyad_get_metadata (or was freed already); left alone"));
    }
    std::free((*mdata)->fpath);
    std::free((*mdata)->owner_service);
    std::free((*mdata)->owner_node);
    std::free((*mdata)->record);
    std::free(*mdata);
    *mdata = nullptr;
    return ok();
}

dyad_rc_t dyad_consume(dyad_ctx_t* ctx, const char* fname) {
    return guarded([&]() -> dyad_rc_t {
        dyad_rc_t rc;
        auto c = client_of(ctx, &rc);
        if (!c) return rc;
        if (!fname || !*fname)
            return fail(dyad::Status(DYAD_RC_BADFIO, "dyad_consume: empty file name"));
        if (c->consumer_dir().empty())
            return fail(dyad::Status(DYAD_RC_BADMANAGEDPATH,
                                     "dyad_consume: no consumer directory (DYAD_PATH_CONSUMER)"));
        if (!c->consumer_upath(fname)) {  // unmanaged: nothing to do, as in DYAD
            note_unmanaged(g_warned_unmanaged_consume, "dyad_consume", fname, c->consumer_dir(),
                           "DYAD_PATH_CONSUMER");
            return ok();
        }
        dyad::Status s = c->consume(fname);
        if (!s) return fail(s);
        learn_rank(c);
        if (c->config().check) setenv("DYAD_SYNC_HEALTH", "ok", 1);
        return ok();
    });
}

dyad_rc_t dyad_consume_range(dyad_ctx_t* ctx, const char* fname, size_t offset, size_t length,
                             void** data, size_t* data_len) {
    // Outputs cleared first (as upstream), and set only on success.
    if (data) *data = nullptr;
    if (data_len) *data_len = 0;
    return guarded([&]() -> dyad_rc_t {
        static const char* kWhat = "dyad_consume_range";
        dyad_rc_t rc;
        auto c = client_of(ctx, &rc);
        if (!c) return rc;
        if (!data || !data_len)
            return fail(dyad::Status(DYAD_RC_BADBUF,
                                     std::string(kWhat) + ": data and data_len must not be NULL",
                                     EINVAL));
        if (!fname || !*fname)
            return fail(
                dyad::Status(DYAD_RC_BADFIO, std::string(kWhat) + ": empty file name", EINVAL));
        if (c->consumer_dir().empty())
            return fail(dyad::Status(
                DYAD_RC_BADMANAGEDPATH,
                std::string(kWhat) + ": no consumer directory (DYAD_PATH_CONSUMER)", EINVAL));
        // Unlike dyad_consume, a path outside the directory is an error
        // (there are no bytes to return), as in upstream DYAD.
        if (!c->consumer_upath(fname))
            return fail(dyad::Status(DYAD_RC_BADMANAGEDPATH,
                                     std::string(kWhat) + ": '" + fname + "' is not under " +
                                         c->consumer_dir().path() + " (DYAD_PATH_CONSUMER)",
                                     EINVAL));
        auto r = c->consume_range(fname, offset, length);
        if (!r) return fail(r.status());
        learn_rank(c);
        *data_len = r->size;
        *data = r->data.release();
        return ok();
    });
}

dyad_rc_t dyad_consume_range_into(dyad_ctx_t* ctx, const char* fname, size_t offset, size_t length,
                                  void* buf, size_t* data_len) {
    if (data_len) *data_len = 0;
    return guarded([&]() -> dyad_rc_t {
        static const char* kWhat = "dyad_consume_range_into";
        dyad_rc_t rc;
        auto c = client_of(ctx, &rc);
        if (!c) return rc;
        if ((!buf && length > 0) || !data_len)
            return fail(dyad::Status(DYAD_RC_BADBUF,
                                     std::string(kWhat) + ": buf and data_len must not be NULL",
                                     EINVAL));
        if (!fname || !*fname)
            return fail(
                dyad::Status(DYAD_RC_BADFIO, std::string(kWhat) + ": empty file name", EINVAL));
        if (c->consumer_dir().empty() || !c->consumer_upath(fname))
            return fail(dyad::Status(DYAD_RC_BADMANAGEDPATH,
                                     std::string(kWhat) + ": '" + fname +
                                         "' is not under the consumer directory "
                                         "(DYAD_PATH_CONSUMER)",
                                     EINVAL));
        char none = 0;  // length 0 with no buffer
        auto r =
            c->consume_range(fname, offset, length, nullptr, buf ? static_cast<char*>(buf) : &none);
        if (!r) return fail(r.status());
        *data_len = r->size;
        return ok();
    });
}

dyad_rc_t dyad_consume_w_metadata(dyad_ctx_t* ctx, const char* fname,
                                  const dyad_metadata_t* mdata) {
    return guarded([&]() -> dyad_rc_t {
        static const char* kWhat = "dyad_consume_w_metadata";
        dyad_rc_t rc;
        auto c = client_of(ctx, &rc);
        if (!c) return rc;
        if (!fname || !*fname)
            return fail(dyad::Status(DYAD_RC_BADFIO, std::string(kWhat) + ": empty file name"));
        if (!mdata) return ok();  // NULL means local, as in DYAD
        auto upath = c->consumer_upath(fname);
        if (!upath) return ok();
        dyad::client::Record rec;
        std::string record_json;
        uint64_t generation = 0;
        bool ours = false;
        {
            std::lock_guard<std::mutex> lk(g_md_mu);
            if (g_owned.count(mdata) && mdata->record) {
                ours = true;
                record_json = mdata->record;
                generation = mdata->generation;
            }
        }
        if (ours) {
            auto r = dyad::client::Record::from_json(record_json, generation);
            if (!r) return fail(r.status());
            rec = std::move(r.value());
        } else {
            // Metadata the caller built (the original's two fields, as Python
            // code does with ctypes): read those two only, trust neither.
            struct {
                const char* fpath;
                uint32_t owner_rank;
            } head;
            static_assert(sizeof head == 16 || sizeof(void*) != 8, "original layout");
            if (!read_memory(&head, mdata, sizeof head))
                return fail(dyad::Status(DYAD_RC_BADBUF,
                                         std::string(kWhat) + ": the metadata pointer for " +
                                             fname + " does not point to readable memory",
                                         EFAULT));
            auto fp = read_cstring(head.fpath, PATH_MAX);
            if (!fp)
                return fail(dyad::Status(
                    DYAD_RC_BADMETADATA,
                    std::string(kWhat) + ": the metadata's fpath for " + fname +
                        " is not a readable string (set it to the path relative to the "
                        "managed directory)",
                    EINVAL));
            std::optional<std::string> given;
            if (!fp->empty() && fp->front() == '/') {
                given = c->consumer_upath(*fp);
            } else {
                auto n = dyad::normalize_upath(*fp);
                if (n) given = n.value();
            }
            if (!given || *given != *upath)
                return fail(dyad::Status(DYAD_RC_BADMETADATA,
                                         std::string(kWhat) + ": the metadata is for '" + *fp +
                                             "', not for '" + *upath + "' (" + fname + ")",
                                         EINVAL));
            auto r = c->get_metadata(fname, true);
            if (!r) return fail(r.status());
            if (r->owner_rank() != head.owner_rank)
                DYAD_DEBUG("capi", "%s: %s is owned by rank %u, not %u as the metadata says", kWhat,
                           upath->c_str(), r->owner_rank(), head.owner_rank);
            rec = std::move(r.value());
        }
        dyad::Status s = c->consume_with(fname, rec);
        if (!s) return fail(s);
        learn_rank(c);
        if (c->config().check) setenv("DYAD_SYNC_HEALTH", "ok", 1);
        return ok();
    });
}

dyad_rc_t dyad_consume_many(dyad_ctx_t* ctx, const char* const* fnames, size_t count,
                            unsigned int window, dyad_rc_t* rcs, dyad_consume_done_fn done,
                            void* arg) {
    return guarded([&]() -> dyad_rc_t {
        static const char* kWhat = "dyad_consume_many";
        dyad_rc_t rc;
        auto c = client_of(ctx, &rc);
        if (!c) return rc;
        if (count && !fnames)
            return fail(dyad::Status(DYAD_RC_BADFIO, std::string(kWhat) + ": fnames is NULL"));
        if (count && c->consumer_dir().empty())
            return fail(
                dyad::Status(DYAD_RC_BADMANAGEDPATH,
                             std::string(kWhat) + ": no consumer directory (DYAD_PATH_CONSUMER)"));
        // Unmanaged paths: nothing to do, as dyad_consume. Empty names fail.
        std::vector<dyad::Status> status(count);
        std::vector<std::string> paths;
        std::vector<size_t> index;  // of each path in fnames
        for (size_t i = 0; i < count; ++i) {
            if (!fnames[i] || !*fnames[i]) {
                status[i] =
                    dyad::Status(DYAD_RC_BADFIO, std::string(kWhat) + ": empty file name (entry " +
                                                     std::to_string(i) + ")");
                if (done) done(arg, i, status[i].rc(), status[i].to_string().c_str());
                continue;
            }
            if (!c->consumer_upath(fnames[i])) {
                if (done) done(arg, i, DYAD_RC_OK, nullptr);
                continue;
            }
            paths.emplace_back(fnames[i]);
            index.push_back(i);
        }
        dyad::client::ConsumeManyOptions o;
        o.window = window;
        o.done = [&](size_t k, const dyad::Status& s, const dyad::client::ConsumeReport&) {
            status[index[k]] = s;
            if (done) done(arg, index[k], s.rc(), s ? nullptr : s.to_string().c_str());
        };
        c->consume_many(paths, o);
        size_t failed = 0;
        const dyad::Status* first = nullptr;
        for (size_t i = 0; i < count; ++i) {
            if (rcs) rcs[i] = status[i].rc();
            if (!status[i]) {
                ++failed;
                if (!first) first = &status[i];
            }
        }
        if (!first) {
            learn_rank(c);
            if (c->config().check) setenv("DYAD_SYNC_HEALTH", "ok", 1);
            return ok();
        }
        return fail(dyad::Status(first->rc(),
                                 std::to_string(failed) + " of " + std::to_string(count) +
                                     " files not consumed; the first: " + first->message(),
                                 first->err()));
    });
}

}  // extern "C"
