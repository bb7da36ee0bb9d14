// SPDX-License-Identifier: Apache-2.0
// The service's side of the fetch conversation over the rpc layer: what a
// transport's sender sees of a `dyad.fetch` request (dtl::SendChannel).
// The request's parsing, the END trailer and error answers stay with the
// service (fetch.cpp).
#pragma once

#include <memory>

#include "dtl/channel.hpp"
#include "rpc/server.hpp"

namespace dyad::service {

class RequestChannel final : public dtl::SendChannel {
  public:
    explicit RequestChannel(std::shared_ptr<rpc::Request> r) : r_(std::move(r)) {}
    asio::io_context& io() override { return r_->io(); }
    void send(nlohmann::json meta, asio::const_buffer data, WriteDone done) override {
        r_->respond(std::move(meta), data, std::move(done));
    }
    void send_file(nlohmann::json meta, int fd, uint64_t off, size_t len, WriteDone done) override {
        r_->respond_file(std::move(meta), fd, off, len, std::move(done));
    }
    void on_cancel(std::function<void()> fn) override { r_->on_cancel(std::move(fn)); }
    void on_update(std::function<void(const nlohmann::json&)> fn) override {
        r_->on_update(std::move(fn));
    }
    void close() override { r_->close_connection(); }
    bool can_send_fd() const override { return r_->over_unix(); }
    void send_fd(nlohmann::json meta, int fd, WriteDone done) override {
        r_->respond_with_fd(std::move(meta), fd, std::move(done));
    }

  private:
    std::shared_ptr<rpc::Request> r_;
};

}  // namespace dyad::service
