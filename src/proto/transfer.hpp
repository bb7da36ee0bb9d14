// SPDX-License-Identifier: Apache-2.0
// The transports' own messages of dyad.fetch (docs/wire-protocol.md,
// "dyad.fetch with transport: UCX / MARGO / LOCAL"): the receiver's fields
// in the request, the transport's part of the first answer (beside
// FetchStart's size and transport), and the chunk notices and updates of
// one transfer. The transports (src/dtl) read and write them only here.
//
// Most of these fields are of the protocol's lenient kind: absent or of
// another type, a field reads as absent and the transport's default
// applies; the transports decide what an absent field means. The refusals
// made here are the ones the transports made before these types existed
// (same code, errno and message).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.hpp"
#include "proto/fetch.hpp"

namespace dyad::proto {

// ---- UCX ----

// The consumer's fields in a UCX dyad.fetch request.
struct UcxRequest {
    std::string worker;    // ucx_worker: the consumer's worker address, base64
    uint64_t tag = 0;      // ucx_tag: the tag of tagged chunks
    std::string consumer;  // ucx_consumer: "node/pid/start-time", for logs ("?": absent)
    std::string proto;     // ucx_proto: auto | tag | put ("auto": absent)
    // The receive window for put mode: all three given (address and size
    // unsigned, rkey a string), or none (an older consumer: tagged messages).
    struct Window {
        uint64_t address = 0;  // ucx_window
        uint64_t size = 0;     // ucx_window_size
        std::string rkey;      // ucx_rkey: the packed rkey, base64
    };
    std::optional<Window> window;

    // Longest consumer name kept (the rest is cut).
    static constexpr size_t kMaxConsumer = 128;
    // EINVAL / BADUNPACK "UCX fetch without ucx_worker and ucx_tag" unless
    // ucx_worker is a string and ucx_tag an unsigned integer.
    static Result<UcxRequest> parse(const nlohmann::json& args);
    // Into `args` (a request's other fields may be there already).
    void build_into(nlohmann::json& args) const;
    nlohmann::json build() const;
};

// The UCX part of the first answer: chunk size and mode.
struct UcxStart {
    FetchStart start;                 // size, transport
    std::optional<uint64_t> chunk;    // absent: the receiver's default
    std::optional<std::string> mode;  // "put" or "tag"; absent: tag (sent only for put)
    bool put() const { return mode.value_or("tag") == "put"; }

    // Largest chunk a consumer accepts.
    static constexpr uint64_t kMaxChunk = 64u << 20;
    // BADRPC / EPROTO "bad first answer in a UCX fetch: <the answer>"
    // without a size, or with a chunk of 0 or over kMaxChunk.
    static Result<UcxStart> parse(const nlohmann::json& meta);
    nlohmann::json build() const;
};

// Put mode: chunk len bytes are in window slot `slot`.
struct UcxPutNotice {
    uint64_t slot = 0;
    uint64_t len = 0;
    // BADFETCH / EPROTO "UCX put notice <the notice>: field '...' missing"
    // without a slot or a len (the receiver says which it expected).
    static Result<UcxPutNotice> parse(const nlohmann::json& meta);
    nlohmann::json build() const;
};

// Put mode: the consumer emptied chunk `ack`'s slot. `credit` (1) is for
// services of the first release; a consumer of that release sends it alone,
// for the oldest chunk.
struct UcxAck {
    std::optional<uint64_t> ack;
    std::optional<uint64_t> credit;
    static UcxAck of(uint64_t seq) { return UcxAck{seq, 1}; }
    // A first release's credit: no ack, credit 1.
    bool oldest() const { return !ack && credit == 1u; }
    // Never fails: both are lenient (a bad one is ignored by the window).
    static UcxAck parse(const nlohmann::json& update);
    nlohmann::json build() const;
};

// ---- MARGO (libfabric) ----

// The consumer's field in a MARGO dyad.fetch request.
struct OfiRequest {
    std::string proto;  // ofi_proto: ofi+tcp, ofi+shm, ...
    // EINVAL / BADUNPACK "OFI fetch without ofi_proto" unless it is a string.
    static Result<OfiRequest> parse(const nlohmann::json& args);
    void build_into(nlohmann::json& args) const;
    nlohmann::json build() const;
};

// The MARGO part of the first answer.
struct OfiStart {
    FetchStart start;               // size, transport
    std::optional<uint64_t> chunk;  // the service's chunk size
    std::string proto;              // the protocol served ("": absent)
    std::string address;            // ofi_addr: the service endpoint's, base64 ("": absent)
    // BADRPC / EPROTO "bad first answer in an OFI fetch: <the answer>"
    // without a size.
    static Result<OfiStart> parse(const nlohmann::json& meta);
    nlohmann::json build() const;
};

// One chunk to fi_read: `len` bytes at `addr` of the region `key`.
struct OfiChunk {
    uint64_t seq = ~0ull;  // absent: matches no chunk
    uint64_t addr = 0;
    uint64_t key = 0;
    uint64_t len = 0;
    // Never fails: absent fields keep the defaults (the receiver checks seq and len).
    static OfiChunk parse(const nlohmann::json& meta);
    nlohmann::json build() const;
};

// The acknowledgement of chunk `seq` (MARGO; UCX's carries a credit too).
struct ChunkAck {
    uint64_t seq = 0;
    // The chunk acknowledged, if the update names one.
    static std::optional<uint64_t> seq_of(const nlohmann::json& update);
    nlohmann::json build() const;
};

// ---- The AUTO selector's records ----

// A record's reach.
inline constexpr const char* kReachNode = "node";        // same DYAD node
inline constexpr const char* kReachHost = "host";        // same machine (host_id)
inline constexpr const char* kReachNetwork = "network";  // anywhere

// One way of reaching a service's transport, as dyad.hello and dyad.status
// list them (`transports`).
struct TransportRecord {
    std::string name;           // DYAD_DTL_MODE name: LOCAL, UCX, FLUX_RPC, MARGO
    std::string reach;          // node (same DYAD node), host (same machine), network
    double latency_us = 0;      // fixed cost per file (request, set-up, first byte)
    double bandwidth_gbps = 0;  // streaming rate, GB/s
    bool rma_native = false;    // one-sided transfers without software emulation
    uint64_t max_message = 0;   // largest efficient single message
    std::string address;        // how to reach it (endpoint, worker address, protocols)
    std::string detail;         // what it runs on (UCX lanes, provider...)
    std::string source;         // where the figures come from

    // BADMETADATA / EPROTO "transport record without a name" unless name is
    // a string; "malformed transport record: ..." for another field of the
    // wrong type (absent ones keep their defaults, reach "network").
    static Result<TransportRecord> parse(const nlohmann::json& j);
    nlohmann::json build() const;
};

// ---- LOCAL ----

// The consumer copied `copied` bytes: the service may end the fetch.
struct LocalCopied {
    uint64_t copied = 0;
    // BADRPC / EPROTO "LOCAL update without 'copied'".
    static Result<LocalCopied> parse(const nlohmann::json& update);
    nlohmann::json build() const;
};

// A first answer's size, leniently (LOCAL's and STREAM's: the receiver says
// what an answer without one is).
std::optional<uint64_t> start_size(const nlohmann::json& meta);

}  // namespace dyad::proto
