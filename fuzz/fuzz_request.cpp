// SPDX-License-Identifier: Apache-2.0
// Request payloads: a request frame's meta as a peer sends it, checked the
// way the service's handlers check it before doing anything (dyad.fetch:
// transport and upath; dyad.fetch_many: its files, parse_fetch_many; dyad.publish: upath, ns,
// key_depth, key_bins and the key they make; kvs.put: ns, key, value through check_put; kvs.get and
// kvs.list: string arguments). The raw input is also taken as a upath.
// Properties: no crash, no exception; a normalized upath is relative, has no
// "." / ".." / empty component, does not start with .dyad, and normalizes to
// itself; every refusal can be sent back as JSON.
#include <cstdint>
#include <string>
#include <string_view>

#include "common/keygen.hpp"
#include "common/paths.hpp"
#include "dtl/channel.hpp"
#include "dtl/dtl.hpp"
#include "dtl/fetch_many.hpp"
#include "fuzz_check.hpp"
#include "kvs/store.hpp"
#include "rpc/wire.hpp"

using namespace dyad;

namespace {
void answerable(const Status& st) {
    // What Request::error sends: must serialize whatever the message holds.
    (void)nlohmann::json({{"msg", st.message()}, {"rc", static_cast<int>(st.rc())}}).dump();
}

// from_json: the path came in a JSON string (valid UTF-8), so its refusal
// goes back as JSON; raw bytes are only checked for the path properties.
void check_upath(std::string_view raw, bool from_json = true) {
    auto up = normalize_upath(raw);
    if (!up) {
        if (from_json) answerable(up.status());
        return;
    }
    const std::string& u = up.value();
    FUZZ_CHECK(!u.empty() && u.size() <= 4096);
    FUZZ_CHECK(u.front() != '/' && u.back() != '/');
    FUZZ_CHECK(u.find('\0') == std::string::npos);
    size_t start = 0;
    for (;;) {
        size_t slash = u.find('/', start);
        std::string_view part(u.data() + start,
                              (slash == std::string::npos ? u.size() : slash) - start);
        FUZZ_CHECK(!part.empty() && part != "." && part != "..");
        if (start == 0) FUZZ_CHECK(part != kReservedDir);
        if (slash == std::string::npos) break;
        start = slash + 1;
    }
    auto again = normalize_upath(u);
    FUZZ_CHECK(again && again.value() == u);
}

void fetch(const nlohmann::json& a) {
    std::string transport = dtl::universal_backend().name;
    if (a.contains("transport") && a["transport"].is_string()) transport = a["transport"];
    auto b = dtl::find_backend(transport);
    if (!b) answerable(b.status());
    auto mode = dtl::canonical_mode(transport);
    if (!mode) answerable(mode.status());
    if (a.contains("upath") && a["upath"].is_string())
        check_upath(a["upath"].get_ref<const std::string&>());
    // Transport arguments the senders read (UCX window, OFI chunk...).
    for (const char* k : {"ucx_tag", "ucx_window", "ucx_window_size", "chunk", "offset", "credits"})
        (void)dtl::meta_u64(a, k);
    for (const char* k : {"ucx_worker", "ucx_consumer", "ucx_rkey", "ucx_proto", "ofi_addr"})
        (void)dtl::meta_str(a, k);
}

void fetch_many(const nlohmann::json& a) {
    auto files = dtl::parse_fetch_many(a);
    if (!files) return answerable(files.status());
    FUZZ_CHECK(!files->empty() && files->size() <= dtl::kFetchManyFiles);
    for (const auto& f : files.value()) {
        if (!f.error.is_ok()) {
            answerable(f.error);
            FUZZ_CHECK(f.upath.empty());
            continue;
        }
        check_upath(f.upath);
        (void)dtl::meta_u64(f.args, "generation");
    }
}

void publish(const nlohmann::json& a) {
    auto raw = dtl::meta_str(a, "upath");
    if (!raw) return;
    check_upath(*raw);
    auto up = normalize_upath(*raw);
    if (!up) return;
    std::string ns = dtl::meta_str(a, "ns").value_or("dyad");
    if (ns.empty() || ns == kvs::kServicesNamespace) return;
    uint64_t depth = dtl::meta_u64(a, "key_depth").value_or(3);
    uint64_t bins = dtl::meta_u64(a, "key_bins").value_or(1024);
    if (depth > 64 || bins == 0 || bins > (1u << 30)) return;
    auto key = gen_path_key(up.value(), static_cast<unsigned>(depth), static_cast<unsigned>(bins));
    if (!key) answerable(key.status());
}

void kvs_put(const nlohmann::json& a, const std::string& writer) {
    for (const char* k : {"ns", "key", "value"})
        if (!a.contains(k) || !a[k].is_string()) return;  // args_ok
    Status st = kvs::check_put(writer, a["ns"], a["key"], a["value"]);
    if (!st) answerable(st);
    if (writer.empty()) FUZZ_CHECK(!st);
    (void)dtl::meta_u64(a, "replaces");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string text(reinterpret_cast<const char*>(data), size);
    check_upath(text, false);
    auto meta = rpc::parse_meta(text);
    if (meta.is_discarded() || !meta.is_object()) return 0;
    if (!meta.contains("topic") || !meta["topic"].is_string())
        return 0;  // "request without a topic"
    const std::string topic = meta["topic"];
    if (topic == "dyad.fetch") fetch(meta);
    if (topic == "dyad.fetch_many") fetch_many(meta);
    if (topic == "dyad.publish") publish(meta);
    if (topic == "kvs.put") {
        kvs_put(meta, "");
        kvs_put(meta, "svc-1");
        kvs_put(meta, dtl::meta_str(meta, "key").value_or(""));
    }
    if (topic == "kvs.get" || topic == "kvs.list") {
        (void)dtl::meta_str(meta, "ns");
        (void)dtl::meta_str(meta, "prefix");
        (void)meta.value("wait", false);
    }
    (void)dtl::meta_u64(meta, "timeout_ms");
    return 0;
}
