// SPDX-License-Identifier: Apache-2.0
// Reading a peer's JSON object field by field, with one error style.
// Every message of the wire (proto/*.hpp) parses through a Fields: a field
// that is absent where required, of another type, negative where a count
// is meant, or longer than its bound makes the parse fail with
// "<message>: field '<name>' <what is wrong>" (DYAD_RC_BADRPC, EPROTO), and
// nothing of the message is used. Optional fields come back as
// std::optional. Nothing here trusts a peer: no exception escapes, no
// allocation beyond the bounds asked for.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.hpp"

namespace dyad::proto {

// Bounds of a peer's strings unless a message says otherwise.
inline constexpr size_t kMaxName = 4096;       // a path, a key, a namespace, an id
inline constexpr size_t kMaxText = 64u << 10;  // a value, an address, a message

class Fields {
  public:
    // what: the message, for errors ("dyad.fetch", "kvs.get", "a record").
    // j is read in place: it must outlive the Fields (a temporary may not be given).
    Fields(const nlohmann::json& j, std::string what);
    Fields(nlohmann::json&&, std::string) = delete;

    // The first error met (OK while every read succeeded).
    const Status& status() const { return status_; }
    bool ok() const { return status_.is_ok(); }

    std::string str(const char* name, size_t max = kMaxName);
    std::optional<std::string> opt_str(const char* name, size_t max = kMaxName);
    uint64_t u64(const char* name);
    std::optional<uint64_t> opt_u64(const char* name);
    int64_t i64(const char* name);
    std::optional<int64_t> opt_i64(const char* name);
    bool boolean(const char* name);
    std::optional<bool> opt_bool(const char* name);
    double number(const char* name);
    std::optional<double> opt_number(const char* name);
    // An array of strings, at most max_items of at most max each.
    std::vector<std::string> strings(const char* name, size_t max_items, size_t max = kMaxName);
    std::optional<std::vector<std::string>> opt_strings(const char* name, size_t max_items,
                                                        size_t max = kMaxName);
    // A nested object or array, as it is (for a message that parses it in turn):
    // null when absent and not required.
    const nlohmann::json* object(const char* name, bool required = true);
    const nlohmann::json* array(const char* name, bool required = true);
    bool has(const char* name) const;

    // Marks the parse failed for a reason of the message's own ("field 'x' ...").
    void fail(const char* name, const std::string& why);

  private:
    const nlohmann::json* find(const char* name, bool required);
    const nlohmann::json& j_;
    std::string what_;
    Status status_;
};

// A field of the protocol's lenient kind (docs/wire-protocol.md says which):
// absent, or of another type (a negative number for an unsigned one), it
// reads as absent, and the message's default applies.
std::optional<std::string> lenient_str(const nlohmann::json& j, const char* name);
std::optional<uint64_t> lenient_u64(const nlohmann::json& j, const char* name);

// The parse of a whole message: the value, or the first field's error.
template <typename T>
Result<T> finish(const Fields& f, T value) {
    if (!f.ok()) return f.status();
    return value;
}

}  // namespace dyad::proto
