// SPDX-License-Identifier: Apache-2.0
// dyad::dyad_params: the settings dyad::dyad_stream_core::init(const
// dyad_params&) passes to dyad_init(), for programs that configure DYAD in
// code instead of through the DYAD_* environment. Member names and defaults
// are the original DYAD's; each member is the dyad_init() argument of the
// same name (see <dyad/core/dyad_ctx.h>).
//
// Settings dyad_init() does not take (the service URI, timeouts, the log
// level) still come from the environment.
#ifndef DYAD_STREAM_DYAD_PARAMS_HPP
#define DYAD_STREAM_DYAD_PARAMS_HPP

#if defined(DYAD_HAS_CONFIG)
#include <dyad/dyad_config.hpp>
#endif

#include <string>

namespace dyad {

struct dyad_params {
    /// Debug logging (as DYAD_SYNC_DEBUG).
    bool m_debug;
    /// The managed directory is on storage every node sees (DYAD_SHARED_STORAGE).
    bool m_shared_storage;
    /// Initialise DYAD again even if the process already did (DYAD_REINIT).
    bool m_reinit;
    /// Publish asynchronously (DYAD_ASYNC_PUBLISH).
    bool m_async_publish;
    /// fsync a produced file before publishing it (DYAD_FSYNC_WRITE).
    bool m_fsync_write;
    /// Depth of the key hierarchy (DYAD_KEY_DEPTH).
    unsigned int m_key_depth;
    /// Number of bins per key level (DYAD_KEY_BINS).
    unsigned int m_key_bins;
    /// Number of services sharing node-local storage (DYAD_SERVICE_MUX).
    unsigned int m_service_mux;
    /// Transport, numbered as in the original DYAD: 0 UCX, 1 MARGO,
    /// 2 FLUX_RPC (the stream). Any other value: DYAD_DTL_MODE from the
    /// environment (default AUTO).
    int m_dtl_mode;
    /// Key namespace; empty: the namespace of the node's service.
    std::string m_kvs_namespace;
    /// Consumer-managed directory; empty: not a consumer.
    std::string m_cons_managed_path;
    /// Producer-managed directory; empty: not a producer.
    std::string m_prod_managed_path;
    /// A relative path names a file relative to the managed directory
    /// (DYAD_PATH_RELATIVE).
    bool m_relative_to_managed_path;

    dyad_params()
        : m_debug(false),
          m_shared_storage(false),
          m_reinit(false),
          m_async_publish(false),
          m_fsync_write(false),
          m_key_depth(2u),
          m_key_bins(256u),
          m_service_mux(1u),
          m_dtl_mode(0),
          m_kvs_namespace(),
          m_cons_managed_path(),
          m_prod_managed_path(),
          m_relative_to_managed_path(false) {}
};

}  // namespace dyad

#endif  // DYAD_STREAM_DYAD_PARAMS_HPP
