// SPDX-License-Identifier: Apache-2.0
// The etcd store (etcd_store_impl.hpp): kvs.list's bounded ranges and kvs.changes' watch.
#include "etcd_store_impl.hpp"

namespace dyad::kvs::etcd {

// etcd 3.4 walks every key of a range's index to answer it, whatever
// its limit: a listing in pages of 1000 would cost a walk of the whole
// remaining range per page (quadratic: 100 s for 1,000,000 records),
// and so would chunks of 10,000 to the end of the namespace (13.8 s of
// etcd's CPU for 1,000,000). So the service reads kListChunk entries at
// most per range, each range bounded by a prefix of its first key (the
// walk: about a chunk), and keeps what it has not sent yet, keyed by the
// page's last key, for the listing's next page (at most kListCursors
// listings, each for kListCursorSeconds).
Result<Page> EtcdStore::list(const std::string& ns, const std::string& prefix,
                             const std::string& after, uint64_t limit, Deadline d) {
    const std::string base = ns_base(ns);
    const bool registry = ns == kServicesNamespace;
    const std::string cursor_key = base + '\0' + prefix + '\0' + after;
    Cursor cur;
    bool cached = false;
    {
        std::lock_guard<std::mutex> lk(cursor_mu_);
        expire_cursors();
        auto it = cursors_.find(cursor_key);
        if (it != cursors_.end()) {
            cur = std::move(it->second);
            cursors_.erase(it);
            cached = true;
        }
    }
    const std::string lo = base + (registry ? escape(prefix) : prefix);
    const std::string end = prefix_end(lo);
    if (!cached) {
        std::string from = lo;
        if (!after.empty()) {
            std::string a = base + (registry ? escape(after) : after) + std::string(1, '\0');
            if (a > from) from = a;
        }
        cur.next = from;
        cur.more = true;
        cur.depth = lo.size() + 1;
    }
    // Bounded ranges (see kListChunk): [next, the end of the keys that
    // share next's first `depth` bytes), narrower (depth + 1) after one
    // that held more than a chunk, wider after one that held few. They
    // follow each other without a gap, so every key is read once.
    while (cur.more && cur.rest.size() < std::max<uint64_t>(limit, kListChunk / 2)) {
        std::string bound = end;
        if (cur.depth > lo.size()) {
            std::string b = prefix_end(cur.next.substr(0, cur.depth));
            if (b.size() > 1 || b[0] != '\0') bound = std::min(b, end);
        }
        auto r =
            c_->range(cur.next, bound, static_cast<int64_t>(std::max<uint64_t>(limit, kListChunk)),
                      false, d, !registry);
        if (!r) return r.status();
        ++list_ranges_;
        for (const auto& kv : r->kvs()) {
            std::string k = kv.key().substr(base.size());
            if (registry) k = unescape(k);
            cur.rest.emplace_back(std::move(k),
                                  Entry{kv.value(), static_cast<uint64_t>(kv.mod_revision()), ""});
        }
        if (r->more() && r->kvs_size() > 0) {
            cur.next = r->kvs(r->kvs_size() - 1).key() + std::string(1, '\0');
            cur.depth = std::min(cur.depth + 1, cur.next.size());
        } else {
            cur.next = bound;
            cur.more = bound != end;
            if (static_cast<size_t>(r->kvs_size()) < kListChunk / 8 && cur.depth > lo.size() + 1)
                --cur.depth;
        }
    }
    Page p;
    while (!cur.rest.empty() && p.entries.size() < limit) {
        p.entries.push_back(std::move(cur.rest.front()));
        cur.rest.pop_front();
    }
    p.more = !cur.rest.empty() || cur.more;
    if (p.more && !p.entries.empty()) {
        cur.at = std::chrono::steady_clock::now();
        std::lock_guard<std::mutex> lk(cursor_mu_);
        if (cursors_.size() >= kListCursors) cursors_.erase(cursors_.begin());
        cursors_[base + '\0' + prefix + '\0' + p.entries.back().first] = std::move(cur);
    }
    return p;
}

namespace {

// One kvs.changes answer as etcd's watch responses arrive: the events after
// `after`, up to about a page (kPageLimit entries, kPageBytes), ended at a
// whole revision; "list again" (compacted) when etcd's history no longer
// reaches `after` or one revision alone passes 3 pages.
class ChangesPage {
  public:
    ChangesPage(const std::string& base, uint64_t after) : base_(base), after_(after) {}

    // Takes one watch response; true when the answer is complete.
    bool take(const pb::WatchResponse& a) {
        if (a.compact_revision() > 0) {
            out.compacted = true;
            return true;
        }
        if (a.canceled()) {
            refused = a.cancel_reason();
            return true;
        }
        if (a.created()) {
            created = true;
            // etcd's history restarted below the cursor (its data
            // replaced): the cursor means nothing there.
            if (a.header().revision() < static_cast<int64_t>(after_)) {
                out.compacted = true;
                return true;
            }
            return false;
        }
        whole_ = !a.fragment();
        for (const auto& ev : a.events())
            if (add(ev.kv())) return true;
        // etcd's whole answer (all it had from after + 1): enough.
        return !out.entries.empty() && whole_;
    }

    // Once the stream ended: a revision cut short is not sent.
    void finish() {
        if (!whole_ && !out.compacted) trim_last();
    }
    int64_t last() const { return last_; }

    Changes out;
    bool created = false;
    std::string refused;  // etcd cancelled the watch (why)

  private:
    // One event; true when the answer is complete.
    bool add(const pb::KeyValue& kv) {
        const int64_t rev = kv.mod_revision();
        if (rev != last_ && (out.entries.size() >= kPageLimit || bytes_ >= kPageBytes)) {
            whole_ = true;  // about a page, at a whole revision
            return true;
        }
        if (kv.key().size() < base_.size() || rev <= static_cast<int64_t>(after_)) return false;
        bytes_ += kv.key().size() + kv.value().size();
        if (bytes_ > kHard) {
            if (out.entries.empty() ||
                out.entries.front().second.version == static_cast<uint64_t>(rev)) {
                out.entries.clear();
                out.compacted = true;  // one revision past an answer: list
            } else {
                last_ = rev;
                trim_last();
                whole_ = true;
            }
            return true;
        }
        out.entries.emplace_back(kv.key().substr(base_.size()),
                                 Entry{kv.value(), static_cast<uint64_t>(rev), ""});
        last_ = rev;
        return false;
    }
    // Drops the events of the last revision.
    void trim_last() {
        while (!out.entries.empty() &&
               out.entries.back().second.version == static_cast<uint64_t>(last_))
            out.entries.pop_back();
        last_ = out.entries.empty() ? 0 : static_cast<int64_t>(out.entries.back().second.version);
    }

    static constexpr size_t kHard = 3 * kPageBytes;  // one revision larger: list again
    const std::string& base_;
    const uint64_t after_;
    bool whole_ = true;
    size_t bytes_ = 0;
    int64_t last_ = 0;
};

}  // namespace

// The records put in a namespace after revision `after` (kvs.changes;
// `dyad sync --follow`): a watch of the namespace's prefix from after + 1,
// on a stream of its own that lives for this request only (at most
// `wait` seconds). etcd answers a watch that starts in the past from its
// revision-ordered history (it syncs such watches every 100 ms), so the
// cost is that of the changes since `after`, not of the namespace. The
// answer ends at a whole revision: the first answer etcd sends (all it
// had), cut before the revision that would pass about a page (ChangesPage).
Result<Changes> EtcdStore::changes(const std::string& ns, uint64_t after, double wait, Deadline d) {
    ++changes_requests_;
    if (ns == kServicesNamespace)
        return Status(DYAD_RC_BADRPC, "kvs.changes does not serve the registry", ENOSYS);
    const std::string base = ns_base(ns);
    if (after == 0) {
        // The revision now: a listing started after this holds every
        // record put up to it.
        auto r = c_->range(base, "", 1, true, d, true);
        if (!r) return r.status();
        Changes out;
        out.next = static_cast<uint64_t>(r->header().revision());
        return out;
    }
    if (after >= static_cast<uint64_t>(INT64_MAX))
        return Status(DYAD_RC_BADUNPACK,
                      "kvs.changes: after " + std::to_string(after) + " is no etcd revision",
                      EINVAL);
    const double most = std::max(0.2, std::min(wait, d.remaining()));
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(static_cast<int64_t>(most * 1e6)));
    auto stream = c_->watch().Watch(&ctx);
    pb::WatchRequest q;
    auto* cr = q.mutable_create_request();
    cr->set_key(base);
    cr->set_range_end(prefix_end(base));
    cr->set_start_revision(static_cast<int64_t>(after) + 1);
    cr->add_filters(pb::WatchCreateRequest::NODELETE);
    cr->set_fragment(true);
    ChangesPage page(base, after);
    if (stream->Write(q)) {
        pb::WatchResponse a;
        while (stream->Read(&a)) {
            c_->answered();
            if (page.take(a)) break;
        }
    }
    ctx.TryCancel();
    grpc::Status fin = stream->Finish();
    page.finish();
    if (!page.refused.empty())
        return Status(DYAD_RC_BADRPC,
                      "etcd at " + c_->where() + " refused a watch of '" + ns + "' from revision " +
                          std::to_string(after + 1) + ": " + page.refused,
                      EIO);
    Changes& out = page.out;
    if (!page.created && !out.compacted) {
        if (fin.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
            return Status(DYAD_RC_BADRPC,
                          "etcd at " + c_->where() + " did not start a watch within " +
                              std::to_string(most) + " s",
                          ETIMEDOUT);
        return c_->failed(fin, "watch");
    }
    if (out.compacted) {
        ++changes_compacted_;
        out.entries.clear();
        out.next = after;
        return std::move(out);
    }
    out.next = out.entries.empty() ? after : static_cast<uint64_t>(page.last());
    changes_records_ += out.entries.size();
    return std::move(out);
}

void EtcdStore::expire_cursors() {
    auto now = std::chrono::steady_clock::now();
    for (auto it = cursors_.begin(); it != cursors_.end();) {
        if (now - it->second.at > std::chrono::duration<double>(kListCursorSeconds))
            it = cursors_.erase(it);
        else
            ++it;
    }
}

}  // namespace dyad::kvs::etcd
