// SPDX-License-Identifier: Apache-2.0
// Long waits seen by the service that holds them (issue 46, item 3): a
// client's wait-for-create (kvs.get with wait) that has lasted kFirstLine
// seconds is logged in the service's log, one line naming the file (key and
// namespace), the waiting client (pid, uid, address) and how long it has
// waited, again as it goes on (at 10, 20, 40 ... s, then every
// kLongestGap). A client asks again every 30 s (the service answers TIMEOUT
// at --max-wait): a request for the same file from the same client that
// comes within kRejoin seconds of the last one goes on counting the same
// wait. Everything runs on the server's loop; at most kMaxWaits waits are
// followed at once (the others are not logged, and still served).
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

namespace dyad::rpc {
class Request;
}

namespace dyad::kvs {

class WaitLog : public std::enable_shared_from_this<WaitLog> {
  public:
    static constexpr double kFirstLine = 5.0;     // seconds before the first line
    static constexpr double kLongestGap = 600.0;  // between two lines, at most
    static constexpr double kRejoin = 5.0;        // a request again within this: the same wait
    static constexpr size_t kMaxWaits = 4096;

    // A wait request for `key` of namespace `ns` (on the loop).
    void watch(const std::shared_ptr<rpc::Request>& r, const std::string& ns,
               const std::string& key);
    // Waits followed now (for tests and status).
    size_t size() const { return waits_.size(); }

  private:
    using Clock = std::chrono::steady_clock;
    struct Wait {
        std::string ns, key, who;
        Clock::time_point start, next, idle_since;
        double gap = kFirstLine;
        std::vector<std::weak_ptr<rpc::Request>> requests;  // the ones still held
    };
    void tick();
    void arm(asio::io_context* io);  // null: the timer made before

    struct Fresh {
        std::weak_ptr<rpc::Request> request;
        std::string ns, key, who;
    };
    std::map<std::string, Wait> waits_;  // by client and file
    std::vector<Fresh> fresh_;           // new since the last tick
    std::unique_ptr<asio::steady_timer> timer_;
    bool armed_ = false;
};

}  // namespace dyad::kvs
