// SPDX-License-Identifier: Apache-2.0
// Request payloads: a request frame's meta as a peer sends it, checked the
// way the service's handlers check it before doing anything (dyad.fetch:
// transport, upath and the transports' own fields, proto/transfer.hpp, whose
// requests survive build and parse; dyad.fetch_many: its files,
// proto::FetchManyRequest; dyad.publish: upath, ns, key_depth, key_bins and
// the key they make; kvs.put: ns, key, value through check_put; kvs.get and
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
#include "proto/fetch.hpp"
#include "proto/fields.hpp"
#include "proto/publish.hpp"
#include "proto/transfer.hpp"
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
    // Transport arguments the senders read (UCX worker and window, OFI protocol).
    auto ucx = proto::UcxRequest::parse(a);
    if (ucx) {
        auto again = proto::UcxRequest::parse(ucx->build());
        FUZZ_CHECK(again && again->worker == ucx->worker && again->tag == ucx->tag &&
                   again->window.has_value() == ucx->window.has_value());
    }
    auto ofi = proto::OfiRequest::parse(a);
    if (ofi) FUZZ_CHECK(proto::OfiRequest::parse(ofi->build()).value().proto == ofi->proto);
    // The same object as the answers and updates a consumer or service reads.
    (void)proto::UcxStart::parse(a);
    (void)proto::UcxPutNotice::parse(a);
    (void)proto::UcxAck::parse(a);
    (void)proto::OfiStart::parse(a);
    (void)proto::OfiChunk::parse(a);
    (void)proto::ChunkAck::seq_of(a);
    (void)proto::LocalCopied::parse(a);
}

void fetch_many(const nlohmann::json& a) {
    auto req = proto::FetchManyRequest::parse(a);
    if (!req) return answerable(req.status());
    FUZZ_CHECK(!req->files.empty() && req->files.size() <= proto::kFetchManyFiles);
    for (size_t i = 0; i < req->files.size(); ++i) {
        auto one = req->entry(i);
        if (!one) {
            answerable(one.status());
            FUZZ_CHECK(!req->files[i].upath.has_value());
            continue;
        }
        check_upath(one->upath);
    }
}

void publish(const nlohmann::json& a) {
    auto req = proto::PublishRequest::parse(a);
    if (!req) return answerable(req.status());
    check_upath(req->upath);
    auto up = normalize_upath(req->upath);
    if (!up) return;
    std::string ns = req->ns.value_or("dyad");
    if (ns.empty() || ns == kvs::kServicesNamespace) return;
    if (!req->check()) return answerable(req->check());
    auto key = gen_path_key(up.value(), static_cast<unsigned>(req->key_depth),
                            static_cast<unsigned>(req->key_bins));
    if (!key) answerable(key.status());
}

void kvs_put(const nlohmann::json& a, const std::string& writer) {
    for (const char* k : {"ns", "key", "value"})
        if (!a.contains(k) || !a[k].is_string()) return;  // args_ok
    Status st = kvs::check_put(writer, a["ns"], a["key"], a["value"]);
    if (!st) answerable(st);
    if (writer.empty()) FUZZ_CHECK(!st);
    (void)proto::lenient_u64(a, "replaces");
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
        kvs_put(meta, proto::lenient_str(meta, "key").value_or(""));
    }
    if (topic == "kvs.get" || topic == "kvs.list") {
        (void)proto::lenient_str(meta, "ns");
        (void)proto::lenient_str(meta, "prefix");
        (void)meta.value("wait", false);
    }
    (void)proto::lenient_u64(meta, "timeout_ms");
    return 0;
}
