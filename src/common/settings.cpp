// SPDX-License-Identifier: Apache-2.0
#include "settings.hpp"

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>

#include "config.hpp"
#include "log.hpp"

namespace dyad::settings {
namespace {

using T = Type;

// The table is built at its first use, not at load: the LD_PRELOAD wrapper's
// constructor reads settings before the static objects of the library it
// carries are initialised (one shared object: their order is the link's).
// clang-format off
std::vector<Setting> make_table() { return {
    {"DYAD_SERVICE_URI", T::text, "tcp://127.0.0.1:7627", "client",
     "this node's dyadd (`tcp://HOST:PORT` or `unix:PATH`)"},
    {"DYAD_AUTH_KEY_FILE", T::text, nullptr, "client, dyadd",
     "the job's key file (`dyad keygen FILE`, mode 0600): services and clients authenticate each other with it; dyadd's default `--auth-key`"},
    {"DYAD_PATH_PRODUCER", T::text, nullptr, "client, dyadd",
     "producer-managed directory; must be the directory the node's dyadd serves (dyadd's default PRODUCER_DIR)"},
    {"DYAD_PATH_CONSUMER", T::text, nullptr, "client",
     "consumer-managed directory"},
    {"DYAD_KVS_NAMESPACE", T::text, nullptr, "client, dyadd",
     "metadata namespace (unset: the service's, `dyad`)"},
    {"DYAD_WAIT_TIMEOUT", T::seconds, nullptr, "client",
     "seconds a consumer waits for a file to be produced, or produced again after a change "
     "(unset: forever)"},
    {"DYAD_TRANSFER_TIMEOUT", T::seconds, "60", "client",
     "seconds without progress before a transfer fails; also how long a node waits for another node's claim of an origin file (\"Each origin file read once\")"},
    {"DYAD_CONSUME_WINDOW", T::count, "16", "client",
     "files in flight when consuming many (`dyad consume FILE...`, `dyad sync`, `dyad_consume_many`): lookups and fetches overlapped"},
    {"DYAD_FETCH_WORKER_THREADS", T::count, "0", "client",
     "upstream DYAD's fetch worker pool: accepted; a value above 0 is the window of `DYAD_CONSUME_WINDOW` when that is not set (our fetches are already concurrent)"},
    {"DYAD_PATH_ORIGIN", T::text, nullptr, "client",
     "read-through: a directory (e.g. on the parallel file system) whose file at the same relative path a consume copies when no produce of it is recorded (user guide, \"Cache and origin\")"},
    {"DYAD_ORIGIN_PUBLISH", T::flag, "0", "client",
     "with `DYAD_PATH_ORIGIN`: copy a read-through file into `DYAD_PATH_PRODUCER` and publish it, so other nodes fetch it from this one"},
    {"DYAD_ORIGIN_RECHECK", T::seconds, "1", "client",
     "with `DYAD_PATH_ORIGIN`: seconds a process uses what a range read of an origin file learned (no record; the origin file's identity) before asking the store and the origin again; a record published or an origin file changed meanwhile is seen within this time (`0`: ask at every range; user guide, \"Byte ranges of origin files\")"},
    {"DYAD_REPLICAS", T::count, nullptr, "client",
     "copies of each produced file other nodes' services keep (0..16; unset: the service's `--replicas`); consumers fail over to them when the owner is gone"},
    {"DYAD_REPLICAS_SYNC", T::flag, "0", "client",
     "`dyad_produce` returns only once the `DYAD_REPLICAS` copies are durable (else they follow asynchronously)"},
    {"DYAD_CACHE_CAPACITY", T::size, "0", "client",
     "bytes of consumer copies a consumer directory keeps (`0`: no limit); beyond it the least recently used (or oldest) are removed"},
    {"DYAD_CACHE_POLICY", T::text, "LRU", "client",
     "which copies go first: `LRU` (least recently consumed), `FIFO` (oldest installed) or `NONE` (none: counted only)"},
    {"DYAD_CACHE_LOW_WATERMARK", T::text, "0.8", "client",
     "fraction of `DYAD_CACHE_CAPACITY` (in (0, 1]) eviction brings the usage down to"},
    {"DYAD_CACHE_GRACE_PERIOD", T::seconds, "5", "client",
     "a copy consumed more recently than this many seconds is never evicted"},
    {"DYAD_DTL_MODE", T::transport, "AUTO", "client, dyadd",
     "transport: `AUTO` (per file, by score; leaves out, with one warning, a transport that cannot work in the process), `LOCAL`, `FLUX_RPC` (alias `STREAM`), `UCX`, `MARGO` (alias `OFI`); a fixed one that cannot work in a consumer's process is an error at once"},
    {"DYAD_KEY_DEPTH", T::count, "3", "client",
     "DYAD's metadata key scheme: levels; producers and consumers must agree"},
    {"DYAD_KEY_BINS", T::count, "1024", "client",
     "DYAD's metadata key scheme: bins per level; producers and consumers must agree"},
    {"DYAD_PATH_RELATIVE", T::flag, "0", "client",
     "paths not starting with `/` are relative to the managed directory"},
    {"DYAD_SHARED_STORAGE", T::flag, "0", "client",
     "storage visible to every node: consume only waits for the produce"},
    {"DYAD_FSYNC_WRITE", T::flag, "0", "client",
     "fsync files before publishing and after receiving"},
    {"DYAD_ASYNC_PUBLISH", T::flag, "0", "client",
     "`dyad_produce`, pydyad's `produce`, the C++ streams and the wrapper's close return once the closed file is queued; a thread of the process publishes the queue in order, and a failure is returned by the process's next DYAD call and by `dyad_finalize` (user guide, \"Asynchronous publish\")"},
    {"DYAD_ASYNC_PUBLISH_TIMEOUT", T::seconds, "60", "client",
     "with `DYAD_ASYNC_PUBLISH`: seconds `dyad_finalize`, process exit and `fork` wait for the queued publishes (what is not published by then is said), and a call waits for room in a full queue"},
    {"DYAD_ASYNC_PUBLISH_MAX_FILES", T::count, "1024", "client",
     "with `DYAD_ASYNC_PUBLISH`: files the queue holds at most; a call producing one more waits for room (nothing is dropped)"},
    {"DYAD_ASYNC_PUBLISH_MAX_BYTES", T::size, "4M", "client",
     "with `DYAD_ASYNC_PUBLISH`: bytes of queued metadata (each file's path and 64 bytes) at most; a call waits while it is full"},
    {"DYAD_SYNC_CHECK", T::flag, "0", "client",
     "on success set `DYAD_SYNC_HEALTH=ok` in the process environment"},
    {"DYAD_SYNC_DEBUG", T::flag, "0", "client",
     "debug logging"},
    {"DYAD_SERVICE_MUX", T::count, "1", "client",
     "as in DYAD (no effect yet)"},
    {"DYAD_REINIT", T::flag, "0", "client",
     "as in DYAD"},
    {"DYAD_LOG_LEVEL", T::level, "warn", "client, dyadd",
     "`trace`, `debug`, `info`, `warn`, `error`, `off` (dyadd: `info` when unset)"},
    {"DYAD_TRACE", T::text, nullptr, "client, dyadd",
     "a directory: every DYAD process writes its Chrome trace-event file there (`dyad-NODE-PID.json`: produce, lookup, transfer, commit, serve... per file, for Perfetto; user guide, \"Tracing (DYAD_TRACE)\"); dyadd's `--trace`"},
    {"DYAD_TRACE_MAX_SIZE", T::size, "64M", "client, dyadd",
     "bytes of events one trace file holds at most; later events are dropped and counted (in the file's last event, `trace_end`, and one warning)"},
    {"DYAD_NODE_ID", T::text, nullptr, "client, dyadd",
     "node id (unset: the host name); dyadd's default `--node`"},
    {"DYAD_NODE_RANK", T::count, nullptr, "dyadd",
     "this node's rank, the `owner_rank` of its files and `ctx->rank` of its clients (as `--rank`; unset: `SLURM_NODEID`, `FLUX_TASK_RANK` or `PMIX_RANK`, else assigned by the store in registration order)"},
    {"DYAD_SERVICE_MEMORY", T::size, "256M", "dyadd",
     "memory for transfer buffers, all consumers together (as `--memory`)"},
    {"DYAD_DTL_FIGURES", T::text, nullptr, "dyadd",
     "figures the AUTO selector scores, e.g. `UCX@network=20/10,FLUX_RPC=100/1.2`"},
    {"DYAD_STREAM_SENDFILE", T::flag, "0", "dyadd (FLUX_RPC)",
     "stream chunks by `sendfile(2)` (off: measured slower, see design.md)"},
    {"DYAD_WRITE_BEHIND", T::text, "auto", "client (FLUX_RPC, UCX tag)",
     "files above 4 MiB (FLUX_RPC) or 5 MiB (UCX): a writer thread hashes and writes while the next chunks arrive (`on`), or the receiving thread does it (`off`); `auto`: on where the process may run on 4 CPUs or more"},
    {"DYAD_UCX_PROTO", T::text, "auto", "client (UCX)",
     "`auto` (RMA put where UCX does it natively, else tags; the small files of a consume of many go many to a request over the request connection), `tag` or `put` (every file by UCX)"},
    {"DYAD_UCX_WINDOW", T::size, "64M", "client (UCX)",
     "UCX consumer's registered receive window (4M, one chunk, to 2G)"},
    {"DYAD_UCX_EP_CACHE_SIZE", T::count, "64", "dyadd (UCX)",
     "UCX endpoints a service keeps (LRU)"},
    {"DYAD_UCX_DIRECT", T::flag, "1", "dyadd (UCX)",
     "file reads land in a consumer's mapped window when UCX offers one"},
    {"DYAD_UCX_SHARED_MEMORY", T::flag, "0", "dyadd (UCX)",
     "also reach consumers over UCX's shared-memory transports (`posix`, `sysv`, `cma`...); only where every key holder may write into every process of dyadd's user (docs/security.md)"},
    {"DYAD_MARGO_PROTO", T::text, "ofi+tcp", "client, dyadd (MARGO)",
     "libfabric protocol: `ofi+tcp`, `ofi+sockets`, `ofi+shm`, `ofi+verbs`, `ofi+cxi`; `dyad config` lists those that work here; upstream's Mercury names that libfabric serves are taken (`sm`, `na+sm`: `ofi+shm`; `tcp`, `ofi+tcp;ofi_rxm`: `ofi+tcp`), Mercury-only ones (`ucx+*`, `bmi+*`) refused (migrating-from-dyad.md)"},
    {"DYAD_OFI_PLACEMENT", T::flag, "0", "client (MARGO)",
     "reads land in the destination file (reserved, then mapped chunk by chunk) instead of going through a registered window and `write(2)` (slower on TCP and shared memory, see design.md)"},
    {"DYAD_OFI_NO_PROGRESS_THREAD", T::flag, "0", "dyadd (MARGO)",
     "no progress thread for providers that need manual progress (for tests)"},
    {"DYAD_CONFIG_FILE", T::text, nullptr, "client, dyadd",
     "a file of `NAME=VALUE` lines (`#` comments) for settings the environment does not set"},
    {"DYAD_LIBRARY", T::text, nullptr, "pydyad",
     "path of `libdyad.so` for the Python package (unset: the build or install beside it)"},
    {"DYAD_JOB_MANAGER", T::text, nullptr, "client",
     "`slurm` in the tasks of a `--dyad` job (set by the SPANK plugin, with `DYAD_WRAPPER` and `DYAD_LIBRARY`): errors then say what a user can do there"},
    };
}
// clang-format on

std::mutex g_mu;
std::map<std::string, std::string, std::less<>> g_options;

struct FileValues {
    std::string path;
    std::map<std::string, std::string, std::less<>> values;
    Status status;
};

std::optional<std::string> getenv_str(const char* name) {
    const char* v = std::getenv(name);
    if (!v) return std::nullopt;
    return std::string(v);
}

std::string trim(const std::string& s) {
    size_t b = s.find_first_not_of(" \t\r");
    if (b == std::string::npos) return "";
    size_t e = s.find_last_not_of(" \t\r");
    return s.substr(b, e - b + 1);
}

// The configuration file, read again only when DYAD_CONFIG_FILE changes.
FileValues read_file(const std::string& path) {
    FileValues f;
    f.path = path;
    std::ifstream in(path);
    if (!in) {
        f.status =
            Status(DYAD_RC_NOCTX, "DYAD_CONFIG_FILE='" + path + "' cannot be read: fix or unset it",
                   errno ? errno : ENOENT);
        return f;
    }
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
        line = trim(line);
        if (line.empty() || line[0] == '#') continue;
        size_t eq = line.find('=');
        std::string name = eq == std::string::npos ? line : trim(line.substr(0, eq));
        const Setting* s = find(name);
        if (eq == std::string::npos || !s || name == "DYAD_CONFIG_FILE") {
            if (f.status.is_ok())
                f.status = Status(DYAD_RC_NOCTX,
                                  path + ":" + std::to_string(n) + ": '" + line +
                                      "' is not NAME=VALUE with a DYAD setting ('dyad config' "
                                      "lists them)",
                                  EINVAL);
            continue;
        }
        f.values[name] = trim(line.substr(eq + 1));
    }
    return f;
}

std::optional<std::string> from_file(std::string_view name) {
    auto path = getenv_str("DYAD_CONFIG_FILE");
    if (!path || path->empty()) return std::nullopt;
    static std::optional<FileValues> cached;
    std::lock_guard<std::mutex> lk(g_mu);
    if (!cached || cached->path != *path) cached = read_file(*path);
    auto it = cached->values.find(name);
    if (it == cached->values.end()) return std::nullopt;
    return it->second;
}

Status file_status() {
    auto path = getenv_str("DYAD_CONFIG_FILE");
    if (!path || path->empty()) return Status::ok();
    return read_file(*path).status;
}

Status bad(const Value& v, const Status& why) {
    std::string from = v.source == Source::file     ? " (from DYAD_CONFIG_FILE)"
                       : v.source == Source::option ? " (from the command line)"
                                                    : "";
    return Status(DYAD_RC_NOCTX, why.message() + from, why.err());
}

}  // namespace

const std::vector<Setting>& table() {
    static const std::vector<Setting> t = make_table();
    return t;
}

const Setting* find(std::string_view name) {
    for (const auto& s : table())
        if (name == s.name) return &s;
    return nullptr;
}

const char* type_name(Type t) {
    switch (t) {
        case T::text:
            return "text";
        case T::flag:
            return "boolean";
        case T::count:
            return "integer";
        case T::seconds:
            return "seconds";
        case T::size:
            return "size";
        case T::level:
            return "log level";
        case T::transport:
            return "transport";
    }
    return "?";
}

const char* source_name(Source s) {
    switch (s) {
        case Source::none:
            return "unset";
        case Source::defaults:
            return "default";
        case Source::file:
            return "file";
        case Source::env:
            return "env";
        case Source::option:
            return "option";
    }
    return "?";
}

Value lookup(std::string_view name) {
    const Setting* s = find(name);
    if (!s) {
        DYAD_ERROR("config", "internal: '%.*s' is not in the settings table",
                   static_cast<int>(name.size()), name.data());
        return {};
    }
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_options.find(name);
        if (it != g_options.end()) return {it->second, Source::option};
    }
    auto usable = [s](const std::string& v) { return s->type == T::flag || !v.empty(); };
    if (auto v = getenv_str(s->name); v && usable(*v)) return {*v, Source::env};
    if (auto v = from_file(name); v && usable(*v)) return {*v, Source::file};
    if (s->def) return {s->def, Source::defaults};
    return {};
}

Result<bool> flag(std::string_view name) {
    Value v = lookup(name);
    if (!v.set()) return false;
    auto b = parse_bool(std::string(name), v.text);
    if (b) return b.value();
    // DYAD treats a set variable as on whatever its value; so do we, except
    // for the words that say off (docs/migrating-from-dyad.md).
    DYAD_WARN("config",
              "%.*s='%s' is not a boolean: taken as on (set means on, as in DYAD); use 1 "
              "or 0",
              static_cast<int>(name.size()), name.data(), v.text.c_str());
    return true;
}

Result<uint64_t> size(std::string_view name) {
    Value v = lookup(name);
    if (!v.set()) return uint64_t{0};
    auto b = parse_size(std::string(name), v.text);
    if (!b) return bad(v, b.status());
    return b.value();
}

Result<unsigned> count(std::string_view name, unsigned min, unsigned max) {
    Value v = lookup(name);
    if (!v.set()) return min;
    auto b = parse_uint(std::string(name), v.text, min, max);
    if (!b) return bad(v, b.status());
    return b.value();
}

Result<std::optional<double>> seconds(std::string_view name) {
    Value v = lookup(name);
    if (!v.set()) return std::optional<double>();
    auto b = parse_seconds(std::string(name), v.text);
    if (!b) return bad(v, b.status());
    return std::optional<double>(b.value());
}

std::string text(std::string_view name) {
    return lookup(name).text;
}

Result<uint64_t> size(std::string_view name, uint64_t min, uint64_t max, const char* range) {
    auto v = size(name);
    if (!v) return v;
    if (v.value() < min || v.value() > max)
        return bad(lookup(name), Status(DYAD_RC_NOCTX,
                                        std::string(name) + "=" + std::to_string(v.value()) +
                                            " is outside " + range,
                                        EINVAL));
    return v;
}

Result<std::string> choice(std::string_view name, std::initializer_list<std::string_view> words,
                           std::initializer_list<std::string_view> synonyms, dyad_rc_t rc) {
    Value v = lookup(name);
    for (auto w : words)
        if (v.text == w) return v.text;
    for (auto w : synonyms)
        if (v.text == w) return v.text;
    std::string list;
    size_t i = 0;
    for (auto w : words) {
        if (i > 0) list += i + 1 == words.size() ? " or " : ", ";
        list += w;
        ++i;
    }
    Status why(rc, std::string(name) + "='" + v.text + "': use " + list, EINVAL);
    Status st = bad(v, why);
    return Status(rc, st.message(), st.err());
}

std::optional<std::string> foreign(const char* name) {
    return getenv_str(name);
}

void set_option(std::string_view name, std::string value) {
    std::lock_guard<std::mutex> lk(g_mu);
    g_options[std::string(name)] = std::move(value);
}

Status check(std::string_view reader) {
    Status f = file_status();
    if (!f) return f;
    for (const auto& s : table()) {
        if (std::string_view(s.readers).find(reader) == std::string_view::npos) continue;
        Value v = lookup(s.name);
        if (!v.set()) continue;
        Status st;
        switch (s.type) {
            case T::flag:
                st = flag(s.name).status();
                break;
            case T::size:
                st = size(s.name).status();
                break;
            case T::count:
                st = count(s.name, 0, ~0u).status();
                break;
            case T::seconds:
                st = seconds(s.name).status();
                break;
            case T::transport:
                break;  // the table of backends checks (dtl)
            case T::level: {
                log::Level l;
                if (!log::parse_level(v.text, &l))
                    st = Status(DYAD_RC_NOCTX,
                                std::string(s.name) + "='" + v.text +
                                    "' is not a level: use trace, debug, info, warn, error or off",
                                EINVAL);
                break;
            }
            case T::text:
                break;
        }
        if (!st) return st;
    }
    return Status::ok();
}

nlohmann::json describe() {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& s : table()) {
        Value v = lookup(s.name);
        out.push_back({{"name", s.name},
                       {"value", v.set() ? nlohmann::json(v.text) : nlohmann::json(nullptr)},
                       {"source", source_name(v.source)},
                       {"type", type_name(s.type)},
                       {"default", s.def ? nlohmann::json(s.def) : nlohmann::json(nullptr)},
                       {"read_by", s.readers},
                       {"meaning", s.meaning}});
    }
    return out;
}

std::string markdown() {
    std::string out = "| variable | type | default | read by | meaning |\n|---|---|---|---|---|\n";
    for (const auto& s : table()) {
        out += std::string("| `") + s.name + "` | " + type_name(s.type) + " | " +
               (s.def ? std::string("`") + s.def + "`" : std::string("unset")) + " | " + s.readers +
               " | " + s.meaning + " |\n";
    }
    return out;
}

}  // namespace dyad::settings
