// SPDX-License-Identifier: Apache-2.0
#include "proto/fields.hpp"

#include <cerrno>

namespace dyad::proto {

Fields::Fields(const nlohmann::json& j, std::string what) : j_(j), what_(std::move(what)) {
    if (!j_.is_object()) status_ = Status(DYAD_RC_BADRPC, what_ + ": not a JSON object", EPROTO);
}

void Fields::fail(const char* name, const std::string& why) {
    if (ok()) status_ = Status(DYAD_RC_BADRPC, what_ + ": field '" + name + "' " + why, EPROTO);
}

bool Fields::has(const char* name) const {
    return j_.is_object() && j_.find(name) != j_.end() && !j_.find(name)->is_null();
}

const nlohmann::json* Fields::find(const char* name, bool required) {
    if (!ok()) return nullptr;
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) {
        if (required) fail(name, "is missing");
        return nullptr;
    }
    return &*it;
}

std::optional<std::string> Fields::opt_str(const char* name, size_t max) {
    const auto* v = find(name, false);
    if (!v) return std::nullopt;
    if (!v->is_string()) {
        fail(name, "must be a string");
        return std::nullopt;
    }
    const auto& s = v->get_ref<const std::string&>();
    if (s.size() > max) {
        fail(name, "is longer than " + std::to_string(max) + " bytes");
        return std::nullopt;
    }
    return s;
}

std::string Fields::str(const char* name, size_t max) {
    if (!has(name)) {
        find(name, true);
        return {};
    }
    return opt_str(name, max).value_or(std::string());
}

std::optional<uint64_t> Fields::opt_u64(const char* name) {
    const auto* v = find(name, false);
    if (!v) return std::nullopt;
    if (v->is_number_unsigned()) return v->get<uint64_t>();
    if (v->is_number_integer() && v->get<int64_t>() >= 0)
        return static_cast<uint64_t>(v->get<int64_t>());
    fail(name, v->is_number_integer() ? "must not be negative" : "must be an integer");
    return std::nullopt;
}

uint64_t Fields::u64(const char* name) {
    if (!has(name)) {
        find(name, true);
        return 0;
    }
    return opt_u64(name).value_or(0);
}

std::optional<int64_t> Fields::opt_i64(const char* name) {
    const auto* v = find(name, false);
    if (!v) return std::nullopt;
    if (v->is_number_unsigned()) {
        uint64_t u = v->get<uint64_t>();
        if (u > static_cast<uint64_t>(INT64_MAX)) {
            fail(name, "is out of range");
            return std::nullopt;
        }
        return static_cast<int64_t>(u);
    }
    if (v->is_number_integer()) return v->get<int64_t>();
    fail(name, "must be an integer");
    return std::nullopt;
}

int64_t Fields::i64(const char* name) {
    if (!has(name)) {
        find(name, true);
        return 0;
    }
    return opt_i64(name).value_or(0);
}

std::optional<bool> Fields::opt_bool(const char* name) {
    const auto* v = find(name, false);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) {
        fail(name, "must be true or false");
        return std::nullopt;
    }
    return v->get<bool>();
}

bool Fields::boolean(const char* name) {
    if (!has(name)) {
        find(name, true);
        return false;
    }
    return opt_bool(name).value_or(false);
}

std::optional<double> Fields::opt_number(const char* name) {
    const auto* v = find(name, false);
    if (!v) return std::nullopt;
    if (!v->is_number()) {
        fail(name, "must be a number");
        return std::nullopt;
    }
    return v->get<double>();
}

double Fields::number(const char* name) {
    if (!has(name)) {
        find(name, true);
        return 0;
    }
    return opt_number(name).value_or(0);
}

std::optional<std::vector<std::string>> Fields::opt_strings(const char* name, size_t max_items,
                                                            size_t max) {
    const auto* v = find(name, false);
    if (!v) return std::nullopt;
    if (!v->is_array()) {
        fail(name, "must be an array of strings");
        return std::nullopt;
    }
    if (v->size() > max_items) {
        fail(name, "has more than " + std::to_string(max_items) + " items");
        return std::nullopt;
    }
    std::vector<std::string> out;
    out.reserve(v->size());
    for (const auto& e : *v) {
        if (!e.is_string() || e.get_ref<const std::string&>().size() > max) {
            fail(name, "must hold strings of at most " + std::to_string(max) + " bytes");
            return std::nullopt;
        }
        out.push_back(e.get<std::string>());
    }
    return out;
}

std::vector<std::string> Fields::strings(const char* name, size_t max_items, size_t max) {
    if (!has(name)) {
        find(name, true);
        return {};
    }
    return opt_strings(name, max_items, max).value_or(std::vector<std::string>());
}

const nlohmann::json* Fields::object(const char* name, bool required) {
    const auto* v = find(name, required);
    if (v && !v->is_object()) {
        fail(name, "must be an object");
        return nullptr;
    }
    return v;
}

const nlohmann::json* Fields::array(const char* name, bool required) {
    const auto* v = find(name, required);
    if (v && !v->is_array()) {
        fail(name, "must be an array");
        return nullptr;
    }
    return v;
}

std::optional<std::string> lenient_str(const nlohmann::json& j, const char* name) {
    if (!j.is_object()) return std::nullopt;
    auto it = j.find(name);
    if (it == j.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
}

std::optional<uint64_t> lenient_u64(const nlohmann::json& j, const char* name) {
    if (!j.is_object()) return std::nullopt;
    auto it = j.find(name);
    if (it == j.end() || !it->is_number_integer()) return std::nullopt;
    if (it->is_number_unsigned()) return it->get<uint64_t>();
    auto v = it->get<int64_t>();
    if (v < 0) return std::nullopt;
    return static_cast<uint64_t>(v);
}

}  // namespace dyad::proto
