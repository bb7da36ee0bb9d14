// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <optional>
#include <thread>

#include "common/log.hpp"
#include "outage.hpp"
#include "proto/kvs.hpp"
#include "store.hpp"

namespace dyad::kvs {
namespace wire = proto::kvs;
namespace {
constexpr double kWaitSlice = 30.0;  // seconds per wait request; the loop re-arms
constexpr double kGrace = 5.0;       // extra client-side time for the answer to travel
// A waiting consumer whose store connection fails (its host restarting)
// tries again after these pauses (doubling), until its own deadline.
constexpr double kRetryFirst = 0.05, kRetryMax = 1.0;
// At the deadline of a wait, the look whether the store is down (seconds).
constexpr double kLastLook = 1.0;
}  // namespace

Result<nlohmann::json> RpcStore::call(const std::string& topic, nlohmann::json args, Deadline d,
                                      double grace, bool* connect_failed) {
    // Reads may be sent again if a pooled connection turns out closed; a put
    // only if it certainly did not reach the store. wait() (connect_failed
    // given) sends again itself.
    const bool idempotent = topic != wire::kPut && !connect_failed;
    bool failed = false;
    auto r = pool_->call(uri_, topic, args, d, grace, idempotent, &failed);
    if (connect_failed) *connect_failed = failed;
    if (!r && failed) return Status(r.status()).wrap("metadata store");
    return r;
}

Result<uint64_t> RpcStore::put(const std::string& ns, const std::string& key,
                               const std::string& value, Deadline d, uint64_t replaces) {
    auto r = call(wire::kPut, wire::PutArgs{ns, key, value, replaces}.build(), d, 0);
    if (!r) return r.status();
    auto a = wire::PutAnswer::parse(r.value());
    if (!a) return Status(a.status()).wrap("the metadata store at " + uri_);
    return a->version;
}

Status RpcStore::remove(const std::string& ns, const std::string& key, Deadline d) {
    auto r = call(wire::kRemove, wire::RemoveArgs{ns, key}.build(), d, 0);
    if (!r) return r.status();
    return Status::ok();
}

Result<Entry> RpcStore::get(const std::string& ns, const std::string& key, Deadline d) {
    auto r = call(wire::kGet, wire::GetArgs{ns, key, false}.build(), d, 0);
    if (!r) return r.status();
    auto a = wire::EntryAnswer::parse(r.value());
    if (!a) return Status(a.status()).wrap("the metadata store at " + uri_);
    return Entry{std::move(a->value), a->version};
}

Result<Entry> RpcStore::wait(const std::string& ns, const std::string& key, Deadline d) {
    double pause = kRetryFirst;
    bool warned = false;
    bool reached = false;  // this wait got to the store (a request went out on a connection)
    // Why the store did not answer, last: said at the deadline instead of a
    // file "not produced" (it may well have been).
    std::optional<Status> down;
    auto at_deadline = [&](const Status& st) -> Status {
        if (!down) return st;
        return Status(
            down->rc(),
            down->message() + "; DYAD retried until the wait's deadline (DYAD_WAIT_TIMEOUT)",
            down->err());
    };
    for (;;) {
        Deadline slice = d.min(Deadline::after(kWaitSlice));
        bool connect_failed = false;
        auto r =
            call(wire::kGet, wire::GetArgs{ns, key, true}.build(), slice, kGrace, &connect_failed);
        if (r) {
            auto a = wire::EntryAnswer::parse(r.value());
            if (!a) return Status(a.status()).wrap("the metadata store at " + uri_);
            if (warned)
                DYAD_WARN("client", "metadata store answers again: waiting for '%s' goes on",
                          key.c_str());
            return Entry{std::move(a->value), a->version};
        }
        const Status& st = r.status();
        if (st.rc() == DYAD_RC_TIMEOUT && !d.expired()) {
            reached = true;
            pause = kRetryFirst;
            continue;
        }
        // The service answered that its store (etcd) is down: asked again
        // until our own deadline.
        const bool store_down = !connect_failed && Outage::unreachable(st);
        // The store went away under a waiting request (its dyadd
        // restarting), or is down now: wait for it to come back, until our
        // own deadline. A store unreachable from the start is said at once
        // to a wait without a deadline (a configuration error far more often
        // than a restart); a wait with one waits for it until then. A peer
        // that refuses us or is no DYAD service is final.
        if (d.expired()) {
            // A wait held by the service until our deadline may have been
            // held through an outage of its store: one quick look says
            // whether it is down now, so the error names the cause.
            if (st.rc() == DYAD_RC_TIMEOUT && !down) {
                bool cf = false;
                auto now = call(wire::kGet, wire::GetArgs{ns, key, false}.build(),
                                Deadline::after(kLastLook), 0, &cf);
                if (!now && !cf && Outage::unreachable(now.status())) down = now.status();
            }
            return at_deadline(st);
        }
        if (!store_down && (st.rc() != DYAD_RC_CONNFAIL || rpc::Connection::not_dyad(st) ||
                            (connect_failed && !reached && d.infinite())))
            return st;
        down = st;
        const bool lost = reached || !connect_failed;  // it went away under us
        if (!store_down) reached = true;
        if (!warned) {
            DYAD_WARN("client",
                      "metadata store at %s %s while waiting for '%s' (%s): trying again until "
                      "the wait's deadline",
                      uri_.c_str(),
                      store_down ? "reports its store down" : (lost ? "lost" : "unreachable"),
                      key.c_str(), st.message().c_str());
            warned = true;
        }
        double left = d.remaining();
        std::this_thread::sleep_for(std::chrono::duration<double>(std::min(pause, left)));
        pause = std::min(pause * 2, kRetryMax);
        if (d.expired())
            return at_deadline(Status(DYAD_RC_TIMEOUT, "no answer before the deadline", ETIMEDOUT));
    }
}

Result<Page> RpcStore::list_page(const std::string& ns, const std::string& prefix,
                                 const std::string& after, uint64_t limit, Deadline d) {
    // The compact answer (an older service answers in the meta).
    wire::ListArgs args{ns, prefix, after, limit, true};
    bool failed = false;
    std::string data;
    auto r = pool_->call(uri_, wire::kList, args.build(), d, 0, true, &failed, &data);
    if (!r && failed) return Status(r.status()).wrap("metadata store");
    if (!r) return r.status();
    auto a = wire::ListAnswer::parse(std::move(r.value()));
    if (!a) return Status(a.status()).wrap("the metadata store at " + uri_);
    if (a->raw) {
        auto got = wire::ListAnswer::parse_raw(data, a->count);
        if (!got) return Status(got.status()).wrap("the metadata store at " + uri_);
        a->entries = std::move(got.value());
    }
    Page page;
    page.entries.reserve(a->entries.size());
    for (auto& e : a->entries)
        page.entries.emplace_back(std::move(e.key), Entry{std::move(e.value), e.version});
    page.more = a->more;
    // A page that does not advance would be asked for again forever.
    if (page.more && (page.entries.empty() || page.entries.back().first <= after))
        return Status(DYAD_RC_BADRPC,
                      "the metadata store at " + uri_ +
                          " answered kvs.list with more entries but no key after '" + after + "'",
                      EPROTO);
    return page;
}

Result<std::vector<std::pair<std::string, Entry>>> RpcStore::list(const std::string& ns,
                                                                  const std::string& prefix,
                                                                  Deadline d) {
    std::vector<std::pair<std::string, Entry>> out;
    std::string after;
    for (;;) {
        auto p = list_page(ns, prefix, after, 0, d);
        if (!p) return p.status();
        for (auto& e : p->entries) out.push_back(std::move(e));
        if (!p->more) return out;
        after = out.back().first;
    }
}

Result<Changes> Store::changes(const std::string&, uint64_t, double, Deadline) {
    return Status(DYAD_RC_BADRPC, describe() + " does not answer kvs.changes: list it", ENOSYS);
}

Result<Changes> RpcStore::changes(const std::string& ns, uint64_t after, double wait, Deadline d) {
    wire::ChangesArgs args{ns, after, wait};
    bool failed = false;
    auto r = pool_->call(uri_, wire::kChanges, args.build(), d, 0, true, &failed);
    if (!r && failed) return Status(r.status()).wrap("metadata store");
    if (!r) return r.status();
    auto a = wire::ChangesAnswer::parse(std::move(r.value()));
    if (!a) return Status(a.status()).wrap("the metadata store at " + uri_);
    // A cursor that goes back would repeat changes forever.
    if (!a->compacted && a->next < after)
        return Status(DYAD_RC_BADRPC,
                      "the metadata store at " + uri_ + " answered kvs.changes after " +
                          std::to_string(after) + " with an earlier revision " +
                          std::to_string(a->next),
                      EPROTO);
    Changes c;
    c.next = a->next;
    c.compacted = a->compacted;
    c.entries.reserve(a->entries.size());
    for (auto& e : a->entries)
        c.entries.emplace_back(std::move(e.key), Entry{std::move(e.value), e.version});
    return c;
}

}  // namespace dyad::kvs
