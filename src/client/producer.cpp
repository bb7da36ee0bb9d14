// SPDX-License-Identifier: Apache-2.0
// The producer (producer.hpp): dyad.publish and dyad.unpublish of the
// producer directory's files, with their checks and errors.
#include "producer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>

#include "common/fd.hpp"
#include "common/log.hpp"
#include "common/seconds.hpp"
#include "consumer_store.hpp"
#include "kvs/outage.hpp"
#include "lookup.hpp"
#include "timeouts.hpp"
#include "trace_points.hpp"

namespace dyad::client {

namespace {

constexpr const char* kSub = "client";

// Refuses a file that another process still has open for writing: its
// record would describe a size and checksum the file no longer has once the
// writer goes on. A read lease is refused (EAGAIN) while any descriptor of
// the file is open for writing (or mapped shared and writable), and is
// released at once. Where leases cannot be taken (a file system without
// them: EINVAL; leases disabled: ENOLCK; a file this user does not own:
// EACCES) the check is skipped, said at debug level. `fd`: the file, open
// for reading (invalid: nothing to check; the service's checks say why).
Status refuse_if_being_written(const UniqueFd& fd, const std::string& full) {
    if (!fd.valid()) return Status::ok();
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

Result<std::string> Producer::relative(const std::string& path, const char* verb) const {
    const std::string v = verb;
    if (prod_.empty())
        return Status(
            DYAD_RC_BADMANAGEDPATH,
            "cannot " + v + " '" + path + "': no producer directory (set DYAD_PATH_PRODUCER)",
            EINVAL);
    auto up = prod_.relative(path, cfg_.relative_to_managed_path);
    if (!up && canonical_path(path) == prod_.path())
        return Status(DYAD_RC_UNTRACKED,
                      "'" + path + "' is the producer directory itself (DYAD_PATH_PRODUCER): " + v +
                          " the files in it" +
                          (v == "produce" ? " ('dyad produce -r " + path + "' publishes every one)"
                                          : std::string()),
                      EINVAL);
    if (!up)
        return Status(DYAD_RC_UNTRACKED,
                      "'" + path + "' is not inside the producer directory " + prod_.path() +
                          " (DYAD_PATH_PRODUCER): only files under it can be " + v + "d",
                      EINVAL);
    if (Status r = reserved_check(up); !r) return r;
    return std::move(up.value());
}

Status Producer::produce(const std::string& path) {
    trace::Span sp("produce", "client");
    sp.arg("path", path);
    auto up = relative(path, "produce");
    if (!up) return up.status();
    auto svc = link_.service();
    if (!svc) return svc.status();
    if (svc->producer_dir_canonical != prod_.path())
        return Status(DYAD_RC_BADMANAGEDPATH,
                      "DYAD_PATH_PRODUCER (" + prod_.path() +
                          ") is not the directory the node's service (" + svc->id + ") serves (" +
                          svc->producer_dir + "): use the same directory for both",
                      EINVAL);
    std::string full = prod_.join(up.value());
    // One open serves the writers' check, DYAD_FSYNC_WRITE and the proof
    // that goes with the request (publish()): the file a link in the
    // directory names, as the service opens it.
    UniqueFd file(::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    if (Status w = refuse_if_being_written(file, full); !w) return w;
    if (cfg_.fsync_write && file.valid()) ::fsync(file.get());
    bool connect_failed = false;
    trace::Span publishing("publish", "client");
    auto v = publish(request(up.value(), full, svc.value()), full, file, &connect_failed);
    if (publishing.active()) trace_publish(publishing, up.value(), v);
    sp.fail(v.status());
    if (!v) return publish_failure(v.status(), connect_failed, full);
    // Published: no longer a cache copy, never evicted (cache.hpp).
    if (auto cu =
            cons_.empty() ? std::nullopt : cons_.relative(full, cfg_.relative_to_managed_path))
        cache_.forget(*cu);
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

proto::PublishRequest Producer::request(const std::string& upath, const std::string& full,
                                        const ServiceInfo& svc) const {
    proto::PublishRequest req;
    req.upath = upath;
    req.ns = link_.ns(svc);
    req.key_depth = cfg_.key_depth;
    req.key_bins = cfg_.key_bins;
    // A file this node consumed and now publishes as its own (pydyad's r+):
    // it replaces, knowingly, the version it consumed; the store refuses it
    // if that version is no longer current (docs/security.md).
    if (auto from = installed_from(full); from && from->owner != svc.id)
        req.replaces = from->generation;
    if (cfg_.replicas) req.replicas = *cfg_.replicas;
    req.replicas_sync = cfg_.replicas_sync;
    return req;
}

Result<nlohmann::json> Producer::publish(const proto::PublishRequest& req, const std::string& full,
                                         const UniqueFd& proof, bool* connect_failed) {
    // DYAD_REPLICAS_SYNC: the answer waits for the copies (each a transfer).
    const double limit =
        timeouts::kControl + (cfg_.replicas_sync ? 16 * cfg_.transfer_timeout : 0.0);
    const Deadline until = Deadline::after(limit);
    // Over the Unix socket the open file goes with the request: it proves
    // this process's user may open it (a keyless node-wide service requires
    // it of users other than its own; docs/security.md, "The node-wide service").
    auto v = link_.pool().call(cfg_.service_uri, "dyad.publish", req.build(), until, 0, false,
                               connect_failed, nullptr, rpc::kMaxMeta, proof.get());
    // The service's metadata store is down: asked again until the deadline
    // (a restart of etcd takes seconds), then its error, naming the store.
    for (double pause = 0.05; !v && !*connect_failed && kvs::Outage::unreachable(v.status()) &&
                              until.remaining() > pause;
         pause = std::min(pause * 2, 1.0)) {
        if (pause == 0.05)
            DYAD_WARN(kSub, "publishing '%s' waits for the metadata store: %s", full.c_str(),
                      v.status().message().c_str());
        std::this_thread::sleep_for(std::chrono::duration<double>(pause));
        v = link_.pool().call(cfg_.service_uri, "dyad.publish", req.build(), until, 0, false,
                              connect_failed, nullptr, rpc::kMaxMeta, proof.get());
    }
    return v;
}

Status Producer::publish_failure(const Status& e, bool connect_failed,
                                 const std::string& full) const {
    if (!connect_failed && kvs::Outage::unreachable(e))
        return Status(e.rc(),
                      "cannot publish '" + full + "': " + e.message() + "; DYAD retried for " +
                          seconds_text(timeouts::kControl) + " s",
                      e.err());
    if (connect_failed)
        return Status(DYAD_RC_CONNFAIL, "cannot publish '" + full + "': " + e.to_string(), e.err());
    return Status(e.rc() == DYAD_RC_BADRPC ? DYAD_RC_BADCOMMIT : e.rc(),
                  "cannot publish '" + full + "': " + e.message(), e.err());
}

Status Producer::unpublish(const std::string& path) {
    auto up = relative(path, "unpublish");
    if (!up) return up.status();
    auto svc = link_.service();
    if (!svc) return svc.status();
    proto::UnpublishRequest req;
    req.upath = up.value();
    req.ns = link_.ns(svc.value());
    req.key_depth = cfg_.key_depth;
    req.key_bins = cfg_.key_bins;
    bool connect_failed = false;
    auto v = link_.pool().call(cfg_.service_uri, "dyad.unpublish", req.build(),
                               Deadline::after(timeouts::kControl), 0, false, &connect_failed);
    if (!v && connect_failed)
        return Status(DYAD_RC_CONNFAIL,
                      "cannot unpublish '" + path + "': " + v.status().to_string(),
                      v.status().err());
    if (!v) {
        Status e = v.status();
        return Status(e.rc(), "cannot unpublish '" + path + "': " + e.message(), e.err());
    }
    DYAD_DEBUG(kSub, "unpublished %s", up->c_str());
    return Status::ok();
}

}  // namespace dyad::client
