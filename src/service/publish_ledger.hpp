// SPDX-License-Identifier: Apache-2.0
// What this service published (dyad.publish), by file: the served-file
// check of every fetch (a service serves only files it published and that
// are unchanged since, docs/security.md) and the list to publish again
// after the service re-joins a store that lost it (docs/design.md, "A
// restart of the store host"). Thread-safe.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.hpp"
#include "kvs/store.hpp"

namespace dyad::service {

// A file as this service published it.
struct Published {
    uint64_t dev = 0, ino = 0, size = 0;
    int64_t mtime_ns = 0;
    uint64_t generation = 0;  // 0: the store has not answered yet
    int64_t ctime_ns = 0;     // 0: unknown (learnt from the store after a restart)
    std::string ns, key;      // where the record is ("": learnt from the store)
    // The uid that published it (docs/security.md, "The node-wide
    // service"); -1: unknown (learnt from the store).
    int64_t uid = -1;

    // The file as `sb` says it is now, published as (ns, key), generation 0.
    static Published of(const struct stat& sb, std::string ns, std::string key);
    // Whether the file as `sb` says it is now is still this one (ctime too,
    // when known: a rewrite that puts the old mtime back still changes it).
    bool unchanged(const struct stat& sb) const;
};

// One change of a ledger: `up` is now `pub`, or no longer noted.
struct LedgerChange {
    std::string up;
    std::optional<Published> pub;
};

// A durable copy of a ledger (docs/design.md, "The embedded store across
// restarts"): what the service published, kept in its state directory so
// that the store host publishes it again when it starts. dyadd's is SQLite
// (ledger_journal.hpp, linked into dyadd alone). Used from one thread at a
// time: the ledger's writer, once attached.
class LedgerJournal {
  public:
    using Rows = std::vector<std::pair<std::string, Published>>;
    virtual ~LedgerJournal() = default;
    // What was saved (by this service, for its producer directory).
    virtual Result<Rows> load() = 0;
    // `up` is now `pub` (inserted or replaced).
    virtual Status save(const std::string& up, const Published& pub) = 0;
    virtual Status erase(const std::string& up) = 0;
    // The changes, in order (SQLite: in one transaction).
    virtual Status apply(const std::vector<LedgerChange>& changes) {
        for (const auto& c : changes)
            if (Status s = c.pub ? save(c.up, *c.pub) : erase(c.up); !s) return s;
        return Status::ok();
    }
    // Forgets every row of this service.
    virtual Status clear() = 0;
    // Every row of this service is now one of `rows`: one transaction.
    virtual Status replace(const Rows& rows) = 0;
    // The file, for messages.
    virtual std::string describe() const = 0;
};

// A file with more than one name can be a link to one outside the producer
// directory: refused (publish and fetch alike).
Status one_name(const std::string& up, const struct stat& sb);

class PublishLedger {
  public:
    // What a fetch names of the file it wants (its fields ns, key,
    // generation; any may be absent).
    struct Wanted {
        std::optional<std::string> ns, key;
        std::optional<uint64_t> generation;
    };
    // The store's entry for (ns, key), for a file published before this
    // service restarted.
    using Recall = std::function<Result<kvs::Entry>(const std::string& ns, const std::string& key)>;

    // A publish holds this (shared) from its first note to its last; a
    // re-publish holds it alone for each file it puts, so that neither
    // overtakes the other's put of one file.
    std::shared_lock<std::shared_mutex> publishing() {
        return std::shared_lock<std::shared_mutex>(gate_);
    }
    std::unique_lock<std::shared_mutex> republishing() {
        return std::unique_lock<std::shared_mutex>(gate_);
    }

    // Notes `up` as `pub` before the store has it (a consumer woken by the
    // put may ask for the file at once); returns what was noted before.
    std::optional<Published> begin(const std::string& up, const Published& pub);
    // The store's answer to the publish begun as `pub`: its generation, or
    // back to what was noted before it.
    void end(const std::string& up, Published pub, const Result<uint64_t>& version,
             const std::optional<Published>& before);

    PublishLedger() = default;
    PublishLedger(const PublishLedger&) = delete;
    PublishLedger& operator=(const PublishLedger&) = delete;
    // Saves what is still queued for the journal, then ends its writer.
    ~PublishLedger();

    // Keeps a durable copy in `journal` from now on: every change is queued,
    // in the ledger's order, and a writer thread saves what is queued in one
    // transaction at a time (a publish does not wait for the disk). A failed
    // save is logged and counted; the publish stands.
    void attach(std::unique_ptr<LedgerJournal> journal);
    // Waits until every change queued so far is saved (or failed).
    void flush();
    // Notes `up` as `pub` (restored at start, generation known).
    void restore(const std::string& up, const Published& pub);
    // Saves that failed (the durable copy lacks a change).
    uint64_t journal_errors() const;

    std::optional<Published> find(const std::string& up) const;
    // Unpublished: `up` is no longer this service's to serve.
    void forget(const std::string& up);
    size_t size() const;

    // Whether `up`, owned by service `owner`, may be served as `sb` says it
    // is now: OK; NOTFOUND (ENOENT) when this service did not publish it
    // (nor the store says it did: `recall`, whose answer is then noted);
    // BADFETCH (ESTALE) when it was produced again since the consumer's
    // lookup, or changed since it was published.
    Status check(const std::string& owner, const std::string& up, const struct stat& sb,
                 const Wanted& want, const Recall& recall);

    // The files to publish again (their store answered: generation and key
    // known), as noted now.
    std::vector<std::pair<std::string, Published>> to_republish() const;
    // Whether `up` is still noted with `generation` (not published again meanwhile).
    bool current(const std::string& up, uint64_t generation) const;
    // `up`, noted with generation `was`, was put again as `now`.
    void republished(const std::string& up, uint64_t was, uint64_t now);

  private:
    // Under mu_: queues `up` as noted now (or its erasure when not noted).
    void journal_locked(const std::string& up);
    void write_loop();

    mutable std::mutex mu_;
    std::unordered_map<std::string, Published> by_upath_;
    // The journal's writer: queue_ under qmu_; queued_ and saved_ count
    // changes, for flush().
    std::unique_ptr<LedgerJournal> journal_;
    std::mutex qmu_;
    std::condition_variable qcv_;
    std::vector<LedgerChange> queue_;
    uint64_t queued_ = 0, saved_ = 0;
    bool stop_ = false;
    std::atomic<uint64_t> journal_errors_{0};
    std::thread writer_;
    std::shared_mutex gate_;
};

}  // namespace dyad::service
