// SPDX-License-Identifier: Apache-2.0
// etcd's own figures for bench/store_bench.py, measured with the same gRPC
// client code as dyadd's etcd backend (src/kvs/etcd), without DYAD:
//   etcd_raw ENDPOINT put-rate N           N sequential Puts: "puts_per_s"
//   etcd_raw ENDPOINT txn-rate N           N sequential create-if-absent
//                                          transactions (dyadd's publish):
//                                          "txns_per_s"
//   etcd_raw ENDPOINT put-to-watch N [GAP] a watch on a prefix, then N Puts one
//                                          at a time (GAP seconds idle before
//                                          each, default 0): seconds from each
//                                          Put's call to its event, one per line
//   etcd_raw ENDPOINT get N [GAP]          N serializable Ranges of one key
//                                          (dyadd's lookup of a record), GAP
//                                          seconds idle before each: seconds
//                                          each, one per line
//   etcd_raw ENDPOINT fill N PREFIX VALUE  N keys PREFIX%09d = VALUE, in
//                                          transactions of 128 puts
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "kvs/etcd/etcd_client.hpp"

using namespace dyad::kvs::etcd;
using clk = std::chrono::steady_clock;

static double secs(clk::time_point a, clk::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

static bool put(Client& c, const std::string& k, const std::string& v) {
    pb::PutRequest q;
    q.set_key(k);
    q.set_value(v);
    pb::PutResponse a;
    grpc::ClientContext ctx;
    Client::prepare(&ctx, dyad::Deadline::after(30));
    return c.kv().Put(&ctx, q, &a).ok();
}

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(
            stderr,
            "usage: %s HOST:PORT put-rate|txn-rate|put-to-watch|get|fill N [GAP | PREFIX VALUE]\n",
            argv[0]);
        return 2;
    }
    auto c = Client::open({argv[1]});
    if (!c) {
        std::fprintf(stderr, "etcd_raw: %s\n", c.status().message().c_str());
        return 1;
    }
    Client& cl = *c.value();
    const std::string mode = argv[2];
    const long n = std::atol(argv[3]);
    // Idle before each timed call: a service waits idle between requests,
    // and a thread woken from idle answers later than a busy loop does.
    const double gap = argc > 4 && mode != "fill" ? std::atof(argv[4]) : 0;
    auto idle = [gap] {
        if (gap > 0) std::this_thread::sleep_for(std::chrono::duration<double>(gap));
    };
    if (mode == "put-rate") {
        auto t0 = clk::now();
        for (long i = 0; i < n; ++i)
            if (!put(cl, "/bench/rate/" + std::to_string(i), std::string(300, 'x'))) return 1;
        std::printf("%.1f\n", static_cast<double>(n) / secs(t0, clk::now()));
    } else if (mode == "txn-rate") {
        auto t0 = clk::now();
        for (long i = 0; i < n; ++i) {
            const std::string k = "/bench/txn/" + std::to_string(i);
            pb::TxnRequest t;
            auto* c = t.add_compare();
            c->set_key(k);
            c->set_target(pb::Compare::CREATE);
            c->set_result(pb::Compare::EQUAL);
            c->set_create_revision(0);
            auto* p = t.add_success()->mutable_request_put();
            p->set_key(k);
            p->set_value(std::string(300, 'x'));
            t.add_failure()->mutable_request_range()->set_key(k);
            if (!cl.txn(t, dyad::Deadline::after(30))) return 1;
        }
        std::printf("%.1f\n", static_cast<double>(n) / secs(t0, clk::now()));
    } else if (mode == "put-to-watch") {
        grpc::ClientContext ctx;
        auto stream = cl.watch().Watch(&ctx);
        pb::WatchRequest q;
        q.mutable_create_request()->set_key("/bench/watch/");
        q.mutable_create_request()->set_range_end(prefix_end("/bench/watch/"));
        if (!stream->Write(q)) return 1;
        pb::WatchResponse a;
        if (!stream->Read(&a) || !a.created()) return 1;
        for (long i = 0; i < n; ++i) {
            idle();
            auto t1 = clk::now();
            if (!put(cl, "/bench/watch/" + std::to_string(i), std::string(300, 'x'))) return 1;
            do {
                if (!stream->Read(&a)) return 1;
            } while (a.events_size() == 0);
            std::printf("%.9f\n", secs(t1, clk::now()));
        }
        ctx.TryCancel();
    } else if (mode == "get") {
        if (!put(cl, "/bench/get/k", std::string(300, 'x'))) return 1;
        for (long i = 0; i < n; ++i) {
            idle();
            auto t1 = clk::now();
            auto r = cl.range("/bench/get/k", "", 1, false, dyad::Deadline::after(30), true);
            if (!r || r->kvs_size() != 1) return 1;
            std::printf("%.9f\n", secs(t1, clk::now()));
        }
    } else if (mode == "fill" && argc == 6) {
        const std::string prefix = argv[4], value = argv[5];
        char num[32];
        for (long i = 0; i < n;) {
            pb::TxnRequest t;
            for (int j = 0; j < 128 && i < n; ++j, ++i) {
                std::snprintf(num, sizeof num, "%09ld", i);
                auto* p = t.add_success()->mutable_request_put();
                p->set_key(prefix + num);
                p->set_value(value);
            }
            auto r = cl.txn(t, dyad::Deadline::after(60));
            if (!r) {
                std::fprintf(stderr, "etcd_raw: %s\n", r.status().message().c_str());
                return 1;
            }
        }
    } else {
        std::fprintf(stderr, "etcd_raw: unknown mode %s\n", mode.c_str());
        return 2;
    }
    return 0;
}
