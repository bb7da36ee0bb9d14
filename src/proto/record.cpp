// SPDX-License-Identifier: Apache-2.0
#include "proto/record.hpp"

#include <cstdlib>
#include <iterator>
#include <string_view>

#include "common/keygen.hpp"

namespace dyad::proto {

nlohmann::json Record::to_json() const {
    nlohmann::json j = {{"path", upath},
                        {"owner", owner},
                        {"node", node},
                        {"producer_dir", producer_dir},
                        {"endpoints", endpoints},
                        {"size", size},
                        {"mtime_ns", mtime_ns},
                        {"mode", mode},
                        {"ino", ino}};
    if (rank) j["rank"] = *rank;
    return j;
}

namespace {

// The record's fields.
enum class Field {
    path,
    owner,
    node,
    producer_dir,
    endpoints,
    size,
    mtime_ns,
    mode,
    ino,
    rank,
    other
};

// Their names, in the order of Field (other has none).
constexpr const char* kNames[] = {"path", "owner",    "node", "producer_dir", "endpoints",
                                  "size", "mtime_ns", "mode", "ino",          "rank"};
static_assert(std::size(kNames) == static_cast<size_t>(Field::other));

Field field_of(std::string_view k) {
    for (size_t i = 0; i < std::size(kNames); ++i)
        if (k == kNames[i]) return static_cast<Field>(i);
    return Field::other;
}

// Reads a record's fields as the parser meets them, without building the
// document: a consumer reads one record per file, and building the tree of
// maps took half of each read (measured 6.0 against 3.1 us per record).
// Unknown fields, of any shape, are skipped.
// The rules are those of the record's format (docs/design.md, the store's
// "Value"): path, owner, endpoints and size are required; numbers must be
// integers (a float such as 1e300 converted to an integer would be
// undefined behaviour); a field of the wrong type is an error; when a field
// is repeated, the last one counts.
class RecordReader final : public nlohmann::json_sax<nlohmann::json> {
  public:
    explicit RecordReader(Record* r) : r_(r) {}

    bool null() override { return scalar(); }
    bool boolean(bool) override { return scalar(); }
    bool number_integer(number_integer_t v) override {
        if (in_endpoints()) return not_a_string();
        if (!value_here()) return true;
        return integer(static_cast<uint64_t>(v), v >= 0);
    }
    bool number_unsigned(number_unsigned_t v) override {
        if (in_endpoints()) return not_a_string();
        if (!value_here()) return true;
        return integer(v, true);
    }
    bool number_float(number_float_t, const string_t&) override {
        if (in_endpoints()) return not_a_string();
        if (!value_here()) return true;
        if (field_ == Field::size || field_ == Field::mtime_ns || field_ == Field::mode ||
            field_ == Field::ino)
            return fail(std::string("'") + name() + "' is not an integer");
        return scalar();
    }
    bool string(string_t& s) override {
        if (in_endpoints()) {
            r_->endpoints.push_back(std::move(s));
            return true;
        }
        if (!value_here()) return true;
        switch (field_) {
            case Field::path:
                r_->upath = std::move(s);
                seen_path_ = true;
                return true;
            case Field::owner:
                r_->owner = std::move(s);
                seen_owner_ = true;
                return true;
            case Field::node:
                node_ = std::move(s);
                seen_node_ = true;
                return true;
            case Field::producer_dir:
                r_->producer_dir = std::move(s);
                return true;
            default:
                return scalar();
        }
    }
    bool binary(binary_t&) override { return scalar(); }  // not from JSON text
    bool start_object(std::size_t) override { return nested(true); }
    bool key(string_t& k) override {
        if (depth_ == 1) field_ = field_of(k);
        return true;
    }
    bool end_object() override {
        --depth_;
        if (depth_ == 0) object_done_ = true;
        return true;
    }
    bool start_array(std::size_t) override {
        if (depth_ == 1 && field_ == Field::endpoints) {
            ++depth_;
            r_->endpoints.clear();
            in_endpoints_ = true;
            seen_endpoints_ = true;
            return true;
        }
        return nested(false);
    }
    bool end_array() override {
        if (depth_ == 2) in_endpoints_ = false;
        --depth_;
        return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
        return false;
    }

    // After the parse: the record, or what is wrong with it.
    Status finish(bool parsed) {
        if (!error_.empty())
            return Status(DYAD_RC_BADMETADATA, "malformed metadata record: " + error_, EPROTO);
        if (!parsed || !object_done_)
            return Status(DYAD_RC_BADMETADATA,
                          "metadata record is not JSON: was it written by this DYAD version?",
                          EPROTO);
        const char* missing = !seen_path_        ? "path"
                              : !seen_owner_     ? "owner"
                              : !seen_endpoints_ ? "endpoints"
                              : !seen_size_      ? "size"
                                                 : nullptr;
        if (missing)
            return Status(DYAD_RC_BADMETADATA,
                          std::string("malformed metadata record: no '") + missing + "'", EPROTO);
        r_->node = seen_node_ ? std::move(node_) : r_->owner;
        return Status::ok();
    }

  private:
    const char* name() const {
        return field_ == Field::other ? "?" : kNames[static_cast<size_t>(field_)];
    }
    // A value directly under the record (not inside an unknown field).
    bool value_here() const { return depth_ == 1; }
    // An element of the endpoints array.
    bool in_endpoints() const { return depth_ == 2 && in_endpoints_; }
    bool not_a_string() { return fail("'endpoints' holds something that is not a string"); }
    bool fail(std::string why) {
        if (error_.empty()) error_ = std::move(why);
        return false;
    }
    bool wrong_type() { return fail(std::string("'") + name() + "' has the wrong type"); }
    // null, true, false, a float or a string where no string belongs.
    bool scalar() {
        if (in_endpoints()) return not_a_string();
        if (!value_here()) return true;  // the whole text, or inside an unknown field
        return other_value();
    }
    // An object or an array starts.
    bool nested(bool object) {
        if (depth_ == 0) {  // the record itself: an object, nothing else
            ++depth_;
            return object;
        }
        if (in_endpoints()) return not_a_string();
        ++depth_;
        return depth_ == 2 ? other_value() : true;
    }
    // A value of field_ that is not an integer and not a string it takes.
    // A rank that is not a small unsigned integer is ignored, as an
    // unknown field would be.
    bool other_value() {
        if (field_ == Field::rank) r_->rank.reset();
        if (field_ == Field::rank || field_ == Field::other) return true;
        return wrong_type();
    }
    bool integer(uint64_t v, bool non_negative) {
        switch (field_) {
            case Field::size:
                r_->size = v;
                seen_size_ = true;
                return true;
            case Field::mtime_ns:
                r_->mtime_ns = static_cast<int64_t>(v);
                return true;
            case Field::mode:
                r_->mode = static_cast<uint32_t>(v);
                return true;
            case Field::ino:
                r_->ino = v;
                return true;
            case Field::rank:
                if (non_negative && v < UINT32_MAX)
                    r_->rank = static_cast<uint32_t>(v);
                else
                    r_->rank.reset();
                return true;
            case Field::other:
                return true;
            default:
                return wrong_type();
        }
    }

    Record* r_;
    int depth_ = 0;
    Field field_ = Field::other;
    bool in_endpoints_ = false;
    bool object_done_ = false;
    bool seen_path_ = false, seen_owner_ = false, seen_node_ = false, seen_endpoints_ = false,
         seen_size_ = false;
    std::string node_;
    std::string error_;
};

// The text to_json().dump() writes, read in one pass: an object whose
// values are strings, integers and arrays of strings, with no whitespace,
// escapes, control characters or bytes past ASCII. Anything else is left to
// RecordReader, as is every record with something wrong in it: this reading
// never refuses, it only declines (nullopt). Where it reads, it reads what
// RecordReader reads (tests/unit/test_record.cpp and the fuzzer compare
// them). Measured on a typical 305-byte record, 200,000 reads x 3:
// 2.4-3.3 us per record through the SAX reader, 0.5 us here.
class CanonicalReader {
  public:
    explicit CanonicalReader(std::string_view t) : p_(t.data()), e_(t.data() + t.size()) {}

    std::optional<Record> read() {
        Record r;
        Seen seen;
        if (!lit('{') || lit('}')) return std::nullopt;
        do {
            std::string_view key;
            if (!string(&key) || !lit(':') || p_ == e_) return std::nullopt;
            const Field f = field_of(key);
            bool ok;
            if (*p_ == '"') {
                std::string_view v;
                ok = string(&v) && text_field(f, v, r, seen);
            } else if (*p_ == '[') {
                ok = f == Field::endpoints && endpoints(r, seen);
            } else {
                uint64_t v;
                bool non_negative;
                ok = integer(&v, &non_negative) && number_field(f, v, non_negative, r, seen);
            }
            if (!ok) return std::nullopt;
        } while (lit(','));
        if (!lit('}') || p_ != e_ || !seen.path || !seen.owner || !seen.endpoints || !seen.size)
            return std::nullopt;
        r.node = seen.node ? std::move(seen.node_text) : r.owner;
        return r;
    }

  private:
    // The fields a record must have, seen so far (and the node's value).
    struct Seen {
        bool path = false, owner = false, node = false, endpoints = false, size = false;
        std::string node_text;
    };

    // A string value; false: not a field that is a string.
    static bool text_field(Field f, std::string_view v, Record& r, Seen& seen) {
        switch (f) {
            case Field::path:
                r.upath.assign(v);
                seen.path = true;
                return true;
            case Field::owner:
                r.owner.assign(v);
                seen.owner = true;
                return true;
            case Field::node:
                seen.node_text.assign(v);
                seen.node = true;
                return true;
            case Field::producer_dir:
                r.producer_dir.assign(v);
                return true;
            case Field::other:
                return true;
            default:
                return false;
        }
    }

    // The endpoints' array of strings, at its '['.
    bool endpoints(Record& r, Seen& seen) {
        ++p_;
        r.endpoints.clear();
        seen.endpoints = true;
        if (lit(']')) return true;
        do {
            std::string_view v;
            if (!string(&v)) return false;
            r.endpoints.emplace_back(v);
        } while (lit(','));
        return lit(']');
    }

    // An integer value; false: not a field that is a number.
    static bool number_field(Field f, uint64_t v, bool non_negative, Record& r, Seen& seen) {
        switch (f) {
            case Field::size:
                r.size = v;
                seen.size = true;
                return true;
            case Field::mtime_ns:
                r.mtime_ns = static_cast<int64_t>(v);
                return true;
            case Field::mode:
                r.mode = static_cast<uint32_t>(v);
                return true;
            case Field::ino:
                r.ino = v;
                return true;
            case Field::rank:
                if (non_negative && v < UINT32_MAX)
                    r.rank = static_cast<uint32_t>(v);
                else
                    r.rank.reset();
                return true;
            case Field::other:
                return true;
            default:
                return false;
        }
    }

    bool lit(char c) {
        if (p_ == e_ || *p_ != c) return false;
        ++p_;
        return true;
    }
    // "...": printable ASCII, no escapes.
    bool string(std::string_view* out) {
        if (!lit('"')) return false;
        const char* start = p_;
        for (; p_ != e_ && *p_ != '"'; ++p_) {
            const auto c = static_cast<unsigned char>(*p_);
            if (c < 0x20 || c == '\\' || c >= 0x80) return false;
        }
        if (p_ == e_) return false;
        *out = std::string_view(start, static_cast<size_t>(p_ - start));
        ++p_;
        return true;
    }
    // -?(0|[1-9][0-9]*), as the JSON reader would hand it over: a value
    // that fits 64 bits (at most 19 digits; -INT64_MAX at least), not a float.
    bool integer(uint64_t* v, bool* non_negative) {
        const bool negative = lit('-');
        const char* start = p_;
        uint64_t x = 0;
        for (; p_ != e_ && *p_ >= '0' && *p_ <= '9'; ++p_)
            x = x * 10 + static_cast<uint64_t>(*p_ - '0');
        const size_t digits = static_cast<size_t>(p_ - start);
        if (digits == 0 || digits > 19 || (digits > 1 && *start == '0') ||
            (negative && x > static_cast<uint64_t>(INT64_MAX)))
            return false;
        if (p_ != e_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) return false;
        *non_negative = !negative || x == 0;
        *v = negative ? static_cast<uint64_t>(-static_cast<int64_t>(x)) : x;
        return true;
    }

    const char* p_;
    const char* e_;
};

}  // namespace

namespace record_detail {

std::optional<Record> read_canonical(std::string_view text) {
    return CanonicalReader(text).read();
}

Result<Record> read_any(const std::string& text) {
    Record r;
    RecordReader reader(&r);
    bool parsed =
        nlohmann::json::sax_parse(text, &reader, nlohmann::json::input_format_t::json, true, false);
    Status s = reader.finish(parsed);
    if (!s) return s;
    return r;
}

}  // namespace record_detail

Result<Record> Record::from_json(const std::string& text, uint64_t generation) {
    auto canonical = record_detail::read_canonical(text);
    auto r = canonical ? Result<Record>(std::move(*canonical)) : record_detail::read_any(text);
    if (r) r.value().generation = generation;
    return r;
}

uint32_t Record::owner_rank() const {
    if (rank) return *rank;
    // Records of services that did not say their rank (none of this release).
    char* end = nullptr;
    unsigned long v = std::strtoul(node.c_str(), &end, 10);
    if (!node.empty() && *end == '\0') return static_cast<uint32_t>(v);
    // Non-numeric node names: a stable 31-bit number.
    uint64_t h[2];
    murmur3_x64_128(node.data(), node.size(), 104723u, h);
    return static_cast<uint32_t>(h[0] & 0x7fffffff);
}

std::string record_path(const std::string& value) {
    auto j = nlohmann::json::parse(value, nullptr, false);
    if (!j.is_object()) return "";
    auto u = j.find(kNames[static_cast<size_t>(Field::path)]);
    return u != j.end() && u->is_string() ? u->get<std::string>() : "";
}

std::optional<std::string> record_owner(const std::string& value) {
    auto j = nlohmann::json::parse(value, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    auto o = j.find(kNames[static_cast<size_t>(Field::owner)]);
    if (o == j.end() || !o->is_string()) return std::nullopt;
    return o->get<std::string>();
}

}  // namespace dyad::proto
