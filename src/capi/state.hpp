// SPDX-License-Identifier: Apache-2.0
// The C API's state, shared by its two parts: the context (context.cpp:
// init, reconfiguration, finalize) and the calls over it (calls.cpp:
// produce, metadata, consume). The context is one static object with the
// original DYAD's layout (include/dyad/core/dyad_ctx.h): its address never
// changes, its public fields mirror the configuration in effect, and this
// implementation's state (the client, the strings the fields point to)
// hangs off `h`. Nothing here is exported (src/libdyad.map).
#pragma once

#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>

#include "client/client.hpp"
#include "client/publish_queue.hpp"
#include "common/config.hpp"
#include "common/status.hpp"

namespace dyad::capi {

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

extern std::mutex g_mu;
extern struct dyad_ctx g_ctx;  // under g_mu
extern bool g_live;            // dyad_ctx_get returns &g_ctx
// Metadata this library allocated (dyad_get_metadata), and so may read in
// full and free; anything else passed in is the caller's.
extern std::mutex g_md_mu;
extern std::unordered_set<const dyad_metadata_t*> g_owned;

State* state();
// The call's error: kept for dyad_last_error, its code returned.
dyad_rc_t fail(const Status& s);
dyad_rc_t ok();
// Keeps the client alive for the duration of one call even if another
// thread finalises meanwhile; null (and *rc) if there is none.
std::shared_ptr<client::Client> client_of(dyad_ctx_t* ctx, dyad_rc_t* rc);
// The publish queue of the context (DYAD_ASYNC_PUBLISH), or null.
std::shared_ptr<client::PublishQueue> publisher_of();
// This node's rank is its service's: ask it once (the answer is cached by
// the client). Unknown while the service cannot be reached.
void learn_rank(const std::shared_ptr<client::Client>& c);

// No exception crosses the C API: f(), or the exception as an error.
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

}  // namespace dyad::capi
