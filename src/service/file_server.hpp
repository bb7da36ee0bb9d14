// SPDX-License-Identifier: Apache-2.0
// The file server: the part of the service that sends the files of its
// producer directory (and the replicas it holds) to consumers. dyad.fetch
// (fetch.cpp: one file over any served transport; whole_file.cpp: a small
// one in one go over the stream) and dyad.fetch_many (fetch_many.cpp: many
// small files in one request); both take a file the same way
// (serve_file.hpp; the checks, and who may read it: file_server.cpp). It counts
// what it serves, by transport, for the status and the metrics.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core.hpp"
#include "dtl/dtl.hpp"
#include "proto/fetch.hpp"
#include "rpc/server.hpp"
#include "serve_file.hpp"

namespace dyad::service {

class Publisher;      // publisher.hpp
class ReplicaHolder;  // replica_holder.hpp

class FileServer {
  public:
    // The fetch counters `dyad service status` shows (and the metrics, which
    // read the same ones). The total's requests stay 0: all fetch requests
    // are counted by the RequestMetrics (kind fetch), per transport here.
    struct Counters {
        uint64_t requests = 0;
        uint64_t served = 0;
        uint64_t errors = 0;
        uint64_t bytes_sent = 0;
        uint64_t bytes_received = 0;
        uint64_t in_flight = 0;  // transfers sending now
    };
    // Refusals before any byte moved.
    struct Refused {
        uint64_t transport = 0;  // a transport not served here (loop only)
        std::atomic<uint64_t> unproduced{0}, stale{0};
        std::atomic<uint64_t> unreadable{0};  // keyless peers refused a file (readable_by)
    };

    // `senders` and `unavailable`: the transports the service serves (and
    // why the others are not), set up by Service::start.
    FileServer(Core& core, const std::map<std::string, std::unique_ptr<dtl::Sender>>& senders,
               const std::map<std::string, std::string>& unavailable, Publisher& publisher,
               ReplicaHolder& replicas)
        : core_(core),
          senders_(senders),
          unavailable_(unavailable),
          publisher_(publisher),
          replicas_(replicas) {}

    // Counts the transport `name` from now on (one served by a sender).
    void count(const std::string& name);

    void on_fetch(std::shared_ptr<rpc::Request> r);
    // Asked first by on_fetch: true when the fetch is held elsewhere (its
    // transport is still being set up: Service::held_for_late), to come
    // back through on_fetch later.
    void set_hold(std::function<bool(const std::shared_ptr<rpc::Request>&)> hold) {
        hold_ = std::move(hold);
    }
    void on_fetch_many(std::shared_ptr<rpc::Request> r);

    // For the status reporter (loop only).
    const std::map<std::string, Counters>& per_transport() const { return per_transport_; }
    const Counters& total() const { return total_; }
    const Refused& refused() const { return refused_; }
    const std::map<std::string, std::unique_ptr<Histogram>>& transfer_seconds() const {
        return transfer_seconds_;
    }
    const std::map<std::string, std::unique_ptr<dtl::Sender>>& senders() const { return senders_; }

  private:
    struct PendingFetch;  // a dyad.fetch waiting for its file (fetch.cpp)
    struct ManyFile;      // one file of a dyad.fetch_many (fetch_many.cpp)
    // A small file (`n` bytes, at most dtl::kFetchManyFileMax) read whole
    // into a buffer of the budget (owner, peer), hashed, and checked still
    // as `snap` (file thread). EAGAIN: no memory now; ESTALE: it changed.
    // `front` bytes are kept free before the file's bytes in buf (the
    // header of a compact dyad.fetch_many answer). `from`: where the `n`
    // bytes start in the file (a byte range).
    struct Whole {
        uint64_t size = 0;  // of the file (buf may be larger)
        dtl::Buffer buf;
        uint64_t digest = 0;
        std::string xxh3;  // the digest in hex
    };

    // The served transport a fetch asks for (canonical name; the universal
    // backend when it names none), or why it is not served.
    Result<std::string> transport_served(const nlohmann::json& args);
    // One of a dyad.fetch_many's files (file thread): taken as a fetch takes
    // it, but a file its producer holds is EBUSY, not waited for; read whole
    // (read_whole), `front` bytes kept free before it.
    Result<Whole> read_small(const proto::FetchRequest& req, const rpc::Peer& who, uint64_t owner,
                             uint64_t peer, size_t front);
    // Their answers and END, on the loop.
    void answer_many(const std::shared_ptr<rpc::Request>& r,
                     const std::shared_ptr<std::vector<ManyFile>>& files,
                     const std::string& transport, std::chrono::steady_clock::time_point t0,
                     bool raw);
    // The steps both requests share once the file is open (file thread,
    // serve_file.hpp): ServedFile::take (lock without waiting, stat, a
    // regular file), then the publisher's check and readable_by. EAGAIN:
    // its producer holds it. *snap: the file as it is now.
    Status take_served(ServedFile& f, const proto::FetchRequest& req, const rpc::Peer& peer,
                       Snapshot* snap);
    // Without a key, a peer that is not this service's uid nor root is
    // served only a file its own uid could read (docs/security.md,
    // "Keyless peers read what their uid may read"). Where the file was
    // opened as the peer (opens_as_peer), the kernel decided; otherwise (a
    // dyadd that cannot take other users' credentials) the file's
    // permission classes decide. A replica is served to such a peer only by
    // a service that opens as itself for it (the holder cannot tell who may
    // read the original).
    Status readable_by(const rpc::Peer& peer, const struct stat& sb, const std::string& up,
                       bool replica = false);
    // Whether a file served to `peer` is opened with its credentials
    // (access.hpp): no key, a peer other than dyadd's uid and root, and a
    // dyadd that can (root).
    bool opens_as_peer(const rpc::Peer& peer) const;
    // `up` in the producer directory, opened as `peer` would open it when
    // opens_as_peer(peer), else as the service (file thread).
    Result<ServedFile> open_for(const rpc::Peer& peer, const std::string& up);
    // Takes the file of a fetch (take_served), waiting while its producer
    // holds it locked, then starts the transfer (file thread, fetch.cpp).
    void try_lock(std::shared_ptr<PendingFetch> p, int attempt);
    // The transfer's job, with the file taken from `p`.
    std::shared_ptr<dtl::FetchJob> fetch_job(PendingFetch& p);
    // A byte range that starts inside the file `sb` (or no range): ok; else
    // BADFIO / ERANGE naming the file and its size.
    static Status range_within(const proto::FetchRequest& req, const struct stat& sb);
    // A small file over the stream: read, hashed and checked on this file
    // thread, then sent with its END in one go (whole_file.cpp). False: not
    // taken (too large, another transport, no memory now): start_send.
    bool send_whole(const std::shared_ptr<rpc::Request>& r, const std::string& transport,
                    const std::shared_ptr<dtl::FetchJob>& job, const Snapshot& snap);
    Result<Whole> read_whole(int fd, const std::string& upath, size_t n, const Snapshot& snap,
                             uint64_t owner, uint64_t peer, size_t front = 0, uint64_t from = 0);
    // Closes r's connection if what was queued for it is not written within
    // --send-timeout (a consumer that takes nothing); cancel once written.
    std::shared_ptr<asio::steady_timer> send_watchdog(const std::shared_ptr<rpc::Request>& r);
    // The END of a sent file, or the error if it changed while being read.
    void end_send(const std::shared_ptr<rpc::Request>& r, const std::string& transport,
                  const dtl::FetchJob& job, bool unchanged, const std::string& xxh);
    void start_send(std::shared_ptr<rpc::Request> r, std::string transport,
                    std::shared_ptr<dtl::FetchJob> job, std::shared_ptr<const Snapshot> snap);
    void release_fd(const std::shared_ptr<dtl::FetchJob>& job);
    void fail(const std::shared_ptr<rpc::Request>& r, const std::string& transport,
              const Status& st);

    Core& core_;
    std::function<bool(const std::shared_ptr<rpc::Request>&)> hold_;
    const std::map<std::string, std::unique_ptr<dtl::Sender>>& senders_;
    const std::map<std::string, std::string>& unavailable_;  // transport -> why not served
    Publisher& publisher_;
    ReplicaHolder& replicas_;
    std::map<std::string, Counters> per_transport_;
    Counters total_;
    Refused refused_;
    std::map<std::string, std::unique_ptr<Histogram>> transfer_seconds_;  // by transport
};

}  // namespace dyad::service
