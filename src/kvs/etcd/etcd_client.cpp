// SPDX-License-Identifier: Apache-2.0
#include "etcd_client.hpp"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace dyad::kvs::etcd {

std::string prefix_end(const std::string& p) {
    std::string e = p;
    while (!e.empty()) {
        auto c = static_cast<unsigned char>(e.back());
        if (c < 0xff) {
            e.back() = static_cast<char>(c + 1);
            return e;
        }
        e.pop_back();
    }
    return std::string(1, '\0');  // every key
}

namespace {
// HOST:PORT -> "A.B.C.D:PORT" (or "[v6]:PORT" with *v6 set).
Result<std::string> resolve(const std::string& ep, bool* v6) {
    auto colon = ep.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == ep.size())
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "etcd endpoint '" + ep + "' is not HOST:PORT (e.g. etcd://127.0.0.1:2379)",
                      EINVAL);
    std::string host = ep.substr(0, colon), port = ep.substr(colon + 1);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (rc != 0 || !res)
        return Status(DYAD_RC_CONNFAIL,
                      "cannot resolve etcd endpoint '" + ep + "': " + ::gai_strerror(rc),
                      EHOSTUNREACH);
    char buf[INET6_ADDRSTRLEN] = {0};
    std::string out;
    if (res->ai_family == AF_INET6) {
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr, buf,
                    sizeof buf);
        out = std::string("[") + buf + "]:" + port;
        *v6 = true;
    } else {
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf,
                    sizeof buf);
        out = std::string(buf) + ":" + port;
        *v6 = false;
    }
    ::freeaddrinfo(res);
    return out;
}
}  // namespace

// The token of the calls, shared with the channel's call credentials.
struct Client::Token {
    std::mutex mu;
    std::string value;
};

namespace {
// Adds the current token (if any) to every call of the channel.
class TokenPlugin : public grpc::MetadataCredentialsPlugin {
  public:
    explicit TokenPlugin(std::shared_ptr<Client::Token> t) : t_(std::move(t)) {}
    bool IsBlocking() const override { return false; }
    grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                             std::multimap<grpc::string, grpc::string>* md) override {
        std::lock_guard<std::mutex> lk(t_->mu);
        if (!t_->value.empty()) md->emplace("token", t_->value);
        return grpc::Status::OK;
    }

  private:
    std::shared_ptr<Client::Token> t_;
};

Result<std::string> read_text(const std::string& path, const char* what) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream b;
    if (!in || !(b << in.rdbuf()))
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      std::string("cannot read the etcd ") + what + " file " + path +
                          ": check the path in --kvs etcd://...?" + what + "=FILE",
                      EINVAL);
    return b.str();
}
}  // namespace

Status parse_security(const std::string& query, Security* s) {
    size_t pos = 0;
    while (pos < query.size()) {
        size_t amp = query.find('&', pos);
        std::string kv =
            query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
        pos = amp == std::string::npos ? query.size() : amp + 1;
        if (kv.empty()) continue;
        size_t eq = kv.find('=');
        std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : kv.substr(eq + 1);
        std::string* to = k == "tls-ca"          ? &s->ca_file
                          : k == "tls-cert"      ? &s->cert_file
                          : k == "tls-key"       ? &s->key_file
                          : k == "tls-name"      ? &s->server_name
                          : k == "auth-user"     ? &s->user
                          : k == "password-file" ? &s->password_file
                          : k == "managed-by"    ? &s->owner
                                                 : nullptr;
        if (!to || v.empty())
            return Status(DYAD_RC_BAD_CLI_PARSE,
                          "etcd URI parameter '" + kv +
                              "' is not one of tls-ca=FILE, tls-cert=FILE, tls-key=FILE, "
                              "tls-name=NAME, auth-user=NAME, password-file=FILE, "
                              "managed-by=slurm|job",
                          EINVAL);
        *to = v;
    }
    const bool some = !s->ca_file.empty() || !s->cert_file.empty() || !s->key_file.empty();
    if (some && (s->ca_file.empty() || s->cert_file.empty() || s->key_file.empty()))
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "etcd TLS needs tls-ca=, tls-cert= and tls-key= together in the URI", EINVAL);
    if (s->user.empty() != s->password_file.empty())
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "etcd auth needs auth-user= and password-file= together in the URI", EINVAL);
    if (!s->user.empty() && !s->tls())
        return Status(DYAD_RC_BAD_CLI_PARSE,
                      "etcd auth (auth-user=) needs TLS (tls-ca=, tls-cert=, tls-key=): a "
                      "password is never sent in clear",
                      EINVAL);
    return Status::ok();
}

Result<std::unique_ptr<Client>> Client::open(const std::vector<std::string>& endpoints,
                                             const Security& sec) {
    if (endpoints.empty()) return Status(DYAD_RC_BAD_CLI_PARSE, "no etcd endpoint given", EINVAL);
    std::vector<std::string> addresses;
    std::optional<bool> family_v6;
    auto c = std::unique_ptr<Client>(new Client());
    for (const auto& ep : endpoints) {
        bool v6 = false;
        auto a = resolve(ep, &v6);
        if (!a) return a.status();
        if (family_v6 && *family_v6 != v6)
            return Status(DYAD_RC_BAD_CLI_PARSE,
                          "etcd endpoints mix IPv4 and IPv6 addresses: give one family", EINVAL);
        family_v6 = v6;
        addresses.push_back(a.value());
        c->where_ += (c->where_.empty() ? "" : ",") + ep;
    }
    // pick_first takes the first address that answers: in the order given,
    // every service of a job (same --kvs) would hold its watch stream, lease
    // keep-alive and reads on the first member. Each service shuffles the
    // list instead, so that the services spread over the members (and still
    // go to the next one when theirs fails).
    std::shuffle(addresses.begin(), addresses.end(), std::mt19937(std::random_device{}()));
    std::string target;
    for (const auto& a : addresses) target += (target.empty() ? "" : ",") + a;
    target = (*family_v6 ? "ipv6:" : "ipv4:") + target;
    grpc::ChannelArguments args;
    // Reconnect quickly after an etcd member restarts: waiting calls and
    // the watch stream resume within about a second of it being back.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // Notice a member that vanished without closing the connection (etcd
    // accepts pings every 5 s or slower by default).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetLoadBalancingPolicyName("pick_first");
    c->outage_ = std::make_unique<Outage>("etcd://" + c->where_);
    c->sec_ = sec;
    c->token_ = std::make_shared<Token>();
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (sec.tls()) {
        grpc::SslCredentialsOptions so;
        auto ca = read_text(sec.ca_file, "tls-ca");
        auto cert = read_text(sec.cert_file, "tls-cert");
        auto key = read_text(sec.key_file, "tls-key");
        for (auto* r : {&ca, &cert, &key})
            if (!*r) return r->status();
        so.pem_root_certs = ca.value();
        so.pem_cert_chain = cert.value();
        so.pem_private_key = key.value();
        creds = grpc::SslCredentials(so);
        if (!sec.server_name.empty()) args.SetSslTargetNameOverride(sec.server_name);
        if (!sec.user.empty())
            creds = grpc::CompositeChannelCredentials(
                creds,
                grpc::MetadataCredentialsFromPlugin(
                    std::unique_ptr<grpc::MetadataCredentialsPlugin>(new TokenPlugin(c->token_))));
    }
    c->channel_ = grpc::CreateCustomChannel(target, creds, args);
    c->auth_ = pb::Auth::NewStub(c->channel_);
    c->kv_ = pb::KV::NewStub(c->channel_);
    c->lease_ = pb::Lease::NewStub(c->channel_);
    c->watch_ = pb::Watch::NewStub(c->channel_);
    return c;
}

void Client::prepare(grpc::ClientContext* ctx, Deadline d) {
    ctx->set_wait_for_ready(true);
    double s = std::min(d.remaining(), 86400.0);
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::microseconds(static_cast<int64_t>(s * 1e6)));
}

Result<pb::RangeResponse> Client::range(const std::string& key, const std::string& end,
                                        int64_t limit, bool count_only, Deadline d,
                                        bool serializable) {
    pb::RangeRequest q;
    q.set_key(key);
    q.set_serializable(serializable);
    if (!end.empty()) q.set_range_end(end);
    q.set_limit(limit);
    q.set_count_only(count_only);
    pb::RangeResponse a;
    Status s = call(
        "etcd range",
        [this](grpc::ClientContext* c, const pb::RangeRequest& r, pb::RangeResponse* o) {
            return kv_->Range(c, r, o);
        },
        q, &a, d, true);
    if (!s) return s;
    return a;
}

Result<pb::TxnResponse> Client::txn(const pb::TxnRequest& q, Deadline d) {
    pb::TxnResponse a;
    // Repeated while etcd is unavailable (a leader lost mid-request): every
    // transaction of ours compares revisions first, so one that did commit
    // before the error fails its compare when repeated, and the caller reads
    // what is there (its own record: replaced by the same).
    Status s = call(
        "etcd transaction",
        [this](grpc::ClientContext* c, const pb::TxnRequest& r, pb::TxnResponse* o) {
            return kv_->Txn(c, r, o);
        },
        q, &a, d, true);
    if (!s) return s;
    return a;
}

Status Client::authenticate(Deadline d) {
    if (sec_.user.empty()) return Status::ok();
    auto pw = read_text(sec_.password_file, "password-file");
    if (!pw) return pw.status();
    std::string password = pw.value();
    while (!password.empty() && std::isspace(static_cast<unsigned char>(password.back())))
        password.pop_back();
    pb::AuthenticateRequest q;
    q.set_name(sec_.user);
    q.set_password(password);
    std::fill(password.begin(), password.end(), '\0');
    for (;;) {
        pb::AuthenticateResponse a;
        grpc::ClientContext ctx;
        prepare(&ctx, d.min(Deadline::after(2)));
        grpc::Status s = auth_->Authenticate(&ctx, q, &a);
        if (s.ok()) {
            std::lock_guard<std::mutex> lk(token_->mu);
            token_->value = a.token();
            return Status::ok();
        }
        // Not enabled yet (the job's first node enables it once the
        // cluster has a leader), no leader yet, or no member up yet.
        const bool later = s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
                           s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
        if (!later || d.expired()) {
            if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
                return Status(DYAD_RC_NOAUTH,
                              "etcd at " + where_ + " refused user '" + sec_.user +
                                  "' with the password of " + sec_.password_file + ": " +
                                  s.error_message(),
                              EACCES);
            // Its auth not enabled yet at the deadline: not ready in time.
            if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION)
                return Status(DYAD_RC_TIMEOUT,
                              "etcd authentication as '" + sec_.user + "': etcd at " + where_ +
                                  " was not ready in time (" + s.error_message() + ")",
                              ETIMEDOUT);
            return failed(s, "etcd authentication as '" + sec_.user + "'");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

bool Client::auth_refused(const grpc::Status& s) const {
    if (sec_.user.empty()) return false;
    return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
           s.error_message().find("invalid auth token") != std::string::npos ||
           s.error_message().find("user name is empty") != std::string::npos;
}

bool Client::reauthenticate(Deadline d) {
    if (reauths_.fetch_add(1) >= 3) return false;  // refused again at once: give up
    return static_cast<bool>(authenticate(d.min(Deadline::after(5))));
}

std::string Client::advice() const {
    const std::string lost =
        "the job's own etcd (members on its first three nodes) has lost its majority: two of "
        "them are gone. Files already consumed stay; new ones cannot be published or found in "
        "this job. ";
    if (sec_.owner == "slurm")
        return lost +
               "Submit the job again, or start a DYAD of your own in it: eval \"$(dyad job start "
               "--job-id $SLURM_JOB_ID.2)\" (and `dyad job stop --job-id $SLURM_JOB_ID.2` at its "
               "end)";
    if (sec_.owner == "job")
        return lost + "Stop it (`dyad job stop`) and start it again with `dyad job start`";
    return "start it, or give dyadd --kvs the endpoints of a running member";
}

void Client::answered() {
    reauths_ = 0;
    answered_once_ = true;
    last_answer_ns_ = std::chrono::steady_clock::now().time_since_epoch().count();
    outage_->answered(resumed_);
}

void Client::failed(const std::string& why) {
    outage_->failed(why);
}

Status Client::failed(const grpc::Status& s, const std::string& what) {
    const std::string at = "etcd at " + where_;
    switch (s.error_code()) {
        case grpc::StatusCode::DEADLINE_EXCEEDED:
            failed(at + " did not answer in time");
            return Status(DYAD_RC_TIMEOUT,
                          what + ": " + at + " did not answer in time: " +
                              (sec_.owner.empty() ? "is it running and reachable? (`etcdctl "
                                                    "--endpoints " +
                                                        where_ + " endpoint health`)"
                                                  : advice()),
                          ETIMEDOUT);
        case grpc::StatusCode::UNAVAILABLE:
            failed(at + " is unavailable: " + s.error_message());
            return Status(
                DYAD_RC_CONNFAIL,
                what + ": " + at + " is unavailable (" + s.error_message() + "): " + advice(),
                ECONNREFUSED);
        case grpc::StatusCode::RESOURCE_EXHAUSTED:
            return Status(DYAD_RC_BADCOMMIT,
                          what + ": " + at + " refused it: " + s.error_message() +
                              " (etcd's space quota: compact and defragment it, or raise "
                              "--quota-backend-bytes)",
                          ENOSPC);
        default:
            return Status(DYAD_RC_BADRPC, what + ": " + at + " answered: " + s.error_message(),
                          EPROTO);
    }
}

double Client::seconds_since_answer() const {
    int64_t t = last_answer_ns_.load();
    if (!t) return -1;
    auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    return static_cast<double>(now - t) / 1e9;
}

}  // namespace dyad::kvs::etcd
