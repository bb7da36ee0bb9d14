// SPDX-License-Identifier: Apache-2.0
// The consumer's side of the fetch conversation over the rpc layer: sends
// the `dyad.fetch` request, filters and checks the answer's frames for the
// transport's receiver (dtl::FetchChannel), and checks the END trailer
// against what arrived.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.hpp"
#include "dtl/channel.hpp"
#include "proto/fetch.hpp"
#include "rpc/client.hpp"

namespace dyad::client {

class RpcFetchChannel final : public dtl::FetchChannel {
  public:
    RpcFetchChannel(rpc::Connection& conn, double idle_s) : conn_(conn), idle_s_(idle_s) {}

    // Sends the fetch request (the receiver's fields plus what to fetch);
    // dyad.fetch_many's answers come the same way, one per file.
    [[nodiscard]] Status open(const nlohmann::json& args, Deadline deadline,
                              const char* topic = "dyad.fetch");

    Result<Message> next() override;
    Status read(void* p, size_t n) override;
    Status update(const nlohmann::json& meta) override;
    int fd() const override { return conn_.fd(); }
    bool buffered() const override { return conn_.buffered(); }
    double idle_s() const override { return idle_s_; }
    UniqueFd take_fd() override { return std::move(answer_fd_); }

    bool ended() const { return ended_; }

  private:
    rpc::Connection& conn_;
    double idle_s_;
    uint32_t tag_ = 0;
    bool opened_ = false;
    bool answered_ = false;
    bool ended_ = false;
    size_t unread_ = 0;   // data of the last message not taken by read()
    UniqueFd answer_fd_;  // passed with this fetch's first answer, until taken
};

// What the sink took, against the END trailer.
struct Received {
    uint64_t bytes = 0;
    std::string xxh3;            // of the bytes that passed through the sink
    bool kernel_copied = false;  // in-kernel copy (LOCAL): no bytes to hash
};
// DYAD_RC_BADCHECKSUM (or BADRPC for a malformed trailer) naming the file.
[[nodiscard]] Status verify_trailer(const nlohmann::json& trailer, const Received& got,
                                    const std::string& upath);

// What the owner says it sent of a whole file: size and XXH3-64, from an
// END trailer (proto::FetchEnd, the checksum in hex), or from a compact
// dyad.fetch_many header (as numbers).
struct Sent {
    uint64_t size = 0;
    uint64_t xxh3 = 0;
};
// BADRPC (EPROTO) naming the file when the trailer lacks either (or its
// checksum is not 1 to 16 hex digits).
[[nodiscard]] Result<Sent> sent_of(const nlohmann::json& trailer, const std::string& upath);
// The file's n bytes at p against it: BADCHECKSUM naming the file if
// they differ.
[[nodiscard]] Status verify_sent(const Sent& sent, const void* p, size_t n,
                                 const std::string& upath);

}  // namespace dyad::client
