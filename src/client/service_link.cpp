// SPDX-License-Identifier: Apache-2.0
// The link to the node's service (service_link.hpp): the hello read once,
// the store it names, the connection pool, and what to say when either
// cannot be reached.
#include "service_link.hpp"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <new>

#include "common/paths.hpp"
#include "common/settings.hpp"
#include "kvs/outage.hpp"
#include "proto/hello.hpp"
#include "timeouts.hpp"

namespace dyad::client {

namespace {

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

Result<ServiceInfo> ServiceInfo::from_hello(const nlohmann::json& j) {
    auto hello = proto::Hello::parse(j);
    if (!hello) return hello.status();
    const proto::Identity& h = hello->service;
    ServiceInfo s;
    s.raw = std::make_shared<const nlohmann::json>(j);
    s.id = h.service_id;
    s.node = h.node;
    s.ns = h.ns;
    s.producer_dir = h.producer_dir;
    s.kvs = hello->store_here() ? proto::kStoreHere : h.kvs;
    s.endpoints = h.endpoints;
    s.rank = h.rank.value_or(UINT32_MAX);
    return s;
}

ServiceLink::ServiceLink(const Config& cfg, rpc::Credentials creds, size_t idle_per_uri)
    : cfg_(cfg),
      creds_(std::move(creds)),
      idle_per_uri_(idle_per_uri),
      slurm_job_(settings::text("DYAD_JOB_MANAGER") == "slurm"),
      pool_(std::make_shared<rpc::ConnectionPool>(creds_, idle_per_uri_)) {}

void ServiceLink::reset_after_fork() {
    // Another thread of the parent may have held the lock at fork time; in
    // the child that thread does not exist, so start from a fresh mutex.
    new (&mu_) std::mutex();
    // Sockets shared with the parent must not carry the child's requests:
    // the old pool closes the child's copies (its destructor takes no lock).
    pool_ = std::make_shared<rpc::ConnectionPool>(creds_, idle_per_uri_);
    store_.reset();
    svc_.reset();
}

Result<ServiceInfo> ServiceLink::service() {
    std::lock_guard<std::mutex> lk(mu_);
    if (svc_) return *svc_;
    if (Status u = check_service_uri(cfg_.service_uri, "DYAD_SERVICE_URI"); !u) return u;
    auto c =
        rpc::Connection::connect(cfg_.service_uri, Deadline::after(timeouts::kControl), creds_);
    if (!c)
        return unreachable(cfg_.service_uri, c.status(),
                           rpc::Connection::not_dyad(c.status())
                               ? "set DYAD_SERVICE_URI to the address of this node's dyadd"
                               : "start dyadd on this node, or set DYAD_SERVICE_URI to its "
                                 "address");
    auto got = ServiceInfo::from_hello(c.value()->peer_info());
    if (!got) return Status(got.status()).wrap(cfg_.service_uri);
    ServiceInfo s = std::move(got.value());
    if (!s.producer_dir.empty()) s.producer_dir_canonical = canonical_path(s.producer_dir);
    store_ = std::make_unique<kvs::RpcStore>(store_uri(s), pool_);
    pool_->put(std::move(c.value()));
    svc_ = s;
    return s;
}

bool ServiceLink::reached() {
    std::lock_guard<std::mutex> lk(mu_);
    return svc_.has_value();
}

Result<kvs::Store*> ServiceLink::store() {
    auto s = service();
    if (!s) return s.status();
    std::lock_guard<std::mutex> lk(mu_);
    return store_.get();
}

std::string ServiceLink::ns(const ServiceInfo& svc) const {
    return cfg_.kvs_namespace.empty() ? svc.ns : cfg_.kvs_namespace;
}

std::string ServiceLink::store_uri(const ServiceInfo& svc) const {
    return svc.kvs == proto::kStoreHere ? cfg_.service_uri : svc.kvs;
}

Status ServiceLink::store_failure(const Status& e, const ServiceInfo& svc) const {
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
    if (slurm_job_)
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

Result<nlohmann::json> ServiceLink::status(const std::string& uri) {
    std::string u = uri.empty() ? cfg_.service_uri : uri;
    if (Status bad = check_service_uri(u, uri.empty() ? "DYAD_SERVICE_URI" : "--uri"); !bad)
        return bad;
    bool connect_failed = false;
    auto r = pool_->call(u, "dyad.status", nlohmann::json::object(),
                         Deadline::after(timeouts::kControl), 0, true, &connect_failed);
    if (!r && connect_failed)
        return unreachable(u, r.status(),
                           uri.empty() ? "start dyadd on this node, or set DYAD_SERVICE_URI to its "
                                         "address"
                                       : "check the address");
    return r;
}

}  // namespace dyad::client
