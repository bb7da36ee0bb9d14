// SPDX-License-Identifier: Apache-2.0
// Status and Result: errors carry a code (mapped to dyad_rc_t at the C
// boundary), the errno that caused them (0 if none) and a message that says
// what failed, on which file, and what to do.
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

#include <dyad/common/dyad_rc.h>

namespace dyad {

class [[nodiscard]] Status {
  public:
    Status() = default;
    Status(dyad_rc_t rc, std::string msg, int err = 0)
        : rc_(rc), errno_(err), msg_(std::move(msg)) {}

    static Status ok() { return {}; }
    static Status sys(std::string what, int err = errno) {
        return {DYAD_RC_SYSFAIL, std::move(what), err};
    }

    bool is_ok() const { return rc_ == DYAD_RC_OK; }
    explicit operator bool() const { return is_ok(); }
    dyad_rc_t rc() const { return rc_; }
    int err() const { return errno_; }
    const std::string& message() const { return msg_; }
    // "message: strerror(errno)"
    std::string to_string() const;
    // Prepends context: "context: message".
    Status& wrap(const std::string& context) {
        if (!is_ok()) msg_ = context + ": " + msg_;
        return *this;
    }

  private:
    dyad_rc_t rc_ = DYAD_RC_OK;
    int errno_ = 0;
    std::string msg_;
};

// A value or a Status (a small std::expected).
template <typename T>
class [[nodiscard]] Result {
  public:
    Result(T v) : v_(std::move(v)) {}
    Result(Status s) : v_(std::move(s)) {}

    bool is_ok() const { return v_.index() == 0; }
    explicit operator bool() const { return is_ok(); }
    T& value() & { return std::get<0>(v_); }
    T&& value() && { return std::get<0>(std::move(v_)); }
    const T& value() const& { return std::get<0>(v_); }
    T* operator->() { return &std::get<0>(v_); }
    const T* operator->() const { return &std::get<0>(v_); }
    T& operator*() { return std::get<0>(v_); }
    const Status& status() const {
        static const Status ok_status;
        return is_ok() ? ok_status : std::get<1>(v_);
    }

  private:
    std::variant<T, Status> v_;
};

const char* rc_name(dyad_rc_t rc);
// What a code means, in a few words.
const char* rc_text(dyad_rc_t rc);
// The `dyad` tool's exit status for a code.
int rc_exit_code(dyad_rc_t rc);

}  // namespace dyad
