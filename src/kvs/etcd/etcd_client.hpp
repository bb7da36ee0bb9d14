// SPDX-License-Identifier: Apache-2.0
// The connection to etcd shared by the store's parts: one gRPC channel over
// every endpoint (pick_first over them in an order shuffled per service, so
// that a job's services spread over the members; reconnecting with a
// short backoff, so calls ride through a restart of an etcd member), its
// stubs, the mapping of gRPC errors to ours, and whether etcd answers.
// With a Security: TLS with a client certificate, and etcd's user/password
// auth (the token Authenticate returns goes with every call; taken again
// when etcd says it is no longer valid).
#pragma once

#include <atomic>
#include <functional>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/deadline.hpp"
#include "common/status.hpp"
#include "etcd.grpc.pb.h"
#include "kvs/etcd/etcd_security.hpp"
#include "kvs/outage.hpp"

namespace dyad::kvs::etcd {

namespace pb = etcdserverpb;

// The smallest key after every key that starts with `p` (etcd's range_end
// of a prefix).
std::string prefix_end(const std::string& p);

class Client {
  public:
    // endpoints: HOST:PORT; resolved once (pick_first over the addresses,
    // in a random order).
    static Result<std::unique_ptr<Client>> open(const std::vector<std::string>& endpoints,
                                                const Security& sec = {});
    // With a user: a token from etcd (retried while etcd has no leader yet,
    // or its auth is not enabled yet, until the deadline).
    Status authenticate(Deadline d);
    pb::Auth::Stub& auth() { return *auth_; }

    const std::string& where() const { return where_; }
    pb::KV::Stub& kv() { return *kv_; }
    pb::Lease::Stub& lease() { return *lease_; }
    pb::Watch::Stub& watch() { return *watch_; }

    // A context that waits for a connection (through an etcd restart) until
    // the deadline.
    static void prepare(grpc::ClientContext* ctx, Deadline d);
    // A unary call: retried while etcd is unavailable (`retry`: the call is
    // safe to repeat) until the deadline.
    template <typename Req, typename Resp, typename Fn>
    Status call(const char* what, Fn fn, const Req& req, Resp* resp, Deadline d, bool retry) {
        for (;;) {
            grpc::ClientContext ctx;
            prepare(&ctx, d);
            grpc::Status s = fn(&ctx, req, resp);
            if (s.ok()) {
                answered();
                return Status::ok();
            }
            if (auth_refused(s) && reauthenticate(d)) continue;
            if (retry && s.error_code() == grpc::StatusCode::UNAVAILABLE && !d.expired()) {
                failed(s.error_message());
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
                continue;
            }
            return failed(s, what);
        }
    }

    // serializable: answered by the member the channel talks to from what
    // it has applied, without a round of the cluster's consensus (may lag
    // the leader by what is in flight; docs/design.md, "etcd at etcd's
    // speed", says where that is safe).
    Result<pb::RangeResponse> range(const std::string& key, const std::string& end, int64_t limit,
                                    bool count_only, Deadline d, bool serializable = false);
    Result<pb::TxnResponse> txn(const pb::TxnRequest& q, Deadline d);

    // Health, for status: etcd answered / failed (with why). The outage and
    // the recovery are logged once (kvs/outage.hpp); resumed(): the waits
    // that resume when it answers again.
    void answered();
    Status failed(const grpc::Status& s, const std::string& what);
    void failed(const std::string& why);
    bool reachable() const { return answered_once_.load() && outage_->up(); }
    const Outage& outage() const { return *outage_; }
    void on_recovery(std::function<uint64_t()> resumed) { resumed_ = std::move(resumed); }
    std::string last_error() const { return outage_->view().error; }
    double seconds_since_answer() const;

    // The token of the calls (shared with the channel's credentials).
    struct Token;

  private:
    // etcd refused the call's token (expired, or another member's view).
    bool auth_refused(const grpc::Status& s) const;
    bool reauthenticate(Deadline d);
    std::string advice() const;

    std::string where_;
    Security sec_;
    std::shared_ptr<Token> token_;
    std::atomic<int> reauths_{0};  // in a row, without an answer between
    std::shared_ptr<grpc::Channel> channel_;
    std::unique_ptr<pb::KV::Stub> kv_;
    std::unique_ptr<pb::Lease::Stub> lease_;
    std::unique_ptr<pb::Watch::Stub> watch_;
    std::unique_ptr<pb::Auth::Stub> auth_;
    std::atomic<bool> answered_once_{false};
    std::atomic<int64_t> last_answer_ns_{0};
    std::unique_ptr<Outage> outage_;     // made by open()
    std::function<uint64_t()> resumed_;  // set before the first call
};

}  // namespace dyad::kvs::etcd
