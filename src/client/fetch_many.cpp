// SPDX-License-Identifier: Apache-2.0
// consume_many's batches: many small files of one owner in one
// dyad.fetch_many request (src/service/fetch_many.cpp has the service's
// side; docs/design.md, "Many small files in one request"). Each file is
// still installed the way a single fetch installs it: under its lock, into
// a temporary file, checked against its size and checksum, renamed into
// place. What the owner refuses, or does not answer, is fetched alone.
#include <chrono>

#include "fetcher.hpp"
#include "common/checksum.hpp"
#include "common/log.hpp"
#include "common/seconds.hpp"
#include "dtl/fetch_many.hpp"
#include "fetch_channel.hpp"
#include "trace_points.hpp"

namespace dyad::client {

namespace {

// One answer of a dyad.fetch_many, read up to the file's bytes.
struct Answer {
    uint64_t index = 0;        // among the files asked
    std::optional<Sent> sent;  // none: refused here (fetched alone, which says why)
    size_t bytes = 0;          // of the file, to read next
};

// A served file: compact (no meta; a header, then the bytes) or JSON
// (proto::FetchManyItem, then the bytes). Nullopt: out of protocol.
std::optional<Answer> read_answer(RpcFetchChannel& ch, const dtl::FetchChannel::Message& m) {
    Answer a;
    a.bytes = m.data_len;
    if (m.meta.empty()) {  // compact: no meta (the channel gives {})
        char hdr[dtl::kRawFileHeader];
        if (a.bytes < sizeof hdr || !ch.read(hdr, sizeof hdr)) return std::nullopt;
        const auto h = dtl::get_raw_file_header(hdr);
        a.bytes -= sizeof hdr;
        a.index = h.index;
        a.sent = Sent{a.bytes, h.digest};
        return a;
    }
    auto item = proto::FetchManyItem::parse(m.meta);
    if (!item) return std::nullopt;
    a.index = item->index;
    if (!item->refused)
        if (auto d = item->end().digest()) a.sent = Sent{item->size, *d};
    return a;
}

// Files of one endpoint have one owner: only it may answer there ("" if
// the records do not agree).
std::string one_owner(const std::vector<size_t>& asked, const std::vector<Record>& records) {
    std::string owner = records[asked.front()].owner;
    for (size_t i : asked)
        if (records[i].owner != owner) owner.clear();
    return owner;
}

// The transport a batch is asked, and reported, under: the fixed mode's
// (one that batches small files: batch_endpoint), else the stream.
const std::string& batch_transport(const dtl::Backend* fixed) {
    return fixed ? fixed->name : dtl::universal_backend().name;
}

}  // namespace

std::optional<std::string> Fetcher::batch_endpoint(const Record& rec, const ServiceInfo& svc) {
    if (no_fetch_many_.load(std::memory_order_relaxed) || p_.cons.empty() ||
        rec.size > dtl::kFetchManyFileMax)
        return std::nullopt;
    if (in_place(rec, svc)) return std::nullopt;  // nothing moves
    if (const dtl::Backend* fixed = p_.planner.fixed()) {
        if (!dtl::batches_small_files(*fixed)) return std::nullopt;
    } else {
        ConsumeReport rep;
        auto order = p_.planner.plan(rec, svc, &rep);
        if (order.empty() || order.front() != &dtl::universal_backend()) return std::nullopt;
    }
    std::string ep = OwnerDirectory::endpoint(rec, svc);
    if (ep.empty()) return std::nullopt;
    return ep;
}

proto::FetchManyRequest Fetcher::batch_request(const std::vector<size_t>& which,
                                               const std::vector<std::string>& upaths,
                                               const std::vector<Record>& records,
                                               const ServiceInfo& svc) const {
    proto::FetchManyRequest req;
    req.transport = batch_transport(p_.planner.fixed());
    // Compact answers: served files come as a binary header and the bytes,
    // no JSON meta (older owners ignore it and answer in JSON, still read).
    req.raw_answer = true;
    const std::string nspace = p_.link.ns(svc);
    for (size_t i : which) {
        proto::FetchRequest one = request_of(upaths[i], records[i], nspace);
        req.files.push_back({one.upath, one.generation, one.ns, one.key});
    }
    return req;
}

std::vector<size_t> Fetcher::unsettled(const std::vector<size_t>& which,
                                       const std::vector<std::string>& upaths,
                                       const std::vector<Record>& records, const ServiceInfo& svc,
                                       const FinishFn& finish,
                                       std::chrono::steady_clock::time_point t0) {
    std::vector<size_t> asked;
    for (size_t i : which) {
        ConsumeReport rep;
        if (settled(upaths[i], records[i], svc, &rep)) {
            rep.wait_s = seconds_since(t0);
            finish(i, Status::ok(), rep);
            continue;
        }
        asked.push_back(i);
    }
    return asked;
}

std::vector<size_t> Fetcher::consume_batch(const std::vector<size_t>& which,
                                           const std::vector<std::string>& upaths,
                                           const std::vector<Record>& records,
                                           const ServiceInfo& svc, const std::string& ep,
                                           const FinishFn& finish,
                                           std::chrono::steady_clock::time_point t0) {
    std::vector<size_t> left;
    const std::vector<size_t> asked = unsettled(which, upaths, records, svc, finish, t0);
    if (asked.empty()) return left;
    const std::string owner = one_owner(asked, records);
    trace::Span sp("fetch_many", "client");
    sp.arg("files", static_cast<uint64_t>(asked.size())).arg("owner", owner).arg("endpoint", ep);
    // The owner, as a source (failover.cpp): with replicas to fail over to,
    // an owner just found unreachable is not tried again, and a cut-off one
    // costs 2 s, not 30.
    const bool failover = p_.cfg.replica_failover && !owner.empty();
    if (failover && p_.owners.down(owner)) return asked;
    Source src;
    src.service = owner;
    src.endpoint = ep;
    src.connect_s = failover ? timeouts::kQuickConnect : timeouts::kControl;
    auto conn = p_.link.pool().get(src.endpoint, Deadline::after(src.connect_s), src.service);
    if (!conn) {
        if (failover) p_.owners.note_down(owner);
        return asked;  // alone, each says why
    }
    RpcFetchChannel ch(*conn.value(), p_.cfg.transfer_timeout);
    Status opened = ch.open(batch_request(asked, upaths, records, svc).build(),
                            Deadline::after(timeouts::kControl), "dyad.fetch_many");
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
            } else {  // a frame that failed its tag, a timeout...: the rest alone
                DYAD_DEBUG("client", "dyad.fetch_many from %s: %s; the rest fetched alone",
                           ep.c_str(), m.status().to_string().c_str());
            }
            break;
        }
        if (m->kind == dtl::FetchChannel::Kind::end) break;
        auto a = read_answer(ch, m.value());
        if (!a) break;  // out of protocol: the rest alone
        if (a->index >= asked.size() || answered[a->index]) break;
        answered[a->index] = 1;
        const size_t i = asked[a->index];
        if (!a->sent) {
            left.push_back(i);
            continue;
        }
        bytes.resize(a->bytes);
        if (!ch.read(bytes.data(), bytes.size())) {
            left.push_back(i);
            break;
        }
        ConsumeReport rep;
        rep.wait_s = seconds_since(t0);
        rep.endpoint = ep;
        const auto t1 = std::chrono::steady_clock::now();
        Status s = install_answer(upaths[i], records[i], svc, *a->sent, bytes, &rep);
        if (!s) {  // alone, with its retries and its own message
            DYAD_DEBUG("client", "%s from dyad.fetch_many: %s; fetched alone", upaths[i].c_str(),
                       s.to_string().c_str());
            left.push_back(i);
            continue;
        }
        rep.transfer_s = seconds_since(t1);
        finish(i, Status::ok(), rep);
    }
    if (ch.ended()) p_.link.pool().put(std::move(conn.value()));
    for (size_t k = 0; k < asked.size(); ++k)
        if (!answered[k]) left.push_back(asked[k]);
    return left;
}

Status Fetcher::install_answer(const std::string& upath, const Record& rec, const ServiceInfo& svc,
                               const Sent& sent, const std::string& bytes, ConsumeReport* rep) {
    // Unnamed file, linked into place: no lock, nothing to clean up.
    trace::Span committing("commit", "client");
    auto whole = p_.cstore.install_whole(upath, rec, sent, bytes.data(), bytes.size());
    if (committing.active())
        trace_commit(committing, rec, p_.lookup.key_of(upath), bytes.size(), whole.status());
    if (!whole) return whole.status();
    Status s;
    if (whole.value()) {
        rep->action = "fetched";
        rep->bytes = bytes.size();
        p_.cache.installed(upath, bytes.size());
    } else {
        s = under_lock(upath, rec, p_.lookup.wait_deadline(), rep, [&](int lock_fd) {
            return stage_commit(upath, rec, lock_fd, rep,
                                [&](FileSink& sink) -> Result<nlohmann::json> {
                                    Status w = sink.write(bytes.data(), bytes.size());
                                    if (!w) return w;
                                    return proto::FetchEnd::of(sent.size, sent.xxh3).build();
                                });
        });
    }
    if (s && rep->action == "fetched") {
        rep->transport = batch_transport(p_.planner.fixed());
        if (!p_.planner.fixed()) (void)p_.planner.plan(rec, svc, rep);  // AUTO's why (cached)
    }
    return s;
}

}  // namespace dyad::client
