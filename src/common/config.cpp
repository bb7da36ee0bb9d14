// SPDX-License-Identifier: Apache-2.0
#include "config.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <strings.h>
#include <unistd.h>

#include <dyad/common/dyad_envs.h>

#include "settings.hpp"

namespace dyad {

std::string hostname() {
    char buf[256] = {0};
    if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
    return buf;
}

Result<bool> parse_bool(const std::string& name, const std::string& value) {
    static const char* yes[] = {"", "1", "true", "yes", "on", "y"};
    static const char* no[] = {"0", "false", "no", "off", "n"};
    for (const char* y : yes)
        if (strcasecmp(value.c_str(), y) == 0) return true;
    for (const char* n : no)
        if (strcasecmp(value.c_str(), n) == 0) return false;
    return Status(DYAD_RC_NOCTX,
                  name + "='" + value + "' is not a boolean: use 1/0, true/false, yes/no or on/off",
                  EINVAL);
}

Result<unsigned> parse_uint(const std::string& name, const std::string& value, unsigned min,
                            unsigned max) {
    char* end = nullptr;
    errno = 0;
    unsigned long v = std::strtoul(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || errno != 0 || value[0] == '-' || v < min || v > max)
        return Status(DYAD_RC_NOCTX,
                      name + "='" + value + "' is not an integer in [" + std::to_string(min) +
                          ", " + std::to_string(max) + "]",
                      EINVAL);
    return static_cast<unsigned>(v);
}

Result<double> parse_seconds(const std::string& name, const std::string& value) {
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || errno != 0 || !std::isfinite(v) || v < 0)
        return Status(DYAD_RC_NOCTX, name + "='" + value + "' is not a number of seconds >= 0",
                      EINVAL);
    return v;
}

Result<uint64_t> parse_size(const std::string& name, const std::string& value) {
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(value.c_str(), &end, 10);
    uint64_t mult = 1;
    std::string unit(end ? end : "");
    for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (unit == "K" || unit == "KIB" || unit == "KB")
        mult = 1ull << 10;
    else if (unit == "M" || unit == "MIB" || unit == "MB")
        mult = 1ull << 20;
    else if (unit == "G" || unit == "GIB" || unit == "GB")
        mult = 1ull << 30;
    else if (!unit.empty() && unit != "B")
        mult = 0;
    if (value.empty() || value[0] == '-' || end == value.c_str() || errno != 0 || mult == 0 ||
        v > (~0ull) / mult)
        return Status(DYAD_RC_NOCTX,
                      name + "='" + value + "' is not a size (bytes, or a number with K, M or G)",
                      EINVAL);
    return static_cast<uint64_t>(v) * mult;
}

Result<double> parse_fraction(const std::string& name, const std::string& value) {
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || errno != 0 || !std::isfinite(v) || v <= 0 || v > 1)
        return Status(DYAD_RC_NOCTX,
                      name + "='" + value + "' is not a fraction in (0, 1] (e.g. 0.8)", EINVAL);
    return v;
}

Result<std::string> parse_cache_policy(const std::string& name, const std::string& value) {
    for (const char* p : {"LRU", "FIFO", "NONE"})
        if (strcasecmp(value.c_str(), p) == 0) return std::string(p);
    return Status(DYAD_RC_NOCTX,
                  name + "='" + value +
                      "' is not a cache policy: use LRU (least recently consumed first), FIFO "
                      "(oldest first) or NONE (no eviction)",
                  EINVAL);
}

Status check_cache_settings(const Config& c) {
    auto p = parse_cache_policy("DYAD_CACHE_POLICY", c.cache_policy);
    if (!p) return p.status();
    if (!std::isfinite(c.cache_low_watermark) || c.cache_low_watermark <= 0 ||
        c.cache_low_watermark > 1)
        return Status(DYAD_RC_NOCTX,
                      "DYAD_CACHE_LOW_WATERMARK=" + std::to_string(c.cache_low_watermark) +
                          " is not a fraction in (0, 1] (e.g. 0.8)",
                      EINVAL);
    if (!std::isfinite(c.cache_grace_period) || c.cache_grace_period < 0)
        return Status(DYAD_RC_NOCTX, "DYAD_CACHE_GRACE_PERIOD must be a number of seconds >= 0",
                      EINVAL);
    if (c.origin_publish && c.path_origin.empty())
        return Status(DYAD_RC_NOCTX,
                      "DYAD_ORIGIN_PUBLISH is on but DYAD_PATH_ORIGIN is not set: set the origin "
                      "directory, or turn DYAD_ORIGIN_PUBLISH off",
                      EINVAL);
    if (c.origin_publish && c.prod_path.empty())
        return Status(DYAD_RC_NOCTX,
                      "DYAD_ORIGIN_PUBLISH needs DYAD_PATH_PRODUCER (the directory this node's "
                      "dyadd serves): the copies it publishes go there",
                      EINVAL);
    return Status::ok();
}

namespace {

// From the settings: the cache and read-through (src/client/cache.hpp,
// origin.hpp), the replicas, the fetch workers.
Status read_cache_and_copies(Config& c) {
    auto cap = settings::size("DYAD_CACHE_CAPACITY");
    if (!cap) return cap.status();
    c.cache_capacity = cap.value();
    auto policy = parse_cache_policy("DYAD_CACHE_POLICY", settings::text("DYAD_CACHE_POLICY"));
    if (!policy) return policy.status();
    c.cache_policy = policy.value();
    auto low =
        parse_fraction("DYAD_CACHE_LOW_WATERMARK", settings::text("DYAD_CACHE_LOW_WATERMARK"));
    if (!low) return low.status();
    c.cache_low_watermark = low.value();
    auto grace = settings::seconds("DYAD_CACHE_GRACE_PERIOD");
    if (!grace) return grace.status();
    c.cache_grace_period = grace.value().value_or(5);
    c.path_origin = settings::text("DYAD_PATH_ORIGIN");
    auto publish = settings::flag("DYAD_ORIGIN_PUBLISH");
    if (!publish) return publish.status();
    c.origin_publish = publish.value();
    auto recheck = settings::seconds("DYAD_ORIGIN_RECHECK");
    if (!recheck) return recheck.status();
    c.origin_recheck = recheck.value().value_or(1);
    if (settings::lookup("DYAD_REPLICAS").set()) {
        auto k = settings::count("DYAD_REPLICAS", 0, 16);
        if (!k) return k.status();
        c.replicas = k.value();
    }
    auto rsync = settings::flag("DYAD_REPLICAS_SYNC");
    if (!rsync) return rsync.status();
    c.replicas_sync = rsync.value();
    auto workers = settings::count("DYAD_FETCH_WORKER_THREADS", 0, 1024);
    if (!workers) return workers.status();
    c.fetch_worker_threads = workers.value();
    // Upstream's fetch worker pool is the nearest to our window of files in
    // flight: it sets the window unless DYAD_CONSUME_WINDOW is set itself.
    if (c.fetch_worker_threads > 0 &&
        settings::lookup("DYAD_CONSUME_WINDOW").source == settings::Source::defaults)
        c.consume_window = c.fetch_worker_threads;
    return Status::ok();
}

}  // namespace

Result<Config> Config::from_env() {
    Status ok = settings::check("client");
    if (!ok) return ok;
    Config c;
    c.kvs_namespace = settings::text("DYAD_KVS_NAMESPACE");
    c.prod_path = settings::text("DYAD_PATH_PRODUCER");
    c.cons_path = settings::text("DYAD_PATH_CONSUMER");
    c.service_uri = settings::text("DYAD_SERVICE_URI");
    c.node_id = settings::text("DYAD_NODE_ID");
    if (c.service_uri.empty()) c.service_uri = kDefaultServiceUri;
    // Checked against the table of backends by the client (dtl::canonical_mode).
    c.dtl_mode = settings::text("DYAD_DTL_MODE");
    struct {
        const char* name;
        bool* field;
    } flags[] = {
        {DYAD_PATH_RELATIVE_ENV, &c.relative_to_managed_path},
        {DYAD_SHARED_STORAGE_ENV, &c.shared_storage},
        {DYAD_ASYNC_PUBLISH_ENV, &c.async_publish},
        {DYAD_FSYNC_WRITE_ENV, &c.fsync_write},
        {DYAD_SYNC_DEBUG_ENV, &c.debug},
        {DYAD_SYNC_CHECK_ENV, &c.check},
        {DYAD_REINIT_ENV, &c.reinit},
    };
    for (auto& f : flags) {
        auto b = settings::flag(f.name);
        if (!b) return b.status();
        *f.field = b.value();
    }
    struct {
        const char* name;
        unsigned* field;
        unsigned min, max;
    } ints[] = {
        {DYAD_KEY_DEPTH_ENV, &c.key_depth, 0, 64},
        {DYAD_KEY_BINS_ENV, &c.key_bins, 1, 1u << 30},
        {DYAD_SERVICE_MUX_ENV, &c.service_mux, 1, 1u << 20},
        {"DYAD_CONSUME_WINDOW", &c.consume_window, 1, 1024},
    };
    for (auto& i : ints) {
        auto u = settings::count(i.name, i.min, i.max);
        if (!u) return u.status();
        *i.field = u.value();
    }
    auto wait = settings::seconds(DYAD_WAIT_TIMEOUT_ENV);
    if (!wait) return wait.status();
    c.wait_timeout = wait.value();
    auto transfer = settings::seconds("DYAD_TRANSFER_TIMEOUT");
    if (!transfer) return transfer.status();
    if (!transfer.value() || *transfer.value() <= 0)
        return Status(DYAD_RC_NOCTX, "DYAD_TRANSFER_TIMEOUT must be > 0", EINVAL);
    c.transfer_timeout = *transfer.value();
    if (Status cr = read_cache_and_copies(c); !cr) return cr;
    if (Status cs = check_cache_settings(c); !cs) return cs;
    auto lvl = dyad::log_level(c.debug ? log::Level::debug : log::Level::warn);
    if (!lvl) return lvl.status();
    c.log_level = lvl.value();
    return c;
}

Result<log::Level> log_level(log::Level fallback) {
    settings::Value v = settings::lookup(DYAD_LOG_LEVEL_ENV);
    if (v.source == settings::Source::defaults || !v.set()) return fallback;
    log::Level l;
    if (!log::parse_level(v.text, &l))
        return Status(DYAD_RC_NOCTX,
                      "DYAD_LOG_LEVEL='" + v.text +
                          "' is not a level: use trace, debug, info, warn, error or off",
                      EINVAL);
    return l;
}

nlohmann::json Config::to_json() const {
    nlohmann::json j;
    j["DYAD_KVS_NAMESPACE"] = kvs_namespace;
    j["DYAD_PATH_PRODUCER"] = prod_path;
    j["DYAD_PATH_CONSUMER"] = cons_path;
    j["DYAD_DTL_MODE"] = dtl_mode;
    j["DYAD_PATH_RELATIVE"] = relative_to_managed_path;
    j["DYAD_SHARED_STORAGE"] = shared_storage;
    j["DYAD_ASYNC_PUBLISH"] = async_publish;
    j["DYAD_FSYNC_WRITE"] = fsync_write;
    j["DYAD_SYNC_DEBUG"] = debug;
    j["DYAD_SYNC_CHECK"] = check;
    j["DYAD_KEY_DEPTH"] = key_depth;
    j["DYAD_KEY_BINS"] = key_bins;
    j["DYAD_SERVICE_MUX"] = service_mux;
    j["DYAD_CONSUME_WINDOW"] = consume_window;
    j["DYAD_SERVICE_URI"] = service_uri;
    j["DYAD_NODE_ID"] = node_id;
    j["DYAD_WAIT_TIMEOUT"] = wait_timeout ? nlohmann::json(*wait_timeout) : nlohmann::json(nullptr);
    j["DYAD_TRANSFER_TIMEOUT"] = transfer_timeout;
    j["DYAD_LOG_LEVEL"] = log::level_name(log_level);
    j["DYAD_REPLICAS"] = replicas ? nlohmann::json(*replicas) : nlohmann::json(nullptr);
    j["DYAD_REPLICAS_SYNC"] = replicas_sync;
    j["DYAD_CACHE_CAPACITY"] = cache_capacity;
    j["DYAD_CACHE_POLICY"] = cache_policy;
    j["DYAD_CACHE_LOW_WATERMARK"] = cache_low_watermark;
    j["DYAD_CACHE_GRACE_PERIOD"] = cache_grace_period;
    j["DYAD_PATH_ORIGIN"] = path_origin;
    j["DYAD_ORIGIN_PUBLISH"] = origin_publish;
    j["DYAD_ORIGIN_RECHECK"] = origin_recheck;
    j["DYAD_FETCH_WORKER_THREADS"] = fetch_worker_threads;
    return j;
}

}  // namespace dyad
