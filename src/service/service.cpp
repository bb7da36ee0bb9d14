// SPDX-License-Identifier: Apache-2.0
#include "service.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <thread>

#include "common/config.hpp"
#include "common/keygen.hpp"
#include "common/log.hpp"
#include "common/paths.hpp"
#include "common/settings.hpp"
#include "common/timeouts.hpp"
#include "kvs/epoch.hpp"
#include "kvs/record.hpp"
#include "kvs/registry.hpp"
#include "proto/hello.hpp"
#include "proto/origin_claim.hpp"
#include "rpc/client.hpp"
#include "rpc/wire.hpp"
#include "access.hpp"
#include "send_channel.hpp"
#include "common/json_text.hpp"

namespace dyad::service {
namespace {

constexpr const char* kSub = "dyadd";

// "HOST:PORT" -> host, port (IPv6 in brackets).
Status split_host_port(const std::string& s, std::string* host, uint16_t* port) {
    auto u = rpc::parse_uri("tcp://" + s);
    if (!u) return Status(DYAD_RC_BAD_CLI_PARSE, "--listen '" + s + "' is not HOST:PORT", EINVAL);
    *host = u->host;
    *port = u->port;
    return Status::ok();
}

// The address other nodes can use when listening on a wildcard.
std::string public_host(const std::string& host) {
    if (host == "0.0.0.0" || host == "::") return hostname();
    return host;
}

// The lock of a producer directory: one dyadd serves it. flock, so a
// process that dies (SIGKILL included) lets go of it at once.
constexpr const char* kDirLock = "service.lock";

// The producer directory's .dyad/ holds the service's lock, epoch and
// ledger: it must be this dyadd's own, private, and no symbolic link (one
// another user made before the first start would be used as is: its files
// read, its locks held by that user). EACCES naming its owner and mode
// otherwise (docs/security.md, "The node-wide service").
Status private_state_dir(const std::string& state) {
    struct stat sb;
    if (::lstat(state.c_str(), &sb) != 0)
        return Status(DYAD_RC_BADMANAGEDPATH, "cannot look at '" + state + "'", errno);
    const uid_t me = ::geteuid();
    if (!S_ISLNK(sb.st_mode) && S_ISDIR(sb.st_mode) && sb.st_uid == me && (sb.st_mode & 077) == 0)
        return Status::ok();
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(sb.st_mode & 07777));
    const std::string what =
        S_ISLNK(sb.st_mode)    ? std::string("is a symbolic link")
        : !S_ISDIR(sb.st_mode) ? std::string("is not a directory")
        : sb.st_uid != me ? "belongs to uid " + std::to_string(sb.st_uid) + " (mode " + mode + ")"
                          : std::string("may be used by others (mode ") + mode + ")";
    return Status(DYAD_RC_BADMANAGEDPATH,
                  "'" + state + "' " + what +
                      ": it holds this dyadd's lock, epoch and ledger and "
                      "must be a private directory (mode 0700) of its user (uid " +
                      std::to_string(me) +
                      "); another user may have made it before this service first started: "
                      "look at it, remove it, and start dyadd again",
                  EACCES);
}

// Takes the lock of `dir` (canonical), naming `id` in it; EBUSY naming the
// holder when another dyadd has it.
Result<UniqueFd> lock_producer_dir(const std::string& dir, const std::string& id) {
    const std::string state = dir + "/" + kReservedDir;
    Status s = mkdir_p(state, 0700);
    if (!s) return s.wrap("producer directory");
    if (Status own = private_state_dir(state); !own) return own;
    const std::string path = state + "/" + kDirLock;
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd.valid()) {
        const int e = errno;
        return Status(
            DYAD_RC_BADMANAGEDPATH,
            "cannot open the lock file '" + path + "' of producer directory '" + dir + "'" +
                (e == EACCES ? ": it belongs to another user, whose dyadd serves (or served) "
                               "this directory; give this dyadd a directory of its own"
                             : std::string()),
            e == EACCES ? EBUSY : e);
    }
    struct stat sb;
    if (::fstat(fd.get(), &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != ::geteuid())
        return Status(DYAD_RC_BADMANAGEDPATH,
                      "the lock file '" + path + "' of producer directory '" + dir +
                          "' is not a regular file of this dyadd's user (uid " +
                          std::to_string(::geteuid()) + "): remove it, or give " +
                          "this dyadd a directory of its own",
                      EBUSY);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char buf[512];
        ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
        std::string holder = "another dyadd";
        auto held = proto::DirHolder::parse(nlohmann::json::parse(
            std::string(buf, n > 0 ? static_cast<size_t>(n) : 0), nullptr, false));
        if (held)
            holder = "the dyadd of service '" + held->service_id + "' (pid " +
                     std::to_string(held->pid) + ")";
        if (e != EWOULDBLOCK)
            return Status(DYAD_RC_BADMANAGEDPATH, "cannot lock '" + path + "'", e);
        return Status(DYAD_RC_BADMANAGEDPATH,
                      "producer directory '" + dir + "' is already served by " + holder +
                          " (it holds " + path +
                          "): stop it first, or give this dyadd another producer directory",
                      EBUSY);
    }
    std::string me =
        proto::DirHolder{id, ::getpid()}.build().dump(-1, ' ', false, kBadUtf8Replaced) + "\n";
    if (::ftruncate(fd.get(), 0) != 0 ||
        ::pwrite(fd.get(), me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
        DYAD_WARN(kSub, "cannot write who holds %s: %s", path.c_str(), std::strerror(errno));
    return fd;
}

// A Unix socket some process accepts connections on.
bool unix_socket_answers(const std::string& path) {
    struct sockaddr_un a {};
    if (path.size() >= sizeof a.sun_path) return false;
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return false;
    return ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
}

// The registration `value` of service `id` names a dyadd that still
// answers as `id`: a description of it (where, which pid). Empty when none
// of its endpoints answers so within timeouts::kHolderProbe seconds (a crash left it).
std::string live_holder(const std::string& id, const std::string& value,
                        const rpc::Credentials& me) {
    auto held = proto::Identity::parse(nlohmann::json::parse(value, nullptr, false));
    if (!held) return "";
    const bool same_host = held->host_id == dtl::host_id();
    Deadline until = Deadline::after(timeouts::kHolderProbe);
    for (const auto& ep : held->endpoints) {
        if (ep.rfind("unix:", 0) == 0 && !same_host) continue;
        auto c = rpc::Connection::connect(ep, until, me);
        if (!c) continue;
        auto hello = proto::Hello::parse(c.value()->peer_info());
        if (!hello || hello->service.service_id != id) continue;
        // This very dyadd (with --store-late it answers before it looks),
        // at an endpoint the stale registration names too.
        if (hello->service.pid == ::getpid() && hello->service.host_id == dtl::host_id()) continue;
        std::string who = "the dyadd at " + ep;
        if (hello->service.pid) who += " (pid " + std::to_string(hello->service.pid) + ")";
        return who;
    }
    return "";
}

}  // namespace

Status refuse_if_live(const std::string& id, const Result<kvs::Entry>& held,
                      std::shared_ptr<const auth::Key> key, const std::string& store) {
    if (!held) return Status::ok();
    rpc::Credentials me;
    me.key = std::move(key);
    me.role = "service";
    me.service_id = id;
    std::string holder = live_holder(id, held->value, me);
    if (holder.empty()) return Status::ok();
    return Status(DYAD_RC_BADMANAGEDPATH,
                  "service id '" + id + "' is already registered in the metadata store (" + store +
                      ") by " + holder +
                      ", which still answers: give this dyadd another --node, or stop that one "
                      "first (a registration whose dyadd is gone does not block a restart)",
                  EBUSY);
}

bool is_loopback_host(const std::string& host) {
    if (host == "localhost") return true;
    unsigned char buf[sizeof(struct in6_addr)];
    if (::inet_pton(AF_INET, host.c_str(), buf) == 1) return buf[0] == 127;
    if (::inet_pton(AF_INET6, host.c_str(), buf) == 1) {
        static const unsigned char one[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
        return std::memcmp(buf, one, 16) == 0;
    }
    return false;
}

Service::Service(Options opts)
    : opts_(std::move(opts)), file_pool_(opts_.io_threads ? opts_.io_threads : 1) {
    if (opts_.node.empty()) opts_.node = hostname();
    id_ = opts_.node;
    // Transports set up after the start (late_transports.cpp): fetches
    // asking for one are held meanwhile; the status lists them.
    files_.set_hold([this](const std::shared_ptr<rpc::Request>& r) { return held_for_late(r); });
    status_.set_starting([this] { return starting_; });
}

Service::~Service() {
    stop_reaching_store();
    stop_late_transports();  // (it may be registering in the store)
    // First: the store's threads that call back into the service (a rejoin).
    if (store_) store_->close();
    stop();
    file_pool_.stop();
    file_pool_.join();
    replicas_.shutdown();  // (a pull in progress ends first)
    store_server_.reset();
    // The store's own threads (etcd's watch, lease and sweeper) end with its
    // last reference (here, or the served topics' in server_'s handlers),
    // while the loop they answer requests through still exists.
    store_.reset();
    opts_.external_store.reset();
}

namespace {

// The transfer-memory budget of --memory and --memory-per-peer.
Result<std::unique_ptr<dtl::MemoryBudget>> make_budget(const Options& o) {
    if (o.memory < (16ull << 20))
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "the service memory budget (--memory / DYAD_SERVICE_MEMORY) must be at least "
                      "16M: one transfer needs up to 16 MiB",
                      EINVAL);
    auto budget = std::make_unique<dtl::MemoryBudget>(o.memory);
    uint64_t per_peer = o.memory_per_peer ? o.memory_per_peer : o.memory / 4;
    if (per_peer < (4ull << 20) || per_peer > o.memory)
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "--memory-per-peer must be between 4M (one chunk) and --memory (" +
                          std::to_string(o.memory) + " bytes)",
                      EINVAL);
    budget->set_per_peer(per_peer);
    return budget;
}

// Where every listener binds, the transports' too: without a key, loopback
// only (the --listen address, or 127.0.0.1 with only a Unix socket); with a
// key, the --listen address (any, for a wildcard).
Result<dtl::ServiceBind> bind_policy(const Options& o, bool keyed) {
    std::string host;
    uint16_t port = 0;
    if (!o.listen.empty()) {
        Status s = split_host_port(o.listen, &host, &port);
        if (!s) return s;
    }
    if (host == "0.0.0.0" || host == "::") host.clear();
    dtl::ServiceBind bind;
    bind.loopback_only = !keyed && !o.insecure;
    if (bind.loopback_only && host.empty()) host = "127.0.0.1";
    bind.host = host;
    return bind;
}

// Whether backend `b` is one of --transports (all when none is given).
bool wanted(const Options& o, const dtl::Backend& b) {
    return o.transports.empty() ||
           std::any_of(o.transports.begin(), o.transports.end(), [&](const std::string& t) {
               auto f = dtl::find_backend(t);
               return f && f.value()->name == b.name;
           });
}

// --socket: bound (not yet accepting), with the mode that says who may
// connect. Its endpoint.
Result<std::string> listen_unix_socket(rpc::Server& server, const Options& o) {
    // A socket someone answers on is another dyadd's: never take it over
    // (a stale one, left by a crash, is replaced).
    // (A socket handed to us is ours: it queues connections already.)
    if (o.socket_fd < 0 && unix_socket_answers(o.socket_path))
        return Status(DYAD_RC_CONNFAIL,
                      "--socket '" + o.socket_path +
                          "' is in use: another dyadd answers on it. Stop that one first, or "
                          "give this dyadd another --socket",
                      EBUSY);
    auto ep = o.socket_fd >= 0 ? server.adopt_unix(o.socket_fd, o.socket_path)
                               : server.listen_unix(o.socket_path);
    if (!ep) return o.socket_fd >= 0 ? Status(ep.status()).wrap("--socket-fd") : ep.status();
    // Connecting needs write permission on the socket: its mode says who
    // may try, as --allow-uid does (the hello checks SO_PEERCRED too).
    // Only this user and root: 0600; other uids allowed: 0666.
    const mode_t mode = o.allow_any_uid || !o.allow_uids.empty() ? 0666 : 0600;
    // (Never through a symbolic link put in its place meanwhile.)
    if (::fchmodat(AT_FDCWD, o.socket_path.c_str(), mode, AT_SYMLINK_NOFOLLOW) != 0)
        return Status(DYAD_RC_CONNFAIL, "cannot set the mode of --socket '" + o.socket_path + "'",
                      errno);
    return ep;
}

// --listen: bound (not yet accepting). Without a key, only this machine may
// talk to us (unless --insecure). Its endpoint as consumers reach it.
Result<std::string> listen_tcp_port(rpc::Server& server, const Options& o, bool keyed) {
    std::string host;
    uint16_t port = 0;
    Status s = split_host_port(o.listen, &host, &port);
    if (!s) return s;
    if (!keyed && !is_loopback_host(host)) {
        if (!o.insecure)
            return Status(DYAD_RC_NOAUTH,
                          "--listen " + o.listen +
                              " is reachable from other machines, and no key is set: give "
                              "--auth-key FILE (create it once per job with `dyad keygen "
                              "FILE`, and give the same file to every client as "
                              "DYAD_AUTH_KEY_FILE), or listen on 127.0.0.1; --insecure "
                              "serves anyone who can reach the port",
                          EPERM);
        DYAD_WARN(kSub,
                  "INSECURE: listening on %s without a key (--insecure): anyone who can reach "
                  "this port can read every produced file and rewrite the metadata",
                  o.listen.c_str());
    }
    auto ep =
        o.listen_fd >= 0 ? server.adopt_tcp(o.listen_fd, port) : server.listen_tcp(host, port);
    if (!ep) return o.listen_fd >= 0 ? Status(ep.status()).wrap("--listen-fd") : ep.status();
    auto u = rpc::parse_uri(ep.value());
    return "tcp://" + public_host(host) + ":" + std::to_string(u->port);
}

}  // namespace

Status Service::open_producer_dir() {
    if (opts_.producer_dir.empty())
        return Status(
            DYAD_RC_BADMANAGEDPATH,
            "no producer directory: give it as the argument of dyadd or set DYAD_PATH_PRODUCER",
            EINVAL);
    Status s = mkdir_p(opts_.producer_dir, 02775);
    if (!s) return s.wrap("producer directory");
    prod_dir_ = canonical_path(opts_.producer_dir);
    prod_fd_.reset(::open(prod_dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!prod_fd_.valid())
        return Status(DYAD_RC_BADMANAGEDPATH, "cannot open producer directory '" + prod_dir_ + "'",
                      errno);
    // One dyadd per producer directory (two would publish, and serve, the
    // same files as two owners).
    auto lock = lock_producer_dir(prod_dir_, id_);
    if (!lock) return lock.status();
    prod_lock_ = std::move(lock.value());
    return Status::ok();
}

Status Service::start_senders(const std::string& mode) {
    KeepSignalHandlers keep;  // (late_transports.cpp)
    for (const auto& t : opts_.transports) {
        auto b = dtl::find_backend(t);
        if (!b) return Status(b.status()).wrap("--transports");
    }
    for (const auto& b : dtl::backends()) {
        if (!wanted(opts_, b)) continue;
        if (starts_late(b, mode)) {
            late_.push_back(&b);
            continue;
        }
        auto snd = b.make_sender(io_, bind_);
        if (!snd) {
            DYAD_WARN(kSub, "transport %s unavailable: %s", b.name.c_str(),
                      snd.status().to_string().c_str());
            unavailable_[b.name] = snd.status().message();
            continue;
        }
        senders_[b.name] = std::move(snd.value());
        files_.count(b.name);
    }
    if (mode != dtl::kAutoMode && !senders_.count(mode))
        return Status(DYAD_RC_BADDTLMODE,
                      "--mode " + mode + " is not served by this dyadd (see --transports)", EINVAL);
    for (const auto& [name, snd] : senders_)
        for (auto& r : snd->records()) records_.push_back(std::move(r));
    if (Status s = set_aside_late_figures(); !s) return s;
    return dtl::apply_figures(opts_.figures, &records_);
}

Status Service::start_server() {
    server_ = std::make_unique<rpc::Server>(io_, nlohmann::json::object());
    server_->set_auth({key_, opts_.allow_uids, opts_.allow_any_uid});
    server_->set_observer(metrics_);
    server_->set_idle_timeout(
        std::chrono::milliseconds(static_cast<int64_t>(opts_.idle_timeout * 1000.0)));
    server_->set_max_connections_per_peer(static_cast<size_t>(opts_.max_connections_per_peer));
    server_->set_request_bytes(opts_.max_request_bytes_per_peer, opts_.max_request_bytes);
    server_->set_max_wait(std::chrono::milliseconds(static_cast<int64_t>(opts_.max_wait * 1000.0)));
    // Bound now, listening only once the service is registered and ready
    // (start_accepting): whoever can connect can be served. The Unix socket
    // starts first: whoever sees the TCP port answer may use it too.
    server_->defer_accepting();
    if (!opts_.socket_path.empty()) {
        auto ep = listen_unix_socket(*server_, opts_);
        if (!ep) return ep.status();
        endpoints_.push_back(ep.value());
    }
    if (!opts_.listen.empty()) {
        auto ep = listen_tcp_port(*server_, opts_, key_ != nullptr);
        if (!ep) return ep.status();
        endpoints_.insert(endpoints_.begin(), ep.value());  // the TCP endpoint leads
    }
    if (endpoints_.empty())
        return Status(DYAD_RC_BAD_CLI_PARSE, "nothing to listen on: give --listen or --socket",
                      EINVAL);
    // Every transport is reached through the fetch RPC first (UCX and
    // libfabric exchange their own addresses on it), so a record's address
    // is the service's endpoints unless the transport gave one.
    std::string eps;
    for (const auto& e : endpoints_) eps += (eps.empty() ? "" : " ") + e;
    for (auto& r : records_)
        if (r.address.empty()) r.address = eps;
    server_->handle("dyad.fetch",
                    [this](std::shared_ptr<rpc::Request> r) { files_.on_fetch(std::move(r)); });
    server_->handle("dyad.fetch_many", [this](std::shared_ptr<rpc::Request> r) {
        files_.on_fetch_many(std::move(r));
    });
    server_->handle("dyad.status",
                    [this](std::shared_ptr<rpc::Request> r) { status_.on_status(std::move(r)); });
    server_->handle("dyad.publish", [this](std::shared_ptr<rpc::Request> r) {
        publisher_.on_publish(std::move(r));
    });
    server_->handle("dyad.unpublish", [this](std::shared_ptr<rpc::Request> r) {
        publisher_.on_unpublish(std::move(r));
    });
    server_->handle(proto::kOriginClaim, [this](std::shared_ptr<rpc::Request> r) {
        publisher_.on_origin_claim(std::move(r));
    });
    server_->handle("dyad.replicate", [this](std::shared_ptr<rpc::Request> r) {
        replicas_.on_replicate(std::move(r));
    });
    server_->handle("dyad.replicate_many", [this](std::shared_ptr<rpc::Request> r) {
        replicas_.on_replicate_many(std::move(r));
    });
    server_->handle("dyad.unreplicate", [this](std::shared_ptr<rpc::Request> r) {
        replicas_.on_unreplicate(std::move(r));
    });
    return Status::ok();
}

Status Service::start() {
    status_.started();
    if (Status s = open_producer_dir(); !s) return s;
    act_as_users_ = can_act_as_users();
    auto budget = make_budget(opts_);
    if (!budget) return budget.status();
    budget_ = std::move(budget.value());
    caps_ = std::make_shared<PeerCaps>(
        PeerCaps::Limits{opts_.max_fetches_per_peer, opts_.max_local_per_peer});
    auto mode = dtl::canonical_mode(opts_.mode);
    if (!mode) return mode.status();
    if (!opts_.auth_key.empty()) {
        auto k = auth::Key::load(opts_.auth_key);
        if (!k) return Status(k.status()).wrap("--auth-key");
        key_ = k.value();
    }
    auto bind = bind_policy(opts_, key_ != nullptr);
    if (!bind) return bind.status();
    bind_ = bind.value();
    if (Status s = start_senders(mode.value()); !s) return s;
    if (Status s = start_server(); !s) return s;
    if (Status s = start_store(); !s) return s;
    if (Status s = publisher_.restore(); !s) return s;
    if (Status s = replicas_.start(); !s) return s;
    if (!rank_)
        DYAD_WARN(kSub,
                  "this node has no rank (give --rank N): owner_rank of its files is a "
                  "hash of its node id");
    server_->set_hello_info(proto::Hello{identity()}.build());
    if (Status s = server_->start_accepting(); !s) return s;
    DYAD_INFO(kSub, "service %s ready: rank %s, producer dir %s, endpoints %s, metadata %s",
              id_.c_str(),
              rank_ ? (std::to_string(*rank_) + (rank_source_ == "store"
                                                     ? std::string(", assigned by the store")
                                                     : ", from " + rank_source_))
                          .c_str()
                    : "none",
              prod_dir_.c_str(),
              nlohmann::json(endpoints_).dump(-1, ' ', false, kBadUtf8Replaced).c_str(),
              opts_.kvs_uri.empty() ? "embedded" : opts_.kvs_uri.c_str());
    if (auto h = store_->hosted())
        DYAD_INFO(kSub, "embedded metadata store: epoch %u (generations from %llu; %s/%s)",
                  h->epoch,
                  static_cast<unsigned long long>((static_cast<uint64_t>(h->epoch) << 32) | 1),
                  h->state_dir.c_str(), kvs::kEpochFile);
    if (opts_.late_store) start_reaching_store();
    start_late_transports();
    return Status::ok();
}

Status Service::start_store() {
    if (opts_.late_store) {
        // Reached, and registered in, once the service is ready (late_store.cpp).
        store_ = opts_.late_store;
        store_server_ = std::make_unique<kvs::StoreServer>(*server_, store_);
        rank_ = opts_.rank;
        rank_source_ = opts_.rank ? opts_.rank_source : std::string();
        return Status::ok();
    }
    kvs::StoreSetup setup;
    setup.uri = opts_.kvs_uri;
    setup.external = std::move(opts_.external_store);
    setup.limits.max_bytes = opts_.store_max;
    setup.limits.max_records_per_ns = opts_.store_max_records_per_ns;
    setup.limits.max_namespaces = opts_.store_max_namespaces;
    setup.limits.max_bytes_per_ns = opts_.store_max_bytes_per_ns;
    setup.state_dir = opts_.state_dir.empty() ? prod_dir_ + "/" + kReservedDir : opts_.state_dir;
    setup.endpoint = endpoints_.empty() ? std::string() : endpoints_.front();
    setup.ns = opts_.ns;
    setup.id = id_;
    setup.credentials.key = key_;
    setup.credentials.role = "service";
    setup.credentials.service_id = id_;
    setup.rejoin = [this](const std::function<bool()>& stopping, uint64_t& republished) {
        return rejoin(stopping, republished);
    };
    auto made = kvs::make_service_store(std::move(setup));
    if (!made) return made.status();
    store_ = std::move(made.value());
    // Our clients ask us (kvs proto::kStoreHere in the hello) unless they ask the
    // store's host: with etcd, one connection and one watch stream to the
    // store serve every consumer of this node.
    if (store_->serves_clients())
        store_server_ = std::make_unique<kvs::StoreServer>(*server_, store_);
    // One live dyadd per service id: a registration whose dyadd still
    // answers as this id is refused; one nobody answers for is stale.
    Status unique = refuse_if_live(
        id_, store_->get(kServicesNamespace, id_, Deadline::after(timeouts::kRegistryLook)), key_,
        store_->describe());
    if (!unique) return unique;
    // Registered with the rank given (--rank), or given one by the store.
    rank_ = opts_.rank;
    rank_source_ = opts_.rank ? opts_.rank_source : std::string();
    auto mine =
        store_->register_service(id_, identity().build().dump(-1, ' ', false, kBadUtf8Replaced),
                                 Deadline::after(timeouts::kRegister));
    if (!mine) return mine.status();
    store_->start();
    if (auto given = kvs::registry::rank_of(mine->value); !rank_ && given) {
        rank_ = *given;
        rank_source_ = "store";
    }
    return Status::ok();
}

proto::Identity Service::identity() const {
    proto::Identity me;
    me.service_id = id_;
    me.node = opts_.node;
    me.host_id = dtl::host_id();
    me.ns = opts_.ns;
    me.producer_dir = prod_dir_;
    me.kvs = !store_ || store_->serves_clients() ? std::string(proto::kStoreHere) : opts_.kvs_uri;
    me.endpoints = endpoints_;
    {
        std::lock_guard<std::mutex> lk(records_mu_);
        for (const auto& r : records_) me.transports.push_back(r.to_json());
    }
    me.default_mode = opts_.mode;
    me.pid = ::getpid();
    me.auth = key_ ? auth::kScheme : "none";
    me.wire_version = rpc::kVersion;
    me.rank = rank_;
    me.rank_source = rank_source_;
    return me;
}

void Service::catch_signals() {
    if (signals_) return;
    signals_.emplace(io_, SIGINT, SIGTERM);
    signals_->async_wait([this](asio::error_code ec, int sig) {
        if (ec) return;
        DYAD_INFO(kSub, "signal %d: shutting down", sig);
        stop();
    });
}

void Service::run(bool handle_signals) {
    if (handle_signals) catch_signals();
    // Keeps run() alive between requests; stop() ends the loop.
    auto guard = asio::make_work_guard(io_);
    for (;;) {
        try {
            io_.run();
            break;
        } catch (const std::exception& e) {
            // Handlers are guarded; this is the last line of defence.
            DYAD_ERROR(kSub, "unexpected exception on the event loop: %s", e.what());
        }
    }
}

void Service::stop() {
    asio::post(io_, [this] {
        if (signals_) {
            asio::error_code ec;
            signals_->cancel(ec);
        }
        if (server_) server_->stop();
        io_.stop();
    });
}

void Service::set_metrics_endpoint(std::string url) {
    status_.set_metrics_endpoint(std::move(url));
}

void Service::metrics(std::function<void(std::string)> done) {
    status_.metrics(std::move(done));
}

void Service::health(std::function<void(bool, std::string)> done) {
    status_.health(std::move(done));
}

// ---- putting the service back into a store that lost it ----

bool Service::rejoin(const std::function<bool()>& stopping, uint64_t& republished) {
    auto v = store_->put(kServicesNamespace, id_,
                         identity().build().dump(-1, ' ', false, kBadUtf8Replaced), id_, 0,
                         Deadline::after(timeouts::kRegisterAgain));
    if (!v) {
        DYAD_WARN(kSub, "cannot register again in the metadata store at %s: %s (trying again)",
                  opts_.kvs_uri.c_str(), v.status().to_string().c_str());
        return false;
    }
    return publisher_.republish(stopping, republished);
}

}  // namespace dyad::service
