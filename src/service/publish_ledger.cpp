// SPDX-License-Identifier: Apache-2.0
#include "publish_ledger.hpp"

#include <cerrno>

#include "common/log.hpp"
#include "common/rate_limit.hpp"
#include "kvs/record.hpp"

namespace dyad::service {
namespace {
int64_t ns_of(const struct timespec& t) {
    return static_cast<int64_t>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}
}  // namespace

Status one_name(const std::string& up, const struct stat& sb) {
    if (sb.st_nlink <= 1) return Status::ok();
    return Status(DYAD_RC_BADFIO,
                  "'" + up + "' has " + std::to_string(sb.st_nlink) +
                      " hard links: DYAD serves only files with one name (a link can reach a "
                      "file outside the producer directory); copy it instead",
                  EPERM);
}

Published Published::of(const struct stat& sb, std::string ns, std::string key) {
    Published p;
    p.dev = static_cast<uint64_t>(sb.st_dev);
    p.ino = static_cast<uint64_t>(sb.st_ino);
    p.size = static_cast<uint64_t>(sb.st_size);
    p.mtime_ns = ns_of(sb.st_mtim);
    p.ctime_ns = ns_of(sb.st_ctim);
    p.ns = std::move(ns);
    p.key = std::move(key);
    return p;
}

bool Published::unchanged(const struct stat& sb) const {
    return static_cast<uint64_t>(sb.st_dev) == dev && static_cast<uint64_t>(sb.st_ino) == ino &&
           static_cast<uint64_t>(sb.st_size) == size && ns_of(sb.st_mtim) == mtime_ns &&
           (ctime_ns == 0 || ns_of(sb.st_ctim) == ctime_ns);
}

PublishLedger::~PublishLedger() {
    {
        std::lock_guard<std::mutex> q(qmu_);
        stop_ = true;
    }
    qcv_.notify_all();
    if (writer_.joinable()) writer_.join();
}

void PublishLedger::attach(std::unique_ptr<LedgerJournal> journal) {
    std::lock_guard<std::mutex> lk(mu_);
    if (journal_ || !journal) return;  // once
    journal_ = std::move(journal);
    writer_ = std::thread([this] { write_loop(); });
}

void PublishLedger::flush() {
    std::unique_lock<std::mutex> q(qmu_);
    const uint64_t upto = queued_;
    qcv_.wait(q, [&] { return saved_ >= upto; });
}

void PublishLedger::restore(const std::string& up, const Published& pub) {
    std::lock_guard<std::mutex> lk(mu_);
    by_upath_[up] = pub;
    journal_locked(up);
}

uint64_t PublishLedger::journal_errors() const {
    return journal_errors_.load();
}

void PublishLedger::journal_locked(const std::string& up) {
    if (!journal_) return;
    LedgerChange c{up, std::nullopt};
    auto it = by_upath_.find(up);
    // Generation 0: the store has not answered; nothing to keep yet.
    if (it != by_upath_.end() && it->second.generation != 0) c.pub = it->second;
    {
        std::lock_guard<std::mutex> q(qmu_);
        queue_.push_back(std::move(c));
        ++queued_;
    }
    qcv_.notify_all();
}

void PublishLedger::write_loop() {
    std::vector<LedgerChange> batch;
    std::unique_lock<std::mutex> q(qmu_);
    for (;;) {
        qcv_.wait(q, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, everything saved
        batch.swap(queue_);
        q.unlock();
        // journal_ is set once, before this thread starts.
        Status s = journal_->apply(batch);
        if (!s) {
            journal_errors_ += batch.size();
            static log::RateLimit limit("dyadd", "publish ledger saves");
            if (limit.allow())
                DYAD_WARN("dyadd",
                          "cannot keep %zu changes (the first: '%s') in the publish ledger %s: %s "
                          "(published all the same; a restart of this dyadd would not publish "
                          "them again: produce them again then)",
                          batch.size(), batch.front().up.c_str(), journal_->describe().c_str(),
                          s.to_string().c_str());
        }
        const size_t n = batch.size();
        batch.clear();
        q.lock();
        saved_ += n;
        qcv_.notify_all();
    }
}

std::optional<Published> PublishLedger::begin(const std::string& up, const Published& pub) {
    std::lock_guard<std::mutex> lk(mu_);
    std::optional<Published> before;
    auto it = by_upath_.find(up);
    if (it != by_upath_.end()) before = it->second;
    by_upath_[up] = pub;
    return before;
}

void PublishLedger::end(const std::string& up, Published pub, const Result<uint64_t>& version,
                        const std::optional<Published>& before) {
    std::lock_guard<std::mutex> lk(mu_);
    if (version) {
        pub.generation = version.value();
        by_upath_[up] = std::move(pub);
    } else if (before) {
        by_upath_[up] = *before;
    } else {
        by_upath_.erase(up);
    }
    journal_locked(up);
}

std::optional<Published> PublishLedger::find(const std::string& up) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_upath_.find(up);
    if (it == by_upath_.end()) return std::nullopt;
    return it->second;
}

void PublishLedger::forget(const std::string& up) {
    std::lock_guard<std::mutex> lk(mu_);
    by_upath_.erase(up);
    journal_locked(up);
}

size_t PublishLedger::size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return by_upath_.size();
}

Status PublishLedger::check(const std::string& owner, const std::string& up, const struct stat& sb,
                            const Wanted& want, const Recall& recall) {
    auto not_produced = [&](const std::string& why) {
        return Status(DYAD_RC_NOTFOUND,
                      "'" + up + "' has not been produced by service " + owner + why +
                          ": only produced files are served",
                      ENOENT);
    };
    std::optional<Published> pub = find(up);
    const bool known = pub.has_value();
    if (!known) {
        // Published before this service restarted: the store has the record.
        if (!want.ns || !want.key) return not_produced("");
        auto e = recall(*want.ns, *want.key);
        if (!e) return not_produced(" (" + e.status().message() + ")");
        auto rec = kvs::Record::from_json(e->value, e->version);
        if (!rec || rec->owner != owner || rec->upath != up) return not_produced("");
        pub = Published{static_cast<uint64_t>(sb.st_dev),
                        rec->ino ? rec->ino : static_cast<uint64_t>(sb.st_ino),
                        rec->size,
                        rec->mtime_ns,
                        e->version,
                        0,
                        *want.ns,
                        *want.key};
    }
    if (want.generation && *want.generation != 0 && pub->generation != 0 &&
        *want.generation != pub->generation)
        return Status(DYAD_RC_BADFETCH,
                      "'" + up + "' was produced again (generation " +
                          std::to_string(pub->generation) +
                          ") after the consumer looked it up (generation " +
                          std::to_string(*want.generation) + "): look it up again",
                      ESTALE);
    if (!pub->unchanged(sb))
        return Status(DYAD_RC_BADFETCH,
                      "'" + up + "' changed since it was published (generation " +
                          std::to_string(pub->generation) +
                          "): nothing is served until it is produced again",
                      ESTALE);
    if (!known) {
        std::lock_guard<std::mutex> lk(mu_);
        by_upath_.emplace(up, std::move(*pub));
    }
    return Status::ok();
}

std::vector<std::pair<std::string, Published>> PublishLedger::to_republish() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::pair<std::string, Published>> all;
    all.reserve(by_upath_.size());
    for (const auto& [up, pub] : by_upath_)
        if (pub.generation != 0 && !pub.key.empty()) all.emplace_back(up, pub);
    return all;
}

bool PublishLedger::current(const std::string& up, uint64_t generation) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_upath_.find(up);
    return it != by_upath_.end() && it->second.generation == generation;
}

void PublishLedger::republished(const std::string& up, uint64_t was, uint64_t now) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_upath_.find(up);
    if (it != by_upath_.end() && it->second.generation == was) {
        it->second.generation = now;
        journal_locked(up);
    }
}

}  // namespace dyad::service
