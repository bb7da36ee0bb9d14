// The C API: DYAD's names and return codes over dyad::client::Client.
// No exception crosses this boundary.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <pthread.h>

#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>

#include "client.hpp"
#include "common/log.hpp"

struct dyad_ctx {
    std::shared_ptr<dyad::client::Client> client;  // null: inert (no managed path)
    dyad_dtl_comm_mode_t comm_mode = DYAD_COMM_RECV;
};

namespace {

std::mutex g_mu;
dyad_ctx* g_ctx = nullptr;
thread_local std::string t_last_error;

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
    if (!ctx || ctx != g_ctx) {
        *rc = fail(dyad::Status(DYAD_RC_NOCTX,
                                "DYAD is not initialised: call dyad_init or dyad_init_env first"));
        return nullptr;
    }
    if (!ctx->client) {
        *rc = fail(dyad::Status(
            DYAD_RC_NOCTX,
            "DYAD is inert: neither DYAD_PATH_PRODUCER nor DYAD_PATH_CONSUMER is set"));
        return nullptr;
    }
    return ctx->client;
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

// A forked child (DataLoader workers, multiprocessing) must not share the
// parent's sockets.
void after_fork_child() {
    new (&g_mu) std::mutex();  // a parent thread may have held it at fork time
    if (g_ctx && g_ctx->client) g_ctx->client->reset_after_fork();
}

dyad_rc_t init_with(dyad::Config cfg, bool reinit, dyad_dtl_comm_mode_t comm_mode) {
    static std::once_flag atfork_once;
    std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, after_fork_child); });
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_ctx && !reinit) return ok();
    dyad::log::set_level(cfg.log_level);
    auto ctx = std::make_unique<dyad_ctx>();
    ctx->comm_mode = comm_mode;
    if (cfg.prod_path.empty() && cfg.cons_path.empty()) {
        DYAD_WARN("capi",
                  "neither DYAD_PATH_PRODUCER nor DYAD_PATH_CONSUMER is set: DYAD stays inert");
    } else {
        auto c = dyad::client::Client::create(std::move(cfg));
        if (!c) {
            DYAD_ERROR("capi", "dyad_init: %s", c.status().to_string().c_str());
            return fail(c.status());
        }
        ctx->client = std::move(c.value());
    }
    delete g_ctx;
    g_ctx = ctx.release();
    return ok();
}

char* dup_str(const std::string& s) {
    char* p = static_cast<char*>(std::malloc(s.size() + 1));
    if (p) std::memcpy(p, s.c_str(), s.size() + 1);
    return p;
}

}  // namespace

extern "C" {

dyad_ctx_t* dyad_ctx_get(void) {
    std::lock_guard<std::mutex> lk(g_mu);
    return g_ctx;
}

void dyad_ctx_init(const dyad_dtl_comm_mode_t comm_mode, void* flux_handle) {
    dyad_rc_t rc = dyad_init_env(comm_mode, flux_handle);
    if (DYAD_IS_ERROR(rc)) DYAD_ERROR("capi", "DYAD initialisation failed: %s", dyad_last_error());
}

void dyad_ctx_fini(void) {
    dyad_finalize();
}

dyad_rc_t dyad_init(bool debug, bool check, bool shared_storage, bool reinit, bool async_publish,
                    bool fsync_write, unsigned int key_depth, unsigned int key_bins,
                    unsigned int service_mux, const char* kvs_namespace,
                    const char* prod_managed_path, const char* cons_managed_path,
                    bool relative_to_managed_path, const char* dtl_mode_str,
                    const dyad_dtl_comm_mode_t dtl_comm_mode, void* /*flux_handle*/) {
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

dyad_rc_t dyad_finalize(void) {
    std::lock_guard<std::mutex> lk(g_mu);
    delete g_ctx;  // in-flight calls keep their own reference to the client
    g_ctx = nullptr;
    return ok();
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
        if (!c->producer_upath(fname)) return ok();  // unmanaged: nothing to do, as in DYAD
        dyad::Status s = c->produce(fname);
        if (!s) return fail(s);
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
        auto* m = static_cast<dyad_metadata_t*>(std::calloc(1, sizeof(dyad_metadata_t)));
        if (!m) return fail(dyad::Status(DYAD_RC_SYSFAIL, "out of memory", ENOMEM));
        m->fpath = dup_str(r->upath);
        m->owner_rank = r->owner_rank();
        m->owner_service = dup_str(r->owner);
        m->record = dup_str(r->to_json().dump());
        m->owner_node = dup_str(r->node);
        m->size = r->size;
        m->mtime_ns = r->mtime_ns;
        m->generation = r->generation;
        if (!m->fpath || !m->owner_service || !m->owner_node || !m->record) {
            dyad_free_metadata(&m);
            return fail(dyad::Status(DYAD_RC_SYSFAIL, "out of memory", ENOMEM));
        }
        *mdata = m;
        return ok();
    });
}

dyad_rc_t dyad_free_metadata(dyad_metadata_t** mdata) {
    if (mdata && *mdata) {
        std::free((*mdata)->fpath);
        std::free((*mdata)->owner_service);
        std::free((*mdata)->owner_node);
        std::free((*mdata)->record);
        std::free(*mdata);
        *mdata = nullptr;
    }
    return DYAD_RC_OK;
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
        if (!c->consumer_upath(fname)) return ok();  // unmanaged: nothing to do, as in DYAD
        dyad::Status s = c->consume(fname);
        if (!s) return fail(s);
        if (c->config().check) setenv("DYAD_SYNC_HEALTH", "ok", 1);
        return ok();
    });
}

dyad_rc_t dyad_consume_w_metadata(dyad_ctx_t* ctx, const char* fname,
                                  const dyad_metadata_t* mdata) {
    return guarded([&]() -> dyad_rc_t {
        dyad_rc_t rc;
        auto c = client_of(ctx, &rc);
        if (!c) return rc;
        if (!fname || !*fname)
            return fail(dyad::Status(DYAD_RC_BADFIO, "dyad_consume_w_metadata: empty file name"));
        if (!mdata) return ok();  // NULL means local, as in DYAD
        if (!c->consumer_upath(fname)) return ok();
        if (!mdata->record)
            return fail(
                dyad::Status(DYAD_RC_BADMETADATA,
                             "dyad_consume_w_metadata: metadata not from dyad_get_metadata"));
        auto rec = dyad::client::Record::from_json(mdata->record, mdata->generation);
        if (!rec) return fail(rec.status());
        dyad::Status s = c->consume_with(fname, rec.value());
        if (!s) return fail(s);
        return ok();
    });
}

}  // extern "C"
