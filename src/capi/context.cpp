// SPDX-License-Identifier: Apache-2.0
// The C API's context: dyad_init and its variants, reconfiguration,
// finalize (state.hpp says what the state is; calls.cpp has the calls over
// it). No exception crosses this boundary.
//
// The context is one static object with the original DYAD's layout
// (include/dyad/core/dyad_ctx.h): its address never changes, its public
// fields mirror the configuration in effect, and this implementation's state
// (the client, the strings the fields point to) hangs off `h`.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <pthread.h>
#include <unordered_set>

#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_consume_many.h>
#include <dyad/core/dyad_ctx.h>

#include "state.hpp"

#include "common/keygen.hpp"
#include "common/log.hpp"

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

namespace dyad::capi {

std::mutex g_mu;
struct dyad_ctx g_ctx = dyad_ctx_default;  // under g_mu
bool g_live = false;                       // dyad_ctx_get returns &g_ctx
std::mutex g_md_mu;
std::unordered_set<const dyad_metadata_t*> g_owned;

namespace {

thread_local std::string t_last_error;

// Drains and closes a context's publish queue before the context goes.
Status finish_publisher(State* st) {
    if (!st || !st->publisher) return Status::ok();
    return st->publisher->finish();
}

uint32_t hash32(const std::string& s) {
    if (s.empty()) return 0;
    uint64_t h[2];
    murmur3_x64_128(s.data(), s.size(), 0x44594144u, h);
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
    const Config& c = st.cfg;
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
    std::string pr = c.prod_path.empty() ? "" : ManagedDir(c.prod_path).path();
    std::string cr = c.cons_path.empty() ? "" : ManagedDir(c.cons_path).path();
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

}  // namespace

State* state() {
    return static_cast<State*>(g_ctx.h);
}

dyad_rc_t fail(const Status& s) {
    t_last_error = s.to_string();
    return s.rc();
}

dyad_rc_t ok() {
    t_last_error.clear();
    return DYAD_RC_OK;
}

// Keeps the client alive for the duration of one call even if another
// thread finalises meanwhile.
std::shared_ptr<client::Client> client_of(dyad_ctx_t* ctx, dyad_rc_t* rc) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!ctx || ctx != &g_ctx || !g_live || !g_ctx.initialized || !state()) {
        *rc = fail(Status(DYAD_RC_NOCTX,
                          "DYAD is not initialised: call dyad_init or dyad_init_env first"));
        return nullptr;
    }
    if (!state()->client) {
        *rc =
            fail(Status(DYAD_RC_NOCTX,
                        "DYAD is inert: neither DYAD_PATH_PRODUCER nor DYAD_PATH_CONSUMER is set"));
        return nullptr;
    }
    // A queued publish that failed since the last call is this call's
    // error; the call itself is not carried out (docs/user-guide.md).
    if (state()->publisher) {
        if (Status e = state()->publisher->take_failures(); !e) {
            *rc = fail(e.wrap("this call was not carried out (call it again)"));
            return nullptr;
        }
    }
    return state()->client;
}

// The publish queue of the context (DYAD_ASYNC_PUBLISH), or null.
std::shared_ptr<client::PublishQueue> publisher_of() {
    std::lock_guard<std::mutex> lk(g_mu);
    return g_live && state() ? state()->publisher : nullptr;
}

// This node's rank is its service's: ask it once (the answer is cached by
// the client). Unknown while the service cannot be reached.
void learn_rank(const std::shared_ptr<client::Client>& c) {
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

namespace {

// Replaces the context's state by one built from `cfg` (under g_mu). On
// failure the context is left as it was.
dyad_rc_t install(Config cfg, dyad_dtl_comm_mode_t comm_mode, bool keep_rank) {
    auto st = std::make_unique<State>();
    st->comm_mode = comm_mode;
    if (cfg.prod_path.empty() && cfg.cons_path.empty()) {
        DYAD_WARN("capi",
                  "neither DYAD_PATH_PRODUCER nor DYAD_PATH_CONSUMER is set: DYAD stays inert");
    } else {
        auto c = client::Client::create(cfg);
        if (!c) {
            DYAD_ERROR("capi", "dyad_init: %s", c.status().to_string().c_str());
            return fail(c.status());
        }
        st->client = std::move(c.value());
        if (cfg.async_publish && !cfg.prod_path.empty()) {
            auto o = client::PublishQueue::Options::from_settings();
            if (!o) return fail(o.status());
            st->publisher = client::PublishQueue::create(st->client, std::move(o.value()));
        }
    }
    st->cfg = std::move(cfg);
    // The old context's queued publishes go out first (failures logged).
    if (Status q = finish_publisher(state()); !q)
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

dyad_rc_t init_with(Config cfg, bool reinit, dyad_dtl_comm_mode_t comm_mode) {
    static std::once_flag atfork_once;
    std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, after_fork_child); });
    std::shared_ptr<client::Client> c;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (g_live && g_ctx.initialized && state() && !reinit) return ok();
        log::set_level(cfg.log_level);
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
        return fail(Status(DYAD_RC_NOCTX, std::string(what) +
                                              ": DYAD is not initialised: call dyad_init "
                                              "or dyad_init_env first"));
    Config cfg = state()->cfg;
    dyad_dtl_comm_mode_t mode = state()->comm_mode;
    Status s = change(cfg, mode);
    if (!s) return fail(s);
    return install(std::move(cfg), mode, true);
}

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
            return fail(Status(DYAD_RC_BAD_COMM_MODE, "invalid comm mode"));
        if ((prod_managed_path && !*prod_managed_path) ||
            (cons_managed_path && !*cons_managed_path))
            return fail(Status(DYAD_RC_BADMANAGEDPATH, "a managed path is the empty string"));
        // Settings the API does not take (service URI, timeouts) come from the environment.
        auto base = Config::from_env();
        Config cfg = base ? base.value() : Config();
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
        if (debug && cfg.log_level > log::Level::debug) cfg.log_level = log::Level::debug;
        if (dtl_mode_str && *dtl_mode_str) {
            auto m = dtl::canonical_mode(dtl_mode_str);
            if (!m) return fail(m.status());
            cfg.dtl_mode = m.value();
        }
        if (key_bins == 0) return fail(Status(DYAD_RC_NOCTX, "key_bins must be at least 1"));
        return init_with(std::move(cfg), reinit, dtl_comm_mode);
    });
}

}  // namespace
}  // namespace dyad::capi

using namespace dyad::capi;

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

}  // extern "C"
