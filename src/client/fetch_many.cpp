// SPDX-License-Identifier: Apache-2.0
// consume_many's batches: many small files of one owner in one
// dyad.fetch_many request (src/service/fetch_many.cpp has the service's
// side; docs/design.md, "Many small files in one request"). Each file is
// still installed the way a single fetch installs it: under its lock, into
// a temporary file, checked against its size and checksum, renamed into
// place. What the owner refuses, or does not answer, is fetched alone.
#include <chrono>

#include "client.hpp"
#include "common/checksum.hpp"
#include "common/log.hpp"
#include "dtl/fetch_many.hpp"
#include "fetch_channel.hpp"

namespace dyad::client {

namespace {

constexpr double kControlTimeout = 30.0;  // sending the request

double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::optional<std::string> Client::batch_endpoint(const Record& rec, const ServiceInfo& svc) {
    if (no_fetch_many_.load(std::memory_order_relaxed) || cons_.empty() ||
        rec.size > dtl::kFetchManyFileMax)
        return std::nullopt;
    if (cfg_.shared_storage ||
        (rec.node == svc.node && canonical_path(rec.producer_dir) == cons_.path()))
        return std::nullopt;  // in place: nothing moves
    const dtl::Backend& stream = dtl::universal_backend();
    if (backend_) {
        if (backend_ != &stream) return std::nullopt;
    } else {
        ConsumeReport rep;
        auto order = plan(rec, svc, &rep);
        if (order.empty() || order.front() != &stream) return std::nullopt;
    }
    std::string ep = owner_endpoint(rec, svc);
    if (ep.empty()) return std::nullopt;
    return ep;
}

std::vector<size_t> Client::consume_batch(const std::vector<size_t>& which,
                                          const std::vector<std::string>& upaths,
                                          const std::vector<Record>& records,
                                          const ServiceInfo& svc, const std::string& ep,
                                          const FinishFn& finish,
                                          std::chrono::steady_clock::time_point t0) {
    const std::string& stream = dtl::universal_backend().name;
    std::vector<size_t> asked, left;
    for (size_t i : which) {
        if (cstore_.present(upaths[i], records[i])) {
            ConsumeReport rep;
            rep.action = "present";
            rep.transport = "none";
            rep.wait_s = since(t0);
            finish(i, Status::ok(), rep);
            continue;
        }
        asked.push_back(i);
    }
    if (asked.empty()) return left;
    // Files of one endpoint have one owner: only it may answer there.
    std::string owner = records[asked.front()].owner;
    for (size_t i : asked)
        if (records[i].owner != owner) owner.clear();
    auto conn = pool_->get(ep, Deadline::after(kControlTimeout), owner);
    if (!conn) return asked;  // alone, each says why
    nlohmann::json files = nlohmann::json::array();
    const std::string nspace = ns(svc);
    for (size_t i : asked)
        files.push_back({{"upath", upaths[i]},
                         {"generation", records[i].generation},
                         {"ns", nspace},
                         {"key", key_of(upaths[i])}});
    RpcFetchChannel ch(*conn.value(), cfg_.transfer_timeout);
    // "answer": "raw": served files come as a binary header and the bytes,
    // no JSON meta (older owners ignore it and answer in JSON, still read).
    Status opened = ch.open({{"transport", stream}, {"files", std::move(files)}, {"answer", "raw"}},
                            Deadline::after(kControlTimeout), "dyad.fetch_many");
    if (!opened) return asked;
    std::vector<char> answered(asked.size(), 0);
    std::string bytes;
    for (;;) {
        auto m = ch.next();
        if (!m) {
            if (m.status().err() == ENOSYS) {  // an older owner: one fetch per file
                DYAD_DEBUG("client", "%s does not serve dyad.fetch_many: one fetch per file",
                           ep.c_str());
                no_fetch_many_ = true;
            }
            break;
        }
        if (m->kind == dtl::FetchChannel::Kind::end) break;
        // A served file: compact (no meta; a header, then the bytes) or
        // JSON ({"i", "size", "xxh3"}, the bytes). Anything out of protocol:
        // the rest alone.
        std::optional<uint64_t> k;
        Sent sent;
        size_t n = m->data_len;
        const bool compact = m->meta.empty();  // no meta (the channel gives {})
        if (compact) {
            char hdr[dtl::kRawFileHeader];
            if (n < sizeof hdr || !ch.read(hdr, sizeof hdr)) break;
            const auto h = dtl::get_raw_file_header(hdr);
            k = h.index;
            sent = {n - sizeof hdr, h.digest};
            n -= sizeof hdr;
        } else {
            k = dtl::meta_u64(m->meta, "i");
        }
        if (!k || *k >= asked.size() || answered[*k]) break;
        answered[*k] = 1;
        const size_t i = asked[*k];
        if (!compact && m->meta.contains("rc")) {  // refused here: fetched alone, which says why
            left.push_back(i);
            continue;
        }
        if (!compact) {
            auto s = sent_of(m->meta, upaths[i]);
            if (!s) {
                left.push_back(i);
                continue;
            }
            sent = s.value();
        }
        bytes.resize(n);
        if (!ch.read(bytes.data(), bytes.size())) {
            left.push_back(i);
            break;
        }
        ConsumeReport rep;
        rep.wait_s = since(t0);
        rep.endpoint = ep;
        const auto t1 = std::chrono::steady_clock::now();
        Status s = [&]() -> Status {
            // Unnamed file, linked into place: no lock, nothing to clean up.
            auto whole =
                cstore_.install_whole(upaths[i], records[i], sent, bytes.data(), bytes.size());
            if (!whole) return whole.status();
            if (whole.value()) {
                rep.action = "fetched";
                rep.transport = stream;
                rep.bytes = bytes.size();
                if (!backend_) (void)plan(records[i], svc, &rep);  // AUTO's why (cached)
                return Status::ok();
            }
            auto lk = cstore_.lock(upaths[i], wait_deadline(), cfg_.transfer_timeout);
            if (!lk) return lk.status();
            if (cstore_.present(upaths[i], records[i])) {
                rep.action = "present";
                rep.transport = "none";
                return Status::ok();
            }
            auto staging = cstore_.stage(upaths[i], lk.value().get());
            if (!staging) return staging.status();
            Status w = staging.value()->sink().write(bytes.data(), bytes.size());
            if (!w) return w;
            const nlohmann::json trailer = {{"size", sent.size}, {"xxh3", Xxh3::to_hex(sent.xxh3)}};
            Status c = staging.value()->commit(trailer, records[i]);
            if (!c) return c;
            rep.action = "fetched";
            rep.transport = stream;
            rep.bytes = bytes.size();
            if (!backend_) (void)plan(records[i], svc, &rep);  // AUTO's why (cached)
            return Status::ok();
        }();
        if (!s) {  // alone, with its retries and its own message
            DYAD_DEBUG("client", "%s from dyad.fetch_many: %s; fetched alone", upaths[i].c_str(),
                       s.to_string().c_str());
            left.push_back(i);
            continue;
        }
        rep.transfer_s = since(t1);
        finish(i, Status::ok(), rep);
    }
    if (ch.ended()) pool_->put(std::move(conn.value()));
    for (size_t k = 0; k < asked.size(); ++k)
        if (!answered[k]) left.push_back(asked[k]);
    return left;
}

}  // namespace dyad::client
