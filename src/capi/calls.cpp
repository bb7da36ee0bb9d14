// SPDX-License-Identifier: Apache-2.0
// The C API's calls over the context (context.cpp): produce, metadata,
// consume (whole, a range, with metadata, many). No exception crosses this
// boundary; outputs are set only on success.
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <dyad/core/dyad_consume_many.h>

#include "state.hpp"

#include "common/fd.hpp"
#include "common/json_text.hpp"
#include "common/log.hpp"

namespace dyad::capi {
namespace {

using ClientPtr = std::shared_ptr<client::Client>;

// The skeleton of every call on the context's client: no exception out,
// the client kept alive for the call (or the error saying why there is
// none), then f(client).
template <typename F>
dyad_rc_t on_client(dyad_ctx_t* ctx, F&& f) {
    return guarded([&]() -> dyad_rc_t {
        dyad_rc_t rc;
        auto c = client_of(ctx, &rc);
        if (!c) return rc;
        return f(c);
    });
}

// A call that did its work: this node's rank learnt, and DYAD_SYNC_HEALTH
// set under DYAD_CHECK (as upstream).
dyad_rc_t succeeded(const ClientPtr& c) {
    learn_rank(c);
    if (c->config().check) setenv("DYAD_SYNC_HEALTH", "ok", 1);
    return ok();
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
    UniqueFd rd(p[0]), wr(p[1]);
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
                    const ManagedDir& dir, const char* var) {
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

}  // namespace
}  // namespace dyad::capi

using namespace dyad::capi;

extern "C" {

dyad_rc_t dyad_produce(dyad_ctx_t* ctx, const char* fname) {
    return on_client(ctx, [&](const ClientPtr& c) -> dyad_rc_t {
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
        return succeeded(c);
    });
}

dyad_rc_t dyad_get_metadata(dyad_ctx_t* ctx, const char* fname, bool should_wait,
                            dyad_metadata_t** mdata) {
    return on_client(ctx, [&](const ClientPtr& c) -> dyad_rc_t {
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
    return on_client(ctx, [&](const ClientPtr& c) -> dyad_rc_t {
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
        return succeeded(c);
    });
}

dyad_rc_t dyad_consume_range(dyad_ctx_t* ctx, const char* fname, size_t offset, size_t length,
                             void** data, size_t* data_len) {
    // Outputs cleared first (as upstream), and set only on success.
    if (data) *data = nullptr;
    if (data_len) *data_len = 0;
    return on_client(ctx, [&](const ClientPtr& c) -> dyad_rc_t {
        static const char* kWhat = "dyad_consume_range";
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
    return on_client(ctx, [&](const ClientPtr& c) -> dyad_rc_t {
        static const char* kWhat = "dyad_consume_range_into";
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
    return on_client(ctx, [&](const ClientPtr& c) -> dyad_rc_t {
        static const char* kWhat = "dyad_consume_w_metadata";
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
        return succeeded(c);
    });
}

dyad_rc_t dyad_consume_many(dyad_ctx_t* ctx, const char* const* fnames, size_t count,
                            unsigned int window, dyad_rc_t* rcs, dyad_consume_done_fn done,
                            void* arg) {
    return on_client(ctx, [&](const ClientPtr& c) -> dyad_rc_t {
        static const char* kWhat = "dyad_consume_many";
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
            return succeeded(c);
        }
        return fail(dyad::Status(first->rc(),
                                 std::to_string(failed) + " of " + std::to_string(count) +
                                     " files not consumed; the first: " + first->message(),
                                 first->err()));
    });
}

}  // extern "C"
