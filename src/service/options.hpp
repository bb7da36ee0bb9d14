// SPDX-License-Identifier: Apache-2.0
// dyadd's options (main.cpp fills them from its command line and the
// settings table): what the service and each of its parts are given.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "kvs/late_store.hpp"
#include "kvs/service_store.hpp"
#include "publish_ledger.hpp"
#include "replicas.hpp"

namespace dyad::service {

struct Options {
    std::string producer_dir;
    std::string mode = "AUTO";
    std::string ns = "dyad";
    std::string node;                       // default: host name
    std::string listen = "127.0.0.1:7627";  // HOST:PORT, "" for none
    std::string socket_path;                // unix socket, "" for none
    // Sockets bound (and listening) by whoever started dyadd (`dyad job
    // node-up`: the prolog ends before dyadd is up, connections wait in the
    // backlog): --listen-fd, --socket-fd; -1: dyadd binds --listen/--socket.
    int listen_fd = -1;
    int socket_fd = -1;
    std::string kvs_uri;  // "" hosts the embedded store
    // The store the service talks to itself (--kvs etcd://...; made by
    // dyadd's main, which alone links the etcd client): kvs_uri names it.
    std::shared_ptr<kvs::ServiceStore> external_store;
    // dyadd --store-late (instead of external_store): the service is ready
    // before its store answers (kvs/late_store.hpp); connect_store then
    // connects it, one try of up to `seconds`: an error of rc
    // DYAD_RC_TIMEOUT or DYAD_RC_CONNFAIL is a store not up yet (tried
    // again), any other is final (late_store.cpp in this directory).
    std::shared_ptr<kvs::LateStore> late_store;
    std::function<Result<std::shared_ptr<kvs::ServiceStore>>(double seconds)> connect_store;
    // Where the embedded store keeps its epoch (--state-dir; "": the
    // producer directory's .dyad/).
    std::string state_dir;
    // Opens the publish ledger's durable copy in the state directory (dyadd:
    // SQLite, ledger_journal.hpp; unset: the ledger is in memory only).
    std::function<Result<std::unique_ptr<LedgerJournal>>(
        const std::string& state_dir, const std::string& id, const std::string& producer_dir)>
        open_journal;
    unsigned io_threads = 4;
    double send_timeout = 60;             // seconds without progress before a transfer is abandoned
    std::vector<std::string> transports;  // serve only these (empty: every built one)
    std::string figures;                  // DYAD_DTL_FIGURES: overrides of the selector's figures
    uint64_t memory =
        256ull << 20;  // transfer buffers, all consumers together (DYAD_SERVICE_MEMORY)
    bool debug = false;
    std::string auth_key;              // key file (--auth-key, DYAD_AUTH_KEY_FILE); "" for none
    bool insecure = false;             // allow a non-loopback listener without a key
    std::vector<uint32_t> allow_uids;  // more uids allowed on the Unix socket
    bool allow_any_uid = false;
    uint64_t store_max = 1ull << 30;  // bytes the embedded store may hold (--store-max)
    // Quotas of one namespace of the embedded store
    // (--store-max-records-per-namespace, --store-max-bytes-per-namespace; 0: store_max).
    uint64_t store_max_records_per_ns = 1000000;
    uint64_t store_max_namespaces = 4096;  // --store-max-namespaces
    uint64_t store_max_bytes_per_ns = 0;
    // Seconds an authenticated connection may stay idle (--idle-timeout; 0: never).
    double idle_timeout = 120;
    // Caps per peer (docs/security.md, "Caps per peer"; 0: none):
    // connections, fetches in progress, LOCAL fetches holding an open file,
    // and bytes of the memory budget (0: a quarter of it).
    uint64_t max_connections_per_peer = 512;
    uint64_t max_fetches_per_peer = 1024;
    uint64_t max_local_per_peer = 256;
    uint64_t memory_per_peer = 0;
    // Bytes of arguments requests in progress may hold, of one peer and of
    // all (--max-request-bytes-per-peer, --max-request-bytes; 0: no cap).
    uint64_t max_request_bytes_per_peer = 32ull << 20;
    uint64_t max_request_bytes = 256ull << 20;
    // Seconds one kvs.get wait is held before it answers TIMEOUT (--max-wait).
    double max_wait = 60;
    // This node's rank (--rank, DYAD_NODE_RANK, the resource manager's node
    // rank); unset: the store assigns one in registration order.
    std::optional<uint32_t> rank;
    std::string rank_source;  // where `rank` came from, for status and logs
    // Replicas (docs/design.md, "Replicas"): copies per file unless the
    // producer says (--replicas), bytes of others' replicas this service
    // keeps (--replica-space), and how it pulls one (dyadd's main: the
    // client's fetch path; empty: this service holds no replicas).
    uint64_t replicas = 0;
    uint64_t replica_space = 8ull << 30;
    PullFn pull_replica;
    // Start-up (late_transports.cpp): UCX and libfabric are set up on a
    // thread of their own once the service is ready, unless they are
    // --mode or this is false (dyadd --transports-at-start).
    bool late_transports = true;
    // Called on the loop once every transport is set up (at once when none
    // is set up late): dyadd installs its crash handler again and lets
    // SIGTERM/SIGINT through. Meanwhile the late thread keeps the handlers
    // of SIGTERM and SIGINT as they were before (a library's own would end
    // the process).
    std::function<void()> late_started;
};

}  // namespace dyad::service
