// SPDX-License-Identifier: Apache-2.0
#include "client.hpp"
#include "wait_notice.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <new>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <csignal>
#include <future>
#include <mutex>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include <thread>

#include "common/checksum.hpp"
#include "common/keygen.hpp"
#include "common/log.hpp"
#include "common/settings.hpp"
#include "fetch_channel.hpp"
#include "kvs/outage.hpp"
#include "proto/hello.hpp"
#include "proto/publish.hpp"
#include "trace_points.hpp"

namespace dyad::client {

thread_local double t_connect_limit = 0;

namespace {

constexpr const char* kSub = "client";
constexpr double kControlTimeout = 30.0;  // connect, put, status
// Seconds between looks for the new produce of a file changed since its
// produce (consume_record): at first, and at most.
constexpr double kStalePollFirst = 0.01;
constexpr double kStalePollMax = 1.0;
std::string seconds_text(std::optional<double> s) {
    if (!s) return "inf";
    char b[32];
    std::snprintf(b, sizeof b, "%g", *s);
    return b;
}

double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The cause of a connection failure, in a few words: "connection refused",
// "no answer to the hello within 2.5 s: ...".
std::string cause_of(const Status& e) {
    const std::string& m = e.message();
    if (rpc::Connection::not_dyad(e)) {
        // "... did not answer like a DYAD service (WHY)": WHY.
        const std::string mark = " did not answer like a DYAD service (";
        size_t at = m.find(mark);
        size_t close = m.rfind(')');
        if (at != std::string::npos && close != std::string::npos && close > at + mark.size())
            return m.substr(at + mark.size(), close - at - mark.size());
        return m;
    }
    if (e.rc() == DYAD_RC_CONNFAIL && e.err() == ECONNRESET) return "it closed the connection";
    if (e.rc() == DYAD_RC_CONNFAIL && e.err() != 0 &&
        m.find("cannot resolve") == std::string::npos) {
        std::string t = std::strerror(e.err());
        if (!t.empty()) t[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(t[0])));
        return t;
    }
    return e.to_string();
}

// A failed connection to a DYAD service at `uri`: nothing there, something
// that is not a dyadd, a refusal. `advice` says what to do when nothing
// answers.
Status unreachable(const std::string& uri, const Status& e, const std::string& advice) {
    // Refused with the service's reason (no key, too many connections of
    // this peer): that reason is what to say.
    if (e.rc() == DYAD_RC_NOAUTH || e.err() == EUSERS) {
        // Its message names the service already ("service at URI ..."):
        // said once, as the DYAD service.
        const std::string& m = e.message();
        if (m.rfind("service at " + uri, 0) == 0) return Status(e.rc(), "DYAD " + m, e.err());
        return Status(e).wrap("DYAD service at " + uri);
    }
    if (rpc::Connection::not_dyad(e))
        return Status(DYAD_RC_CONNFAIL,
                      e.message() + ": " + advice +
                          " (tcp://HOST:PORT of its --listen, or unix:PATH of its --socket)",
                      e.err());
    if (e.rc() == DYAD_RC_CONNFAIL)
        return Status(
            DYAD_RC_CONNFAIL,
            "cannot reach the DYAD service at " + uri + " (" + cause_of(e) + "): " + advice,
            e.err());
    return Status(DYAD_RC_CONNFAIL, "the DYAD service at " + uri + ": " + e.message(), e.err());
}

// A service address that cannot be one (another scheme, no port, a port out
// of range): a configuration error that says what an address looks like.
// `what`: where it came from ("DYAD_SERVICE_URI", "--uri").
Status check_service_uri(const std::string& uri, const std::string& what) {
    auto u = rpc::parse_uri(uri);
    std::string why;
    if (!u) {
        // "bad service URI 'X': WHY (use ...)": WHY.
        const std::string& m = u.status().message();
        size_t at = m.find("': ");
        size_t end = m.rfind(" (use ");
        why = at != std::string::npos && end != std::string::npos && end > at + 3
                  ? m.substr(at + 3, end - at - 3)
                  : m;
    } else if (!u->is_unix && u->port == 0) {
        why = "port 0";
    } else {
        return Status::ok();
    }
    return Status(DYAD_RC_NOCTX,
                  what + " '" + uri + "' is not a DYAD service address (" + why +
                      "): it must be unix:PATH (the service's --socket) or tcp://HOST:PORT (its "
                      "--listen, port 1-65535)",
                  EINVAL);
}

}  // namespace

// ---- Client ----

Client::Client(Config cfg, FileSystem& fs, rpc::Credentials creds)
    : cfg_(std::move(cfg)),
      prod_(cfg_.prod_path),
      cons_(cfg_.cons_path),
      cstore_(cons_.path(), fs, cfg_.fsync_write),
      origin_(cfg_.path_origin),
      cache_(cfg_, cons_.empty() ? "" : cons_.path(), prod_.empty() ? "" : prod_.path(),
             [this](const std::string& up) { return cstore_.try_lock(up); }),
      creds_(std::move(creds)),
      pool_(std::make_shared<rpc::ConnectionPool>(creds_, idle_per_owner())) {}

size_t Client::idle_per_owner() const {
    // Every fetch of a full window from one owner finds an idle connection
    // on its next file instead of connecting again.
    return std::max<size_t>(8, cfg_.consume_window);
}

Result<std::unique_ptr<Client>> Client::create(Config cfg, FileSystem* fs) {
    trace::start_from_settings();  // DYAD_TRACE: once per process
    const dtl::Backend* fixed = nullptr;
    auto mode = dtl::canonical_mode(cfg.dtl_mode);
    if (!mode) return mode.status();
    cfg.dtl_mode = mode.value();
    if (cfg.dtl_mode != dtl::kAutoMode) {
        auto b = dtl::find_backend(cfg.dtl_mode);
        if (!b) return b.status();
        fixed = b.value();
    }
    if (cfg.key_bins == 0) return Status(DYAD_RC_NOCTX, "DYAD_KEY_BINS must be at least 1", EINVAL);
    if (Status cs = check_cache_settings(cfg); !cs) return cs;
    auto creds = rpc::Credentials::from_settings();
    if (!creds) return creds.status();
    std::unique_ptr<Client> c(
        new Client(std::move(cfg), fs ? *fs : FileSystem::real(), std::move(creds.value())));
    c->backend_ = fixed;
    // A consumer usually starts before its data exists: set the transport up
    // now rather than on the first fetch. A fixed transport that cannot work
    // here is an error now, not a wait for files it could never move. AUTO
    // warms nothing up: a transport is set up when first chosen (UCX's
    // context holds sockets and a shared-memory window that every forked
    // worker would inherit, and libfabric's providers take 0.2 s to load),
    // and most files never need one; one that cannot work is left out.
    if (fixed && !c->cons_.empty())
        if (Status w = dtl::prepare_fixed_mode(*fixed); !w) return w;
    return c;
}

std::optional<std::string> Client::consumer_upath(const std::string& path) const {
    return cons_.relative(path, cfg_.relative_to_managed_path);
}
std::optional<std::string> Client::producer_upath(const std::string& path) const {
    return prod_.relative(path, cfg_.relative_to_managed_path);
}

namespace {
// A managed path's relative part, refused under the reserved directory.
Status reserved_check(const std::optional<std::string>& up) {
    if (!up) return Status::ok();
    auto n = normalize_upath(*up);
    return n ? Status::ok() : n.status();
}
// Refuses a file that another process still has open for writing: its
// record would describe a size and checksum the file no longer has once the
// writer goes on. A read lease is refused (EAGAIN) while any descriptor of
// the file is open for writing (or mapped shared and writable), and is
// released at once. Where leases cannot be taken (a file system without
// them: EINVAL; leases disabled: ENOLCK; a file this user does not own:
// EACCES) the check is skipped, said at debug level.
Status refuse_if_being_written(const std::string& full) {
    UniqueFd fd(::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!fd.valid()) return Status::ok();  // the service's checks say why
    struct stat sb;
    if (::fstat(fd.get(), &sb) != 0 || !S_ISREG(sb.st_mode)) return Status::ok();
    // A writer opening the file in the instant the lease is held breaks it,
    // and the kernel signals the lease holder (SIGIO by default, which
    // would end this process): SIGURG's default action is to ignore it.
    if (::fcntl(fd.get(), F_SETSIG, SIGURG) != 0) {
        DYAD_DEBUG(kSub, "'%s': cannot tell whether it is open for writing (F_SETSIG: %s)",
                   full.c_str(), std::strerror(errno));
        return Status::ok();
    }
    if (::fcntl(fd.get(), F_SETLEASE, F_RDLCK) == 0) {
        ::fcntl(fd.get(), F_SETLEASE, F_UNLCK);
        return Status::ok();
    }
    int e = errno;
    if (e == EAGAIN || e == EBUSY)
        return Status(DYAD_RC_BADFIO,
                      "cannot produce '" + full +
                          "': another process still has it open for writing; publish it once "
                          "the writer has closed it (its record would describe a file that is "
                          "still changing)",
                      EBUSY);
    DYAD_DEBUG(kSub,
               "'%s': cannot tell whether another process has it open for writing (read lease: "
               "%s): published without that check",
               full.c_str(), std::strerror(e));
    return Status::ok();
}

}  // namespace

namespace {
// What a wait for a produce is shown as (wait_notice.hpp): the file, the
// service, and what ends it.
std::string waiting_for(const std::string& upath, const ServiceInfo& svc, const ManagedDir& cons,
                        const Config& cfg) {
    return "'" + upath + "'" + (cons.empty() ? "" : " (" + cons.join(upath) + ")") +
           " to be produced, looked up through service " + svc.id + " on node " + svc.node +
           " at " + cfg.service_uri;
}
std::string waiting_limit(const Config& cfg) {
    return cfg.wait_timeout
               ? "gives up after " + seconds_text(cfg.wait_timeout) + " s (DYAD_WAIT_TIMEOUT)"
               : "no time limit (DYAD_WAIT_TIMEOUT unset): is the name right ('dyad "
                 "ls' lists what was produced)?";
}
Result<kvs::Entry> wait_visibly(kvs::Store& st, const std::string& nspace, const std::string& key,
                                Deadline deadline, const std::string& what,
                                const std::string& limit) {
    WaitNotice notice(what, limit);
    return st.wait(nspace, key, deadline);
}
}  // namespace

Deadline Client::wait_deadline() const {
    return cfg_.wait_timeout ? Deadline::after(*cfg_.wait_timeout) : Deadline::never();
}

std::string Client::key_of(const std::string& upath) const {
    auto k = gen_path_key(upath, cfg_.key_depth, cfg_.key_bins);
    return k ? k.value() : upath;
}

void Client::reset_after_fork() {
    // Another thread of the parent may have held the lock at fork time; in
    // the child that thread does not exist, so start from a fresh mutex.
    new (&mu_) std::mutex();
    // Sockets shared with the parent must not carry the child's requests:
    // the old pool closes the child's copies (its destructor takes no lock).
    pool_ = std::make_shared<rpc::ConnectionPool>(creds_, idle_per_owner());
    store_.reset();
    svc_.reset();
}

Result<ServiceInfo> Client::service() {
    std::lock_guard<std::mutex> lk(mu_);
    if (svc_) return *svc_;
    if (Status u = check_service_uri(cfg_.service_uri, "DYAD_SERVICE_URI"); !u) return u;
    auto c = rpc::Connection::connect(cfg_.service_uri, Deadline::after(kControlTimeout), creds_);
    if (!c)
        return unreachable(cfg_.service_uri, c.status(),
                           rpc::Connection::not_dyad(c.status())
                               ? "set DYAD_SERVICE_URI to the address of this node's dyadd"
                               : "start dyadd on this node, or set DYAD_SERVICE_URI to its "
                                 "address");
    auto hello = proto::Hello::parse(c.value()->peer_info());
    if (!hello) return Status(hello.status()).wrap(cfg_.service_uri);
    const proto::Identity& h = hello->service;
    ServiceInfo s{h.service_id,
                  h.node,
                  h.ns,
                  h.producer_dir,
                  h.kvs,
                  h.endpoints,
                  h.rank.value_or(UINT32_MAX),
                  c.value()->peer_info()};
    std::string kvs_uri = hello->store_here() ? cfg_.service_uri : s.kvs;
    store_ = std::make_unique<kvs::RpcStore>(kvs_uri, pool_);
    pool_->put(std::move(c.value()));
    svc_ = s;
    return s;
}

std::string Client::store_uri(const ServiceInfo& svc) const {
    return svc.kvs == proto::kStoreHere ? cfg_.service_uri : svc.kvs;
}

Status Client::store_failure(const Status& e, const ServiceInfo& svc) const {
    if (e.rc() != DYAD_RC_CONNFAIL) return e;
    // The node's service says its store (etcd) is down: its message names
    // the store, since when and why.
    if (kvs::Outage::unreachable(e)) return e;
    const std::string retried = "; DYAD retried until the wait's deadline (DYAD_WAIT_TIMEOUT)";
    const bool until_deadline = e.message().find(retried) != std::string::npos;
    std::string uri = store_uri(svc);
    std::string what = svc.kvs == proto::kStoreHere
                           ? "the node's service (" + svc.id + ") hosts it: is it stopping?"
                           : "start the dyadd that hosts it (the one started without --kvs), or "
                             "correct --kvs of this node's dyadd (" +
                                 svc.id + ")";
    // Under the Slurm plugin the job's services are not the user's to restart.
    if (settings::text("DYAD_JOB_MANAGER") == "slurm")
        what = svc.kvs.rfind("etcd://", 0) == 0
                   ? "the site's store of this cluster is down: tell its administrators"
                   : "it was in the dyadd of the job's first node, which Slurm started "
                     "(--dyad) and which no longer answers: files already consumed stay, new "
                     "ones cannot be published or found in this job. Submit the job again, or "
                     "start a DYAD of your own in it: eval \"$(dyad job start --job-id "
                     "$SLURM_JOB_ID.2)\" (and `dyad job stop --job-id $SLURM_JOB_ID.2` at its "
                     "end)";
    return Status(DYAD_RC_CONNFAIL,
                  "the metadata store at " + uri + " is unreachable (" + cause_of(e) +
                      "): " + what + (until_deadline ? retried : std::string()),
                  e.err());
}

bool Client::reached_service() {
    std::lock_guard<std::mutex> lk(mu_);
    return svc_.has_value();
}

Result<kvs::Store*> Client::store() {
    auto s = service();
    if (!s) return s.status();
    std::lock_guard<std::mutex> lk(mu_);
    return store_.get();
}

std::string Client::ns(const ServiceInfo& svc) const {
    return cfg_.kvs_namespace.empty() ? svc.ns : cfg_.kvs_namespace;
}

Status Client::produce(const std::string& path) {
    trace::Span sp("produce", "client");
    sp.arg("path", path);
    if (prod_.empty())
        return Status(
            DYAD_RC_BADMANAGEDPATH,
            "cannot produce '" + path + "': no producer directory (set DYAD_PATH_PRODUCER)",
            EINVAL);
    auto up = producer_upath(path);
    if (!up && canonical_path(path) == prod_.path())
        return Status(DYAD_RC_UNTRACKED,
                      "'" + path + "' is the producer directory itself (DYAD_PATH_PRODUCER): " +
                          "produce the files in it ('dyad produce -r " + path +
                          "' publishes every one)",
                      EINVAL);
    if (!up)
        return Status(DYAD_RC_UNTRACKED,
                      "'" + path + "' is not inside the producer directory " + prod_.path() +
                          " (DYAD_PATH_PRODUCER): only files under it can be produced",
                      EINVAL);
    if (Status r = reserved_check(up); !r) return r;
    auto svc = service();
    if (!svc) return svc.status();
    if (canonical_path(svc->producer_dir) != prod_.path())
        return Status(DYAD_RC_BADMANAGEDPATH,
                      "DYAD_PATH_PRODUCER (" + prod_.path() +
                          ") is not the directory the node's service (" + svc->id + ") serves (" +
                          svc->producer_dir + "): use the same directory for both",
                      EINVAL);
    std::string full = prod_.join(up.value());
    if (Status w = refuse_if_being_written(full); !w) return w;
    if (cfg_.fsync_write) {
        UniqueFd fd(::open(full.c_str(), O_RDONLY | O_CLOEXEC));
        if (fd.valid()) ::fsync(fd.get());
    }
    // The service checks the file and writes the record as its owner:
    // clients never write the store (docs/security.md).
    proto::PublishRequest req;
    req.upath = up.value();
    req.ns = ns(svc.value());
    req.key_depth = cfg_.key_depth;
    req.key_bins = cfg_.key_bins;
    // A file this node consumed and now publishes as its own (pydyad's r+):
    // it replaces, knowingly, the version it consumed; the store refuses it
    // if that version is no longer current (docs/security.md).
    if (auto from = installed_from(full); from && from->owner != svc->id)
        req.replaces = from->generation;
    if (cfg_.replicas) req.replicas = *cfg_.replicas;
    req.replicas_sync = cfg_.replicas_sync;
    bool connect_failed = false;
    trace::Span publishing("publish", "client");
    // DYAD_REPLICAS_SYNC: the answer waits for the copies (each a transfer).
    const double limit = kControlTimeout + (cfg_.replicas_sync ? 16 * cfg_.transfer_timeout : 0.0);
    const Deadline until = Deadline::after(limit);
    // Over the Unix socket the open file goes with the request: it proves
    // this process's user may open it (a keyless node-wide service requires
    // it of users other than its own; docs/security.md, "The node-wide service").
    UniqueFd proof(::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    auto v = pool_->call(cfg_.service_uri, "dyad.publish", req.build(), until, 0, false,
                         &connect_failed, nullptr, rpc::kMaxMeta, proof.get());
    // The service's metadata store is down: asked again until the deadline
    // (a restart of etcd takes seconds), then its error, naming the store.
    for (double pause = 0.05;
         !v && !connect_failed && kvs::Outage::unreachable(v.status()) && until.remaining() > pause;
         pause = std::min(pause * 2, 1.0)) {
        if (pause == 0.05)
            DYAD_WARN(kSub, "publishing '%s' waits for the metadata store: %s", full.c_str(),
                      v.status().message().c_str());
        std::this_thread::sleep_for(std::chrono::duration<double>(pause));
        v = pool_->call(cfg_.service_uri, "dyad.publish", req.build(), until, 0, false,
                        &connect_failed, nullptr, rpc::kMaxMeta, proof.get());
    }
    if (publishing.active()) trace_publish(publishing, up.value(), v);
    sp.fail(v.status());
    if (!v && !connect_failed && kvs::Outage::unreachable(v.status()))
        return Status(v.status().rc(),
                      "cannot publish '" + full + "': " + v.status().message() +
                          "; DYAD retried for " + seconds_text(kControlTimeout) + " s",
                      v.status().err());
    if (!v && connect_failed)
        return Status(DYAD_RC_CONNFAIL, "cannot publish '" + full + "': " + v.status().to_string(),
                      v.status().err());
    if (!v) {
        Status e = v.status();
        return Status(e.rc() == DYAD_RC_BADRPC ? DYAD_RC_BADCOMMIT : e.rc(),
                      "cannot publish '" + full + "': " + e.message(), e.err());
    }
    // Published: no longer a cache copy, never evicted (cache.hpp).
    if (auto cu = cons_.empty() ? std::nullopt : consumer_upath(full)) cache_.forget(*cu);
    auto answer = proto::PublishAnswer::parse(v.value());
    if (sp.active() && answer) trace_produced(sp, up.value(), answer.value());
    if (v->is_object() && v->contains("replicas_warning") && (*v)["replicas_warning"].is_string())
        DYAD_WARN(kSub, "'%s': %s", full.c_str(),
                  (*v)["replicas_warning"].get<std::string>().c_str());
    DYAD_DEBUG(kSub, "produced %s as %s (generation %llu)", up->c_str(),
               answer ? answer->key.c_str() : "",
               static_cast<unsigned long long>(answer ? answer->version : 0));
    return Status::ok();
}

Result<Record> Client::get_metadata(const std::string& path, bool should_wait) {
    return lookup(path, should_wait, wait_deadline());
}

Result<std::string> Client::consumer_relative(const std::string& path) const {
    if (cons_.empty())
        return Status(DYAD_RC_BADMANAGEDPATH, "no consumer directory (set DYAD_PATH_CONSUMER)",
                      EINVAL);
    auto up = consumer_upath(path);
    if (!up && canonical_path(path) == cons_.path())
        return Status(DYAD_RC_UNTRACKED,
                      "'" + path + "' is the consumer directory itself (DYAD_PATH_CONSUMER): " +
                          "give a file in it",
                      EINVAL);
    if (!up)
        return Status(DYAD_RC_UNTRACKED,
                      "'" + path + "' is not inside the consumer directory " + cons_.path() +
                          " (DYAD_PATH_CONSUMER): give a path under it",
                      EINVAL);
    if (Status r = reserved_check(up); !r) return r;
    return std::move(up.value());
}

Result<Record> Client::lookup(const std::string& path, bool should_wait, Deadline deadline) {
    auto up = consumer_relative(path);
    if (!up) return up.status();
    if (should_wait && origin_.enabled()) return lookup_with_origin(up.value(), deadline);
    return lookup_upath(up.value(), should_wait, deadline);
}

Result<Record> Client::stat(const std::string& path) {
    auto up = cons_.empty() ? std::nullopt : consumer_upath(path);
    if (!up && !prod_.empty()) up = producer_upath(path);
    if (!up) {
        std::string dirs;
        if (!cons_.empty())
            dirs = "the consumer directory " + cons_.path() + " (DYAD_PATH_CONSUMER)";
        if (!prod_.empty())
            dirs += (dirs.empty() ? "" : " nor ") + std::string("the producer directory ") +
                    prod_.path() + " (DYAD_PATH_PRODUCER)";
        if (dirs.empty())
            return Status(DYAD_RC_BADMANAGEDPATH,
                          "no managed directory: set DYAD_PATH_CONSUMER or DYAD_PATH_PRODUCER",
                          EINVAL);
        return Status(DYAD_RC_UNTRACKED,
                      "'" + path + "' is not inside " + dirs + ": give a path under it", EINVAL);
    }
    if (Status r = reserved_check(up); !r) return r;
    return lookup_upath(up.value(), false, Deadline::after(kControlTimeout));
}

Result<Record> Client::lookup_upath(const std::string& upath, bool should_wait, Deadline deadline) {
    const std::optional<std::string> up = upath;
    auto key = gen_path_key(up.value(), cfg_.key_depth, cfg_.key_bins);
    if (!key) return key.status();
    auto svc = service();
    if (!svc) return svc.status();
    auto st = store();
    if (!st) return st.status();
    // A wait whose deadline passed already looks once.
    bool look_once = should_wait && deadline.expired();
    trace::Span sp(should_wait && !look_once ? "wait-for-create" : "lookup", "client");
    sp.arg("path", upath).arg("key", key.value());
    auto e = should_wait && !look_once
                 ? wait_visibly(*st.value(), ns(svc.value()), key.value(), deadline,
                                waiting_for(upath, svc.value(), cons_, cfg_), waiting_limit(cfg_))
                 : st.value()->get(ns(svc.value()), key.value(), Deadline::after(kControlTimeout));
    sp.fail(e.status());
    if (!e) {
        Status s = e.status();
        if (look_once && s.rc() == DYAD_RC_NOTFOUND) s = Status(DYAD_RC_TIMEOUT, "", ETIMEDOUT);
        if (s.rc() == DYAD_RC_TIMEOUT && should_wait)
            return Status(DYAD_RC_TIMEOUT,
                          "'" + up.value() + "' was not produced within " +
                              seconds_text(cfg_.wait_timeout) +
                              " s (DYAD_WAIT_TIMEOUT): produce it first, or wait longer "
                              "(DYAD_WAIT_TIMEOUT=SECONDS; unset: wait forever)",
                          ETIMEDOUT);
        if (s.rc() == DYAD_RC_NOTFOUND)
            return Status(DYAD_RC_NOTFOUND, "'" + up.value() + "' has not been produced (yet)",
                          ENOENT);
        if (s.rc() == DYAD_RC_CONNFAIL) return store_failure(s, svc.value());
        return s.wrap("metadata of '" + up.value() + "'");
    }
    auto r = Record::from_json(e->value, e->version);
    if (!r) return r.status();
    if (sp.active()) trace_record(sp, r.value(), key.value());
    if (r->upath != up.value())
        return Status(DYAD_RC_BADMETADATA,
                      "metadata under key " + key.value() + " names '" + r->upath + "', not '" +
                          up.value() +
                          "': producer and consumer use different DYAD_KEY_DEPTH/BINS?",
                      EPROTO);
    return r;
}

Status Client::consume(const std::string& path, ConsumeReport* report) {
    trace::Span sp("consume", "client");
    ConsumeReport local;
    ConsumeReport* rep = report ? report : &local;
    auto t0 = std::chrono::steady_clock::now();
    const Deadline deadline = wait_deadline();
    auto rec = get_metadata(path, true);
    Status s = rec.status();
    if (rec) {
        rep->wait_s = since(t0);
        s = consume_record(path, std::move(rec.value()), rep, deadline);
    }
    if (sp.active()) trace_consume(sp, path, *rep, s);
    return s;
}

Status Client::consume_record(const std::string& path, Record rec, ConsumeReport* report,
                              Deadline deadline) {
    return retry_stale(path, std::move(rec), deadline,
                       [&](const Record& r) { return consume_once(path, r, report, deadline); });
}

Status Client::retry_stale(const std::string& path, Record rec, Deadline deadline,
                           const std::function<Status(const Record&)>& once) {
    Status s = once(rec);
    // ESTALE: the file is no longer the one the record describes.
    // - Produced again since the lookup: looked up again and fetched, a few
    //   times at most; a file that keeps being produced again is reported.
    // - Changed since its produce, not produced again (yet): its producer is
    //   writing it again, and the consumer waits for that produce as it
    //   waits for a first one, until DYAD_WAIT_TIMEOUT (looking again every
    //   10 ms at first, then less often, up to every second). A producer
    //   that rewrites a file and produces it again must not make the
    //   consumers that come in between fail (docs/design.md, "Produced
    //   again").
    double pause = kStalePollFirst;
    for (int again = 0; !s && s.err() == ESTALE;) {
        auto fresh = get_metadata(path, false);
        if (!fresh) break;
        if (fresh->generation == rec.generation) {
            if (deadline.expired())
                return Status(s.rc(),
                              s.message() + "; it was not produced again within " +
                                  seconds_text(cfg_.wait_timeout) + " s (DYAD_WAIT_TIMEOUT)",
                              s.err());
            std::this_thread::sleep_for(
                std::chrono::duration<double>(std::min(pause, deadline.remaining())));
            pause = std::min(kStalePollMax, pause * 2);
            continue;
        }
        if (++again > 3) break;
        rec = std::move(fresh.value());
        s = once(rec);
    }
    return s;
}

Status Client::consume_with(const std::string& path, const Record& rec, ConsumeReport* report) {
    trace::Span sp("consume", "client");
    ConsumeReport local;
    ConsumeReport* rep = report ? report : &local;
    Status s = consume_record(path, rec, rep, wait_deadline());
    if (sp.active()) trace_consume(sp, path, *rep, s);
    return s;
}

Status Client::consume_once(const std::string& path, const Record& rec, ConsumeReport* report,
                            Deadline deadline) {
    auto up = consumer_relative(path);
    if (!up) return up.status();
    // A record is only ever the record of its own path (consume_w_metadata
    // with another file's record must not fetch that other file).
    if (rec.upath != up.value())
        return Status(DYAD_RC_BADMETADATA,
                      "the metadata given is that of '" + rec.upath + "', not of '" + up.value() +
                          "': refused",
                      EINVAL);
    auto svc = service();
    if (!svc) return svc.status();
    auto t0 = std::chrono::steady_clock::now();
    ConsumeReport local;
    ConsumeReport* rep = report ? report : &local;
    if (!settled(up.value(), rec, svc.value(), rep)) {
        Status s = under_lock(up.value(), rec, deadline, rep, [&](int lock_fd) {
            return fetch(up.value(), rec, svc.value(), rep, lock_fd);
        });
        if (!s) return s;
    }
    rep->transfer_s = since(t0);
    return Status::ok();
}

Result<nlohmann::json> Client::owner_info(const std::string& owner, const ServiceInfo& svc) {
    if (owner == svc.id) return svc.raw;
    {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = owners_.find(owner);
        if (it != owners_.end()) return it->second;
    }
    auto st = store();
    if (!st) return st.status();
    auto e = st.value()->get(kvs::kServicesNamespace, owner, Deadline::after(kControlTimeout));
    if (!e) return e.status();
    auto j = nlohmann::json::parse(e->value, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        return Status(DYAD_RC_BADMETADATA, "registry entry of service " + owner + " is not JSON",
                      EPROTO);
    std::lock_guard<std::mutex> lk(mu_);
    owners_[owner] = j;
    return j;
}

bool Client::owner_registered(const std::string& owner) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        owners_.erase(owner);
        plans_.clear();
    }
    auto st = store();
    if (!st) return true;
    auto e = st.value()->get(kvs::kServicesNamespace, owner, Deadline::after(kControlTimeout));
    return e || e.status().rc() != DYAD_RC_NOTFOUND;
}

std::vector<const dtl::Backend*> Client::plan(const Record& rec, const ServiceInfo& svc,
                                              ConsumeReport* rep) {
    std::vector<const dtl::Backend*> out;
    if (backend_) {
        out.push_back(backend_);
        return out;
    }
    const auto key = std::make_pair(rec.owner, rec.size);
    {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = plans_.find(key);
        if (it != plans_.end()) {
            rep->explain = it->second.explain;
            rep->selection = it->second.selection;
            return it->second.order;
        }
    }
    std::vector<dtl::TransportRecord> records;
    dtl::Placement where;
    where.same_node = rec.node == svc.node;
    auto info = owner_info(rec.owner, svc);
    if (info) {
        where.same_host =
            info->value("host_id", std::string()) == dtl::host_id() && !dtl::host_id().empty();
        if (info->contains("transports") && (*info)["transports"].is_array())
            for (const auto& t : (*info)["transports"]) {
                auto r = dtl::TransportRecord::from_json(t);
                if (r) records.push_back(std::move(r.value()));
            }
    }
    std::vector<std::string> mine;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (const auto& b : dtl::backends())
            if (!unusable_.count(b.name)) mine.push_back(b.name);
    }
    dtl::Selection sel = dtl::select_transport(rec.size, where, records, mine);
    rep->explain = sel.explain();
    if (!info) rep->explain += "\n  (owner's records unavailable: " + info.status().message() + ")";
    rep->selection = std::make_shared<const nlohmann::json>(sel.to_json());
    DYAD_DEBUG(kSub, "%s: %s", rec.upath.c_str(), rep->explain.c_str());
    for (const auto& name : sel.order) {
        auto b = dtl::find_backend(name);
        if (b) out.push_back(b.value());
    }
    // Services that publish no records (older ones) all serve the stream.
    if (out.empty()) {
        const dtl::Backend& u = dtl::universal_backend();
        out.push_back(&u);
        rep->explain += "\n  no scored transport usable: " + u.name;
    }
    if (info) {
        std::lock_guard<std::mutex> lk(mu_);
        if (plans_.size() >= 4096) plans_.clear();
        plans_[key] = {out, rep->explain, rep->selection};
    }
    return out;
}

std::string Client::owner_endpoint(const Record& rec, const ServiceInfo& svc) const {
    std::string tcp;
    for (const auto& e : rec.endpoints)
        if (e.rfind("tcp://", 0) == 0) {
            tcp = e;
            break;
        }
    if (rec.node == svc.node)
        for (const auto& e : rec.endpoints) {
            if (e.rfind("unix:", 0) != 0) continue;
            // A socket this process may not connect to (its mode follows the
            // service's --allow-uid): the owner's TCP endpoint instead.
            const std::string path = e.substr(5);
            if (tcp.empty() || ::access(path.c_str(), R_OK | W_OK) == 0 || errno != EACCES)
                return e;
            static std::mutex noted_mu;
            static std::set<std::string> noted;
            std::lock_guard<std::mutex> lk(noted_mu);
            if (noted.size() < 64 && noted.insert(path).second)
                DYAD_WARN(kSub,
                          "cannot use the Unix socket %s of service %s (permission denied: its "
                          "dyadd admits other users with --allow-uid): using %s instead",
                          path.c_str(), rec.owner.c_str(), tcp.c_str());
            return tcp;
        }
    return tcp;
}

Status Client::fetch_owner(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                           ConsumeReport* rep, int lock_fd) {
    Status s;
    const std::string ep = owner_endpoint(rec, svc);
    if (ep.empty())
        return Status(DYAD_RC_BADMETADATA,
                      "metadata of '" + upath + "' lists no reachable endpoint", EHOSTUNREACH);
    rep->endpoint = ep;
    Status last;
    nlohmann::json fell_back = nlohmann::json::array();
    for (const dtl::Backend* b : plan(rec, svc, rep)) {
        bool retry = false;
        s = fetch_via(*b, upath, rec, ep, ns(svc), rep, lock_fd, &retry);
        if (s && !fell_back.empty() && rep->selection) {
            // AUTO chose a transport that could not start here: the report's
            // selection says which one moved the file, and why not the others.
            auto sel = std::make_shared<nlohmann::json>(*rep->selection);
            (*sel)["used"] = b->name;
            (*sel)["fell_back_from"] = std::move(fell_back);
            rep->selection = std::move(sel);
        }
        if (s || !retry || backend_) return s;
        // This transport could not start here: note it, take the next one.
        DYAD_DEBUG(kSub, "%s could not move '%s' (%s): trying the next transport", b->name.c_str(),
                   upath.c_str(), s.to_string().c_str());
        rep->explain += "\n  " + b->name + " failed to start: " + s.message();
        fell_back.push_back({{"transport", b->name}, {"error", s.message()}});
        last = s;
    }
    return last;
}

Status Client::fetch_via(const dtl::Backend& b, const std::string& upath, const Record& rec,
                         const std::string& ep, const std::string& nspace, ConsumeReport* rep,
                         int lock_fd, bool* retry) {
    rep->transport = b.name;
    return stage_commit(upath, rec, lock_fd, rep, [&](FileSink& sink) -> Result<nlohmann::json> {
        if (rep->progress) {
            auto t0 = std::chrono::steady_clock::now();
            sink.on_progress(
                [cb = rep->progress, t0, total = rec.size](uint64_t bytes) {
                    cb(TransferProgress{bytes, total, since(t0)});
                },
                rep->progress_interval_s);
        }
        return receive_via(
            b, request_of(upath, rec, nspace), rec, ep, sink, [&sink] { return sink.bytes(); },
            retry);
    });
}

Result<nlohmann::json> Client::receive_via(const dtl::Backend& b, proto::FetchRequest req,
                                           const Record& rec, const std::string& ep,
                                           dtl::Sink& sink,
                                           const std::function<uint64_t()>& received, bool* retry) {
    const std::string& upath = req.upath;
    auto recv = b.make_receiver();
    if (!recv) {
        *retry = true;
        if (!backend_) {
            std::lock_guard<std::mutex> lk(mu_);
            if (unusable_.emplace(b.name, recv.status().message()).second)
                DYAD_WARN(kSub, "%s", dtl::left_out_message(b, recv.status().message()).c_str());
            plans_.clear();
        }
        return recv.status();
    }
    // Only the record's owner may answer at its endpoint (with a key, it
    // proves it in the hello).
    // (Shorter while a replica could serve the file instead: failover.cpp.)
    const double connect_s =
        t_connect_limit > 0 ? std::min(kControlTimeout, t_connect_limit) : kControlTimeout;
    auto conn = pool_->get(ep, Deadline::after(connect_s), rec.owner);
    if (!conn) {
        if (!owner_registered(rec.owner))
            return Status(DYAD_RC_CONNFAIL,
                          "the service " + rec.owner + " that produced '" + upath +
                              "' is gone: it is no longer registered in the metadata store (it "
                              "stopped, or its lease ran out). Start it again on its node (its "
                              "records are served again if the files are unchanged), or produce "
                              "the file elsewhere",
                          EHOSTDOWN);
        return Status(DYAD_RC_CONNFAIL,
                      "cannot reach the service " + rec.owner + " that owns '" + upath + "' at " +
                          ep + ": " + conn.status().to_string(),
                      conn.status().err());
    }
    nlohmann::json args = recv.value()->describe();
    req.transport = b.name;
    req.build_into(args);
    RpcFetchChannel ch(*conn.value(), cfg_.transfer_timeout);
    Status opened = ch.open(args, Deadline::after(kControlTimeout));
    if (!opened) return opened.wrap("fetch of '" + upath + "' from " + ep);
    auto trailer = recv.value()->receive(ch, sink);
    if (!trailer) {
        Status e = trailer.status();
        // Nothing arrived, and the failure is the transport's own (the
        // service does not serve it, or LOCAL reached it over TCP, where no
        // file descriptor can pass): another transport may work.
        *retry = received() == 0 && (e.rc() == DYAD_RC_BADDTLMODE ||
                                     std::find(b.start_errnos.begin(), b.start_errnos.end(),
                                               e.err()) != b.start_errnos.end());
        return Status(
            e.rc() == DYAD_RC_CONNFAIL ? DYAD_RC_BADFETCH : e.rc(),
            "fetch of '" + upath + "' from " + rec.owner + " (" + ep + ") failed: " + e.message(),
            e.err());
    }
    if (ch.ended()) pool_->put(std::move(conn.value()));
    return trailer;
}

Result<nlohmann::json> Client::service_status(const std::string& uri) {
    std::string u = uri.empty() ? cfg_.service_uri : uri;
    if (Status bad = check_service_uri(u, uri.empty() ? "DYAD_SERVICE_URI" : "--uri"); !bad)
        return bad;
    bool connect_failed = false;
    auto r = pool_->call(u, "dyad.status", nlohmann::json::object(),
                         Deadline::after(kControlTimeout), 0, true, &connect_failed);
    if (!r && connect_failed)
        return unreachable(u, r.status(),
                           uri.empty() ? "start dyadd on this node, or set DYAD_SERVICE_URI to its "
                                         "address"
                                       : "check the address");
    return r;
}

}  // namespace dyad::client
