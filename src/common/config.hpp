// SPDX-License-Identifier: Apache-2.0
// The typed configuration of a DYAD client, from the settings table
// (settings.hpp: the only place in the project that reads DYAD_* variables).
// Precedence: defaults < DYAD_CONFIG_FILE < environment < explicit API
// arguments (dyad_init).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "log.hpp"
#include "status.hpp"

namespace dyad {

constexpr const char* kDefaultServiceUri = "tcp://127.0.0.1:7627";
constexpr const char* kDefaultNamespace = "dyad";

// Parses a boolean setting: 1/true/yes/on and 0/false/no/off (any case); an
// empty value counts as on, as a set-but-empty variable did in DYAD.
Result<bool> parse_bool(const std::string& name, const std::string& value);
Result<unsigned> parse_uint(const std::string& name, const std::string& value, unsigned min,
                            unsigned max);
Result<double> parse_seconds(const std::string& name, const std::string& value);
// A byte count: 1048576, 64K, 256M, 1G (binary units; KiB/MiB/GiB accepted).
Result<uint64_t> parse_size(const std::string& name, const std::string& value);
// A fraction in (0, 1] (DYAD_CACHE_LOW_WATERMARK).
Result<double> parse_fraction(const std::string& name, const std::string& value);
// DYAD_CACHE_POLICY's words (any case): "LRU", "FIFO" or "NONE" as written
// here; anything else is an error naming the setting.
Result<std::string> parse_cache_policy(const std::string& name, const std::string& value);

// DYAD_LOG_LEVEL when set, else `fallback` (clients: warn, dyadd: info).
Result<log::Level> log_level(log::Level fallback);
std::string hostname();

struct Config {
    std::string kvs_namespace;  // empty: the namespace of the node's service
    std::string prod_path;
    std::string cons_path;
    std::string dtl_mode = "AUTO";
    bool relative_to_managed_path = false;
    bool shared_storage = false;
    bool async_publish = false;
    bool fsync_write = false;
    bool debug = false;
    bool check = false;
    bool reinit = false;
    unsigned key_depth = 3;
    unsigned key_bins = 1024;
    unsigned service_mux = 1;
    unsigned consume_window = 16;  // files in flight in Client::consume_many
    std::string service_uri = kDefaultServiceUri;
    std::string node_id;                 // empty: the host name
    std::optional<double> wait_timeout;  // seconds; none = wait forever
    double transfer_timeout = 60;        // seconds without progress before a fetch fails
    log::Level log_level = log::Level::warn;
    // Upstream DYAD's 2026 settings (dyad_init's last five arguments are the
    // first five).
    // The node-local cache of consumer copies (src/client/cache.hpp).
    uint64_t cache_capacity = 0;       // DYAD_CACHE_CAPACITY; 0: off
    std::string cache_policy = "LRU";  // DYAD_CACHE_POLICY: LRU, FIFO, NONE
    double cache_low_watermark = 0.8;  // DYAD_CACHE_LOW_WATERMARK, in (0, 1]
    double cache_grace_period = 5;     // DYAD_CACHE_GRACE_PERIOD, seconds
    // Read-through (src/client/origin.hpp).
    std::string path_origin;      // DYAD_PATH_ORIGIN; empty: none
    bool origin_publish = false;  // DYAD_ORIGIN_PUBLISH
    double origin_recheck = 1;    // DYAD_ORIGIN_RECHECK, seconds (0: every range asks)
    // DYAD_FETCH_WORKER_THREADS: accepted for upstream's users; above 0 it
    // sets consume_window when DYAD_CONSUME_WINDOW is not set.
    unsigned fetch_worker_threads = 0;
    // A fetch whose owner is gone or fails mid-way is taken from a replica
    // of the same generation (docs/design.md, "Replicas"). Off in dyadd's
    // own pulls of replicas. DYAD_REPLICAS / DYAD_REPLICAS_SYNC: copies a
    // produce asks for (unset: the service's --replicas) and whether
    // dyad_produce waits for them.
    bool replica_failover = true;
    std::optional<unsigned> replicas;
    bool replicas_sync = false;

    static Result<Config> from_env();
    nlohmann::json to_json() const;
};

// The cache and origin settings' rules, whatever set them (the environment
// or dyad_init's arguments).
Status check_cache_settings(const Config& c);

}  // namespace dyad
