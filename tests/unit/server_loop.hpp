// SPDX-License-Identifier: Apache-2.0
// A real rpc::Server on 127.0.0.1 (and, if asked, a Unix socket), its event
// loop on a thread of its own, for unit tests that talk to it with the
// blocking client on the test thread.
#pragma once

#include <functional>
#include <future>
#include <optional>
#include <thread>

#include <asio.hpp>

#include "rpc/server.hpp"

namespace dyad::test_support {

class ServerLoop {
  public:
    // `setup` registers handlers before the server listens; with
    // `unix_path`, it also listens there (unix_uri).
    explicit ServerLoop(const std::function<void(rpc::Server&)>& setup,
                        const std::string& unix_path = "")
        : server(io, {{"service_id", "test"}}) {
        setup(server);
        uri = server.listen_tcp("127.0.0.1", 0).value();
        if (!unix_path.empty()) unix_uri = server.listen_unix(unix_path).value();
        guard.emplace(asio::make_work_guard(io));
        th = std::thread([this] { io.run(); });
    }
    ~ServerLoop() {
        asio::post(io, [this] {
            server.stop();
            guard.reset();
            io.stop();
        });
        th.join();
    }
    // Runs fn on the loop and returns its result.
    template <class F>
    auto on_loop(F fn) -> decltype(fn()) {
        std::promise<decltype(fn())> p;
        asio::post(io, [&] { p.set_value(fn()); });
        return p.get_future().get();
    }

    asio::io_context io;
    rpc::Server server;
    std::string uri;
    std::string unix_uri;
    std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
    std::thread th;
};

}  // namespace dyad::test_support
