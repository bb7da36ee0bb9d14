// SPDX-License-Identifier: Apache-2.0
#include "etcd_client.hpp"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <random>
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

Result<std::unique_ptr<Client>> Client::open(const std::vector<std::string>& endpoints) {
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
    c->channel_ = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
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

void Client::answered() {
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
                          what + ": " + at +
                              " did not answer in time: is it running and reachable? (`etcdctl "
                              "--endpoints " +
                              where_ + " endpoint health`)",
                          ETIMEDOUT);
        case grpc::StatusCode::UNAVAILABLE:
            failed(at + " is unavailable: " + s.error_message());
            return Status(DYAD_RC_CONNFAIL,
                          what + ": " + at + " is unavailable (" + s.error_message() +
                              "): start it, or give dyadd --kvs the endpoints of a running member",
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
