// SPDX-License-Identifier: Apache-2.0
// The messages of dyad.fetch and dyad.fetch_many (docs/wire-protocol.md,
// section 7): the consumer's request, the END trailer and the per-file
// answers of fetch_many. A receiver's own fields (UCX, MARGO) travel in the
// request beside these; the transports read and write them (src/dtl).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.hpp"

namespace dyad::proto {

// dyad.fetch's arguments.
struct FetchRequest {
    std::string upath;        // as the consumer names it (the service normalizes it)
    std::string transport;    // "": not given (the service's universal backend)
    uint64_t generation = 0;  // of the consumer's record; 0: not checked
    // Where the record is: used only by a service that restarted since it published.
    std::optional<std::string> ns, key;
    // A byte range (dyad_consume_range): only [offset, offset + length) of
    // the file, clipped to its size, is sent. Both or neither; absent: the
    // whole file.
    std::optional<uint64_t> offset, length;
    // Asks a replica holder for its copy of generation `generation`
    // (docs/design.md, "Replicas"); an older service ignores the field and
    // refuses the file as not published by it.
    bool replica = false;

    // The transport a request asks for ("" when absent or not a string);
    // read before the rest, so an unknown transport is the error a peer sees first.
    static std::string transport_of(const nlohmann::json& args);
    // The same, telling absent (or not a string) from given: a service
    // serves an absent one with its universal backend, and refuses a
    // transport it does not serve, "" included.
    static std::optional<std::string> transport_asked(const nlohmann::json& args);
    // EINVAL / BADUNPACK "fetch request without 'upath'" when upath is
    // missing or not a string; ns, key and generation of another type are
    // taken as absent (the protocol's rule). A range is refused (EINVAL /
    // BADUNPACK) when only one of offset and length is given, either is not
    // an unsigned integer, or offset + length overflows: served whole
    // instead, it would not be what was asked for.
    static Result<FetchRequest> parse(const nlohmann::json& args);
    // Into `args` (which may already hold the receiver's fields).
    void build_into(nlohmann::json& args) const;
    nlohmann::json build() const;
};

// An XXH3-64 as the wire writes it (1 to 16 hex digits), as a number;
// nullopt for anything else.
std::optional<uint64_t> digest_of_hex(const std::string& hex);

// The END of a fetch: the size sent and the XXH3-64 of the bytes, in hex
// ("" for an in-kernel copy, LOCAL).
struct FetchEnd {
    uint64_t size = 0;
    std::string xxh3;
    // The checksum as a number (digest_of_hex).
    std::optional<uint64_t> digest() const { return digest_of_hex(xxh3); }
    // From a size and a checksum given as a number (16 hex digits, as
    // Xxh3::to_hex writes them).
    static FetchEnd of(uint64_t size, uint64_t digest);
    // BADRPC / EPROTO "the end of the fetch of 'UPATH' lacks its size or
    // checksum: ..." when either is missing.
    static Result<FetchEnd> parse(const nlohmann::json& meta, const std::string& upath);
    nlohmann::json build() const;
};

// The first answer of a fetch: the size to expect and the transport that
// sends it (a transport may add its own fields, given in `extra`: LOCAL's
// "offset", where a byte range starts in the file it passes).
struct FetchStart {
    uint64_t size = 0;
    std::string transport;
    nlohmann::json build(nlohmann::json extra = nlohmann::json::object()) const;
    // size alone is required (the receiver checks the rest it needs).
    static Result<FetchStart> parse(const nlohmann::json& meta);
};

// Most files one dyad.fetch_many may name.
inline constexpr size_t kFetchManyFiles = 64;

// dyad.fetch_many's arguments.
struct FetchManyRequest {
    struct File {
        std::optional<std::string> upath;  // absent: this entry is refused alone
        uint64_t generation = 0;
        std::optional<std::string> ns, key;
    };
    std::string transport;
    std::vector<File> files;
    bool raw_answer = false;  // "answer": "raw" (compact answers)

    // EINVAL / BADUNPACK "fetch_many request without 'files' (1 to 64 of
    // them)" when files is missing, not an array, empty or too long.
    static Result<FetchManyRequest> parse(const nlohmann::json& args);
    nlohmann::json build() const;
    // One entry as a FetchRequest (for the served-file checks).
    FetchRequest one(size_t i) const;
    // The same, or EINVAL / BADUNPACK "fetch_many entry without 'upath'"
    // for an entry without one (that file alone is refused).
    Result<FetchRequest> entry(size_t i) const;
};

// One answer frame of fetch_many (JSON form): a file served (size, xxh3)
// or refused (rc, errno, msg).
struct FetchManyItem {
    uint64_t index = 0;
    bool refused = false;
    uint64_t size = 0;
    std::string xxh3;
    int rc = 0, err = 0;
    std::string msg;
    static FetchManyItem served(uint64_t index, uint64_t size, std::string xxh3);
    static FetchManyItem refusal(uint64_t index, const Status& st);
    // A served item's size and checksum, as a fetch's END says them.
    FetchEnd end() const { return FetchEnd{size, xxh3}; }
    nlohmann::json build() const;
    // The index is required; an item with "rc" is a refusal.
    static Result<FetchManyItem> parse(const nlohmann::json& meta);
};

// The END of fetch_many.
struct FetchManyEnd {
    uint64_t files = 0;
    bool raw = false;
    nlohmann::json build() const;
};

}  // namespace dyad::proto
