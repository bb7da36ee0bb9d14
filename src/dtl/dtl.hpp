// SPDX-License-Identifier: Apache-2.0
// The Data Transport Layer: one small interface per side, backends listed in
// one explicit table. Transports move bytes; the fetch conversation
// (request, end trailer with size and checksum, errors, cancel, deadlines)
// is the fetch channel's (channel.hpp).
//
//   consumer: Receiver::describe() -> fields of the fetch request;
//             Receiver::receive()  -> bytes into a Sink until end of stream.
//   service:  Sender::send()       -> moves a file's bytes to the consumer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/thread_pool.hpp>
#include <nlohmann/json.hpp>

#include "channel.hpp"
#include "common/deadline.hpp"
#include "common/fd.hpp"
#include "common/fs.hpp"
#include "common/status.hpp"
#include "proto/fetch.hpp"
#include "selector.hpp"

namespace dyad::dtl {

class MemoryBudget;

// The transports this DYAD knows, built into this build or not. Their names
// (DYAD_DTL_MODE values, the wire's transport field, transport records)
// are spelled once, in the table of backends (registry.cpp); everything
// else asks it.
enum class Kind { stream, ucx, ofi, local };
const char* name_of(Kind k);
std::vector<std::string> aliases_of(Kind k);
// The name of the original DYAD's transport number (dyad_dtl_mode_t:
// DYAD_DTL_UCX, DYAD_DTL_MARGO, DYAD_DTL_FLUX_RPC), or null for any other.
const char* name_of_dyad_mode(int mode);

// What a backend tells the selector about itself.
struct Attributes {
    std::string name;
    double latency_us = 0;      // one small message, one way
    double bandwidth_gbps = 0;  // GB/s for large transfers
    bool rma_native = false;    // one-sided ops without software emulation
    uint64_t max_message = 0;   // largest efficient single message
    std::string info;           // library version, transports in use...
    nlohmann::json to_json() const;
};

// Where received bytes go (the consumer store's temporary file).
class Sink {
  public:
    virtual ~Sink() = default;
    virtual Status write(const void* p, size_t n) = 0;
    // For in-kernel copies (LOCAL): the destination file, or -1; then
    // copied(n) accounts bytes that reached it without passing through here.
    virtual int fd() const { return -1; }
    virtual void copied(uint64_t n) { (void)n; }
    // For transports that land bytes in the destination file themselves,
    // through a shared mapping of fd() (the libfabric pull reads straight
    // into it): each run, in file order, is reported here to be hashed and
    // counted as if written.
    virtual bool can_place() const { return false; }
    virtual Status placed(const void* p, size_t n) {
        (void)p;
        (void)n;
        return Status(DYAD_RC_SYSFAIL, "this sink takes no placed bytes", ENOTSUP);
    }
};

class Receiver {
  public:
    virtual ~Receiver() = default;
    virtual const Attributes& attributes() const = 0;
    // Fields this transport adds to the fetch request (e.g. a worker address).
    virtual nlohmann::json describe() = 0;
    // Reads the answer to the fetch on `ch`, delivering the file's bytes to
    // `sink` in order. Returns the END trailer (proto::FetchEnd).
    // Fails with TIMEOUT when no progress is made for ch.idle_s() seconds.
    [[nodiscard]] virtual Result<nlohmann::json> receive(FetchChannel& ch, Sink& sink) = 0;
};

// One file to move, prepared by the service's fetch handler.
struct FetchJob {
    std::shared_ptr<SendChannel> ch;       // the conversation with the consumer
    UniqueFd fd;                           // open, shared-locked, regular file
    FileSystem* fs = &FileSystem::real();  // reads of fd go through this seam
    uint64_t size = 0;                     // bytes to send
    uint64_t offset = 0;                   // where they start in the file (a byte range)
    std::string upath;
    std::string local_host;         // the service address the consumer reached (empty: unix socket)
    nlohmann::json transport_args;  // what the consumer's describe() sent
    asio::thread_pool* file_pool = nullptr;  // blocking file reads run here
    double idle_timeout_s = 60;  // no write progress for this long: abandon, close the connection
    MemoryBudget* budget = nullptr;  // the service's transfer memory (null: the transfer's own)
    uint64_t endpoint = 0;           // the consumer connection, for fairness in the budget
    uint64_t peer = 0;           // the consumer's peer (host or process), for its share (0: none)
    std::shared_ptr<void> hold;  // what the service keeps until the job is gone (its caps)
};

using SendDone = std::function<void(Status st, uint64_t bytes, std::string xxh3_hex)>;

// Where a service's transports may accept connections: the service's listen
// policy (docs/security.md), given to every sender when it is made. A
// transport that listens (UCX's TCP interfaces, a libfabric endpoint) binds
// there and nowhere else.
struct ServiceBind {
    // The address listeners bind to (the host of --listen, or 127.0.0.1);
    // empty: any (a keyed service listening on a wildcard address).
    std::string host;
    // A service without a key: loopback only, whatever else is configured.
    bool loopback_only = false;
};

class Sender {
  public:
    virtual ~Sender() = default;
    virtual const Attributes& attributes() const = 0;
    // Moves job->size bytes; calls done once, on the service loop.
    virtual void send(std::shared_ptr<FetchJob> job, SendDone done) = 0;
    // Transport-specific state for `dyad service status` (on the loop).
    virtual nlohmann::json stats() const { return nlohmann::json::object(); }
    // How consumers can reach this transport, with the figures the AUTO
    // selector scores (selector.hpp). Default: one network record from the
    // attributes. (Inline, like every member here: the libfabric plugin is
    // loaded by programs that export no symbols to it.)
    virtual std::vector<TransportRecord> records() const {
        const Attributes& a = attributes();
        TransportRecord r;
        r.name = a.name;
        r.reach = proto::kReachNetwork;
        r.latency_us = a.latency_us;
        r.bandwidth_gbps = a.bandwidth_gbps;
        r.rma_native = a.rma_native;
        r.max_message = a.max_message;
        r.detail = a.info;
        r.source = "configuration (measured with bench/auto_bench.py on the reference machine)";
        return {r};
    }
};

// One row of the table of backends (registry.cpp, which also holds the
// transports' names: Kind, name_of). A new transport is one folder, one
// name and one row there.
struct Backend {
    std::string name;                  // DYAD_DTL_MODE value
    std::vector<std::string> aliases;  // other accepted names
    std::function<Attributes()> attributes;
    std::function<Result<std::unique_ptr<Receiver>>()> make_receiver;
    // The sender lives on the service's event loop.
    std::function<Result<std::unique_ptr<Sender>>(asio::io_context&, const ServiceBind&)>
        make_sender;
    // Optional: prepares the consumer side ahead of the first fetch (called
    // when a consumer context is created), so that cost is off the path.
    std::function<Status()> warmup = nullptr;
    // Policy. Ties in the selector's estimates go to the lower preference
    // (the transport that moves fewer bytes through fewer hands).
    int preference = 100;
    // Served by every service: the transport of last resort when an owner
    // publishes no transport records.
    bool universal = false;
    // Errors (errno) meaning "cannot work from here" when nothing has
    // arrived yet: the consumer then tries the next transport.
    std::vector<int> start_errnos;
    // Which transport this row is (set by the table).
    Kind kind = Kind::stream;
};

// The backends compiled into this build.
const std::vector<Backend>& backends();
// By name or alias (case-insensitive); BADDTLMODE naming the built ones.
Result<const Backend*> find_backend(const std::string& name);
// The one every service serves (Backend::universal).
const Backend& universal_backend();
// A fixed DYAD_DTL_MODE's consumer side, set up now (Backend::warmup): a
// transport that cannot work in this process is an error at once, naming
// DYAD_DTL_MODE, what failed (the transport's own setting: DYAD_MARGO_PROTO,
// UCX_TLS...) and the other choices, rather than a wait for files it
// could never move.
Status prepare_fixed_mode(const Backend& b);
// AUTO's one warning for a transport that cannot work in this process (it
// is left out from then on): `why` is its setup's error.
std::string left_out_message(const Backend& b, const std::string& why);
// Whether `name` (a name or alias, any case) is the transport of the
// same node (LOCAL): it passes open files, which the service counts apart.
bool is_local(const std::string& name);

// dyad.fetch_many (docs/design.md, "Many small files in one request"): at
// most this many files, each at most kFetchManyFileMax bytes, in one request
// over the stream transport.
inline constexpr size_t kFetchManyFiles = proto::kFetchManyFiles;
inline constexpr uint64_t kFetchManyFileMax = 256u << 10;
// A DYAD_DTL_MODE value: AUTO or a backend's name (from an alias, any case).
Result<std::string> canonical_mode(const std::string& value);
constexpr const char* kAutoMode = "AUTO";
// Tie-break rank of a transport by name (unknown names last).
int preference(const std::string& name);

// Stream backend tunables (exposed for tests and benchmarks).
constexpr size_t kStreamChunk = 1u << 20;
constexpr int kStreamDepth = 4;

}  // namespace dyad::dtl
