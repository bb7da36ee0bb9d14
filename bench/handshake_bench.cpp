// SPDX-License-Identifier: Apache-2.0
// The price of the authenticated hello, alone: connections opened to a real
// rpc::Server (its loop on a thread of its own) over loopback TCP, each
// connect + hello timed, with and without the job key, interleaved in
// rounds. Prints JSON: the median and 90th percentile per connection for
// both, in microseconds. bench/auth_bench.py runs it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "rpc/client.hpp"
#include "rpc/server.hpp"
#include "server_loop.hpp"

using namespace dyad;

namespace {

// A real server on loopback, its loop on a thread (the unit tests' helper).
std::unique_ptr<test_support::ServerLoop> serve(std::shared_ptr<const auth::Key> key) {
    return std::make_unique<test_support::ServerLoop>([key](rpc::Server& s) {
        s.set_auth({key, {}, false});
    });
}

double connect_us(const std::string& uri, const rpc::Credentials& c) {
    auto t0 = std::chrono::steady_clock::now();
    auto conn = rpc::Connection::connect(uri, Deadline::after(10), c);
    auto dt = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0);
    if (!conn) {
        std::fprintf(stderr, "handshake_bench: %s\n", conn.status().to_string().c_str());
        std::exit(1);
    }
    return dt.count();
}

double pct(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
    int n = argc > 1 ? std::atoi(argv[1]) : 2000;
    auto key = auth::Key::from_secret(auth::new_nonce());
    auto keyed = serve(key);
    auto open = serve(nullptr);
    rpc::Credentials with;
    with.key = key;
    rpc::Credentials without;
    std::vector<double> a, b;
    for (int i = 0; i < n; ++i) {  // interleaved: the same conditions for both
        a.push_back(connect_us(keyed->uri, with));
        b.push_back(connect_us(open->uri, without));
    }
    std::printf(
        "{\"connections\": %d, \"key_median_us\": %.1f, \"key_p90_us\": %.1f, "
        "\"no_key_median_us\": %.1f, \"no_key_p90_us\": %.1f}\n",
        n, pct(a, 0.5), pct(a, 0.9), pct(b, 0.5), pct(b, 0.9));
    return 0;
}
