// SPDX-License-Identifier: Apache-2.0
// dyad::dyad_stream_core: the DYAD side of the C++ file streams
// (<dyad/stream/dyad_stream_api.hpp>), usable on its own: consume a file
// before opening it for reading (open_sync), publish it after writing it
// (close_sync). The original DYAD's class and member names; implemented in
// libdyad.so over the public C API.
//
// The DYAD context is process-wide (dyad_ctx_get()); a core remembers how it
// was initialised (from the environment or from dyad_params) and what that
// said about the process's roles, and holds the result of its last call.
// Copies are independent. A core is not thread-safe; the context is.
#ifndef DYAD_STREAM_DYAD_STREAM_CORE_HPP
#define DYAD_STREAM_DYAD_STREAM_CORE_HPP

#if defined(DYAD_HAS_CONFIG)
#include <dyad/dyad_config.hpp>
#endif

#include <string>

#include <dyad/common/dyad_rc.h>
#include <dyad/stream/dyad_params.hpp>

namespace dyad {

class dyad_stream_core {
  public:
    dyad_stream_core();
    ~dyad_stream_core();
    dyad_stream_core(const dyad_stream_core&) = default;
    dyad_stream_core(dyad_stream_core&&) = default;
    dyad_stream_core& operator=(const dyad_stream_core&) = default;
    dyad_stream_core& operator=(dyad_stream_core&&) = default;

    // Initialises from the DYAD_* environment (dyad_init_env) unless this
    // core already is (reinit, or DYAD_REINIT, reads the environment again).
    // The process's context is initialised only if it does not exist yet or
    // DYAD_REINIT asks for it.
    void init(const bool reinit = false);
    // Initialises with explicit settings (dyad_init; p.m_reinit as its reinit).
    void init(const dyad_params& p);
    // Logs msg_head and this core's settings at info level (DYAD_LOG_LEVEL).
    void log_info(const std::string& msg_head) const;
    // Forgets this core's initialisation. The process's context stays: other
    // streams may be using it (dyad_finalize() tears it down).
    void finalize();

    // Whether DYAD_PATH_PRODUCER / DYAD_PATH_CONSUMER (or the dyad_params'
    // managed paths) were set when this core was initialised. Paths given
    // only in DYAD_CONFIG_FILE are not seen here; open_sync and close_sync
    // still honour them.
    bool is_dyad_producer() const;
    bool is_dyad_consumer() const;

    // Waits until `path` is produced and brings it into the consumer-managed
    // directory. True on success, and when there is nothing to do: a path
    // outside the consumer directory, or a process that is not a consumer.
    // False on a DYAD error (dyad_rc() and dyad_error() say which). A core
    // not yet initialised is initialised from the environment first.
    bool open_sync(const char* path);
    // Publishes `path` if it lies in the producer-managed directory. True on
    // success and when there is nothing to do; false on a DYAD error.
    bool close_sync(const char* path);

    void set_initialized();
    bool chk_initialized() const;

    // Whether produced files are fsync'ed before they are published
    // (DYAD_FSYNC_WRITE / m_fsync_write). close_sync does it.
    bool chk_fsync_write() const;
    // Whether `path` lies inside the producer (is_prod) or consumer managed
    // directory, as given or canonical (symbolic links resolved); if so,
    // get_upath() is then its path relative to that directory.
    bool cmp_canonical_path_prefix(bool is_prod, const char* path);
    std::string get_upath() const;

    // Whole-file locks on an open descriptor: exclusive (write) or shared
    // (read), waiting until granted; released by file_unlock or on the last
    // close of the open file. Open file description locks (F_OFD_SETLKW,
    // the kind DYAD's service takes while serving a file), or POSIX record
    // locks where the kernel has none. DYAD_RC_OK, or DYAD_RC_BADFIO with
    // errno set.
    int file_lock_exclusive(int fd) const;
    int file_lock_shared(int fd) const;
    int file_unlock(int fd) const;

    // New: the result of the last initialisation, open_sync or close_sync.
    dyad_rc_t dyad_rc() const;
    const std::string& dyad_error() const;

  private:
    void record(dyad_rc_t rc);
    bool context_ready();
    void read_env();

    bool m_initialized;
    bool m_from_params;  // initialised by init(const dyad_params&)
    bool m_is_prod;
    bool m_is_cons;
    bool m_fsync_write;
    bool m_relative;
    std::string m_prod_path;
    std::string m_cons_path;
    std::string m_upath;
    dyad_params m_params;  // for initialising the context again
    dyad_rc_t m_rc;
    std::string m_error;
};

}  // namespace dyad

#endif  // DYAD_STREAM_DYAD_STREAM_CORE_HPP
