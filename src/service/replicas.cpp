// SPDX-License-Identifier: Apache-2.0
// Replicas: the owner's queue of pushes and the holder's pulls, table and
// check (replicas.hpp; docs/design.md, "Replicas").
#include "replicas.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "common/deadline.hpp"
#include "common/log.hpp"
#include "common/timeouts.hpp"

namespace dyad::service {
namespace {
constexpr const char* kSub = "replicas";
// How long the worker waits for more pushes to join a batch (linger()).
constexpr auto kLingerQuiet = std::chrono::milliseconds(10);
constexpr auto kLingerMost = std::chrono::milliseconds(100);

int64_t mtime_of(const struct stat& sb) {
    return static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000LL + sb.st_mtim.tv_nsec;
}

// A namespace as one directory name: letters, digits, '-', '_' and '.'
// (not leading) as they are, anything else %XX.
std::string dir_name(const std::string& ns) {
    static const char* hex = "0123456789ABCDEF";
    std::string out;
    for (size_t i = 0; i < ns.size(); ++i) {
        unsigned char c = static_cast<unsigned char>(ns[i]);
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                     c == '-' || c == '_' || (c == '.' && i > 0);
        if (plain) {
            out.push_back(static_cast<char>(c));
        } else {
            out.push_back('%');
            out.push_back(hex[c >> 4]);
            out.push_back(hex[c & 15]);
        }
    }
    return out;
}

Status mkdir_one(const std::string& p) {
    if (::mkdir(p.c_str(), 0700) == 0 || errno == EEXIST) {
        struct stat sb;
        if (::lstat(p.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))
            return Status(DYAD_RC_SYSFAIL, "replica directory " + p + " is not a directory",
                          ENOTDIR);
        return Status::ok();
    }
    return Status(DYAD_RC_SYSFAIL, "cannot make the replica directory " + p, errno);
}

// This service as its own client reaches it: its Unix socket, else TCP.
std::string own_uri(const std::vector<std::string>& eps) {
    for (const auto& e : eps)
        if (e.rfind("unix:", 0) == 0) return e;
    return eps.empty() ? std::string() : eps.front();
}

}  // namespace

std::string tcp_endpoint(const std::vector<std::string>& eps) {
    for (const auto& e : eps)
        if (e.rfind("tcp://", 0) == 0) return e;
    return eps.empty() ? std::string() : eps.front();
}

Replicas::Replicas(std::string self, std::string node, std::vector<std::string> endpoints,
                   ReplicaOptions opts, Hooks hooks, rpc::Credentials creds, PullFn pull)
    : self_(std::move(self)),
      node_(std::move(node)),
      endpoints_(std::move(endpoints)),
      opts_(std::move(opts)),
      hooks_(std::move(hooks)),
      pull_(std::move(pull)),
      pool_(std::move(creds), 4) {
    worker_ = std::thread([this] { run(); });
}

Replicas::~Replicas() {
    {
        std::lock_guard<std::mutex> lk(qmu_);
        stopping_ = true;
    }
    qcv_.notify_all();
    room_.notify_all();
    if (worker_.joinable()) worker_.join();
    for (auto& j : queue_)
        if (j.done) j.done(Status(DYAD_RC_CONNFAIL, "the service stopped", ECANCELED));
}

void Replicas::push(const std::string& ns, const std::string& key, const kvs::Record& rec,
                    uint64_t k, Done done) {
    std::unique_lock<std::mutex> lk(qmu_);
    // A full queue delays the producer by at most queue_wait, then this
    // file goes without replicas (warned, counted): never longer.
    bool room = room_.wait_for(lk, std::chrono::duration<double>(opts_.queue_wait),
                               [this] { return stopping_ || queue_.size() < opts_.queue; });
    if (!room || stopping_) {
        lk.unlock();
        n_.queue_full++;
        DYAD_WARN(kSub,
                  "the replication queue is full (%zu files waiting): '%s' gets no replica; the "
                  "services that hold replicas are slower than the producers",
                  opts_.queue, rec.upath.c_str());
        if (done)
            done(Status(DYAD_RC_SYSFAIL,
                        "the replication queue is full: '" + rec.upath + "' gets no replica",
                        EAGAIN));
        return;
    }
    queue_.push_back(Job{ns, key, rec, k, std::move(done)});
    n_.queued++;
    lk.unlock();
    qcv_.notify_one();
}

void Replicas::linger(std::unique_lock<std::mutex>& lk) {
    // A burst of publishes goes in few batches: while pushes keep coming
    // (one at least every kLingerQuiet), wait for them, up to kLingerMost
    // and a full batch. Never for a producer that waits for its replicas
    // (DYAD_REPLICAS_SYNC: a `done` to call).
    const auto until = std::chrono::steady_clock::now() + kLingerMost;
    size_t seen = queue_.size();
    auto waiting_producer = [this] {
        return std::any_of(queue_.begin(), queue_.end(), [](const Job& j) { return bool(j.done); });
    };
    while (!stopping_ && seen < proto::ReplicateBatch::kMaxFiles && !queue_.front().drop &&
           !waiting_producer() && std::chrono::steady_clock::now() < until) {
        qcv_.wait_for(lk, kLingerQuiet, [&] { return stopping_ || queue_.size() != seen; });
        if (queue_.size() == seen) break;
        seen = queue_.size();
    }
}

void Replicas::run() {
    for (;;) {
        std::vector<Job> batch;
        Job drop;
        {
            std::unique_lock<std::mutex> lk(qmu_);
            qcv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
            linger(lk);
            if (stopping_) return;
            // The pushes waiting now, in order, up to a drop (which must
            // follow the pushes queued before it): one batch.
            while (!queue_.empty() && !queue_.front().drop &&
                   batch.size() < proto::ReplicateBatch::kMaxFiles) {
                batch.push_back(std::move(queue_.front()));
                queue_.pop_front();
            }
            if (batch.empty()) {
                drop = std::move(queue_.front());
                queue_.pop_front();
            }
        }
        room_.notify_all();
        if (batch.empty()) {
            drop_one(drop);
            continue;
        }
        auto copies = push_batch(batch);
        for (size_t i = 0; i < batch.size(); ++i)
            if (batch[i].done) batch[i].done(copies[i]);
    }
}

void Replicas::forget(const std::string& ns, const std::string& key, const kvs::Record& rec) {
    std::unique_lock<std::mutex> lk(qmu_);
    bool room = room_.wait_for(lk, std::chrono::duration<double>(opts_.queue_wait),
                               [this] { return stopping_ || queue_.size() < opts_.queue; });
    if (!room || stopping_) {
        lk.unlock();
        n_.unreplicate_failed++;
        DYAD_WARN(kSub,
                  "the replication queue is full (%zu files waiting): the replicas of the "
                  "removed '%s' stay (they never match a new record)",
                  opts_.queue, rec.upath.c_str());
        return;
    }
    Job j{ns, key, rec, 0, nullptr};
    j.drop = true;
    queue_.push_back(std::move(j));
    lk.unlock();
    qcv_.notify_one();
}

void Replicas::drop_one(const Job& j) {
    auto entries = hooks_.list(proto::replica_namespace(j.ns), proto::replica_prefix(j.key));
    if (!entries) {
        n_.unreplicate_failed++;
        DYAD_WARN(kSub,
                  "the replicas of the removed '%s' stay: their entries could not be listed: %s",
                  j.rec.upath.c_str(), entries.status().to_string().c_str());
        return;
    }
    for (const auto& [k, v] : entries.value()) {
        auto e = proto::ReplicaEntry::parse(v.value);
        // This service's file, of the removed generation or an older one
        // (a holder asked to drop generation G keeps a copy of another).
        if (!e || e->of != self_ || e->holder == self_ || e->upath != j.rec.upath ||
            e->generation > j.rec.generation || k != proto::replica_key(j.key, e->holder))
            continue;
        const std::string ep = tcp_endpoint(e->endpoints);
        if (ep.empty()) continue;
        proto::UnreplicateRequest req{j.ns, j.key, j.rec.upath, e->generation};
        auto a = pool_.call(ep, "dyad.unreplicate", req.build(),
                            Deadline::after(timeouts::kDropReplica));
        if (a && a->is_object() && a->value("holder", std::string()) == e->holder) {
            n_.unreplicated++;
            continue;
        }
        n_.unreplicate_failed++;
        DYAD_INFO(kSub,
                  "%s did not drop its replica of the removed '%s' (generation %llu): %s; its "
                  "entry never matches a new record",
                  e->holder.c_str(), j.rec.upath.c_str(),
                  static_cast<unsigned long long>(e->generation),
                  a ? "an answer not naming it" : a.status().message().c_str());
    }
}

Result<nlohmann::json> Replicas::unhold(const proto::UnreplicateRequest& req,
                                        const std::string& from) {
    const std::string id = req.ns + std::string(1, '\0') + req.upath;
    const std::string ens = proto::replica_namespace(req.ns);
    const std::string ekey = proto::replica_key(req.key, self_);
    // Who owns the copy and which generation it is: the table, else (a
    // restarted holder forgot it) this service's own entry in the store.
    std::string of;
    uint64_t generation = 0;
    bool in_table = false;
    {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = held_.find(id);
        if (it != held_.end()) {
            of = it->second.of;
            generation = it->second.generation;
            in_table = true;
        }
    }
    auto entry = hooks_.get(ens, ekey);
    Result<proto::ReplicaEntry> rec = entry ? proto::ReplicaEntry::parse(entry->value)
                                            : Result<proto::ReplicaEntry>(entry.status());
    const bool entry_matches = rec && rec->holder == self_ && rec->upath == req.upath &&
                               rec->of == from && rec->generation == req.generation;
    if (!in_table && rec) {
        of = rec->of;
        generation = rec->generation;
    }
    if (!in_table && !rec)
        return Status(DYAD_RC_NOTFOUND,
                      "service " + self_ + " holds no replica of '" + req.upath + "'", ENOENT);
    if (of != from)
        return Status(DYAD_RC_NOAUTH,
                      "service " + self_ + " holds the replica of '" + req.upath + "' for " + of +
                          ", not for " + from + ": not dropped",
                      EPERM);
    if (generation != req.generation)
        return Status(DYAD_RC_NOTFOUND,
                      "service " + self_ + " holds generation " + std::to_string(generation) +
                          " of '" + req.upath + "', not " + std::to_string(req.generation) +
                          ": not dropped",
                      ENOENT);
    {
        // The file goes first (a consumer's check() then fails), under the
        // table's lock, and only the copy installed for that generation.
        std::lock_guard<std::mutex> lk(mu_);
        const std::string path = dir_of(req.ns) + "/" + req.upath;
        auto it = held_.find(id);
        struct stat sb;
        const bool present = ::lstat(path.c_str(), &sb) == 0 && S_ISREG(sb.st_mode);
        if (it != held_.end()) {
            if (it->second.generation != req.generation)
                return Status(DYAD_RC_NOTFOUND,
                              "service " + self_ + " now holds generation " +
                                  std::to_string(it->second.generation) + " of '" + req.upath +
                                  "': not dropped",
                              ENOENT);
            if (present && static_cast<uint64_t>(sb.st_ino) == it->second.ino)
                ::unlink(path.c_str());
            bytes_held_ -= std::min(bytes_held_, it->second.size);
            held_.erase(it);
        } else if (present && rec && static_cast<uint64_t>(sb.st_size) == rec->size &&
                   mtime_of(sb) == rec->mtime_ns) {
            ::unlink(path.c_str());
        }
    }
    if (entry_matches) {
        if (Status s = hooks_.remove(ens, ekey); !s && s.rc() != DYAD_RC_NOTFOUND)
            return Status(s).wrap("replica entry of '" + req.upath + "'");
    }
    n_.dropped++;
    DYAD_INFO(kSub, "dropped the replica of '%s' generation %llu: removed by its owner %s",
              req.upath.c_str(), static_cast<unsigned long long>(req.generation), from.c_str());
    return nlohmann::json{{"holder", self_}, {"dropped", true}};
}

Result<std::shared_ptr<void>> Replicas::take_pull_slot() {
    unsigned now = pulls_.fetch_add(1) + 1;
    if (now > opts_.max_pulls) {
        pulls_.fetch_sub(1);
        n_.refused_busy++;
        return Status(DYAD_RC_SYSFAIL,
                      "service " + self_ + " is already pulling " +
                          std::to_string(opts_.max_pulls) + " replicas: asked again later",
                      EBUSY);
    }
    return std::shared_ptr<void>(nullptr, [this](void*) { pulls_.fetch_sub(1); });
}

Result<std::string> Replicas::make_dir(const std::string& ns) {
    if (Status s = mkdir_one(opts_.root); !s) return s;
    std::string d = opts_.root + "/" + dir_name(ns);
    if (Status s = mkdir_one(d); !s) return s;
    return d;
}

std::string Replicas::dir_of(const std::string& ns) const {
    return opts_.root + "/" + dir_name(ns);
}

Status Replicas::reserve(const proto::ReplicateRequest& req, const std::string& from) {
    const std::string id = req.ns + std::string(1, '\0') + req.upath;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = held_.find(id);
    if (it == held_.end() && held_.size() >= opts_.max_held) {
        n_.refused_space++;
        return Status(DYAD_RC_SYSFAIL,
                      "service " + self_ + " holds " + std::to_string(held_.size()) +
                          " replicas, the most it keeps",
                      ENOSPC);
    }
    const uint64_t after = bytes_held_ + bytes_reserved_ + req.size;
    if (after < req.size || after > opts_.space) {
        n_.refused_space++;
        DYAD_WARN(kSub,
                  "no replica of '%s' (%llu bytes) from %s: this service holds %llu bytes of "
                  "replicas and may hold %llu (--replica-space)",
                  req.upath.c_str(), static_cast<unsigned long long>(req.size), from.c_str(),
                  static_cast<unsigned long long>(bytes_held_ + bytes_reserved_),
                  static_cast<unsigned long long>(opts_.space));
        return Status(DYAD_RC_SYSFAIL,
                      "service " + self_ + " is out of replica space (" +
                          std::to_string(bytes_held_ + bytes_reserved_) + " of " +
                          std::to_string(opts_.space) +
                          " bytes, --replica-space): no replica of '" + req.upath + "'",
                      ENOSPC);
    }
    bytes_reserved_ += req.size;
    return Status::ok();
}

void Replicas::release(uint64_t size) {
    std::lock_guard<std::mutex> lk(mu_);
    bytes_reserved_ -= std::min(bytes_reserved_, size);
}

Result<kvs::Record> Replicas::verify(const proto::ReplicateRequest& req, const std::string& from) {
    // The record as the store has it, not as the peer says: its owner must
    // be the asking service and its generation the one asked for.
    auto e = hooks_.get(req.ns, req.key);
    if (!e) return Status(e.status()).wrap("replica of '" + req.upath + "'");
    auto rec = kvs::Record::from_json(e->value, e->version);
    if (!rec) return Status(rec.status()).wrap("replica of '" + req.upath + "'");
    if (rec->owner != from || rec->upath != req.upath || rec->generation != req.generation ||
        rec->size != req.size)
        return Status(DYAD_RC_BADFETCH,
                      "replica of '" + req.upath + "' generation " +
                          std::to_string(req.generation) + " asked by " + from +
                          ": the store holds generation " + std::to_string(rec->generation) +
                          " of '" + rec->upath + "' by " + rec->owner + ": not pulled",
                      ESTALE);
    return rec;
}

Status Replicas::install(const proto::ReplicateRequest& req, const kvs::Record& rec,
                         const std::string& dir, const std::string& from) {
    // The copy as installed (renamed into place, stamped with the
    // generation): what check() compares every replica fetch with.
    struct stat sb;
    const std::string path = dir + "/" + req.upath;
    if (::lstat(path.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode) ||
        static_cast<uint64_t>(sb.st_size) != rec.size || mtime_of(sb) != rec.mtime_ns) {
        release(req.size);
        n_.pull_failed++;
        return Status(DYAD_RC_BADFIO, "replica of '" + req.upath + "' is not as pulled at " + path,
                      EIO);
    }
    {
        std::lock_guard<std::mutex> lk(mu_);
        bytes_reserved_ -= std::min(bytes_reserved_, req.size);
        auto& h = held_[req.ns + std::string(1, '\0') + req.upath];
        bytes_held_ -= std::min(bytes_held_, h.size);
        h = Held{rec.generation, rec.size, static_cast<uint64_t>(sb.st_ino), rec.mtime_ns,
                 rec.owner};
        bytes_held_ += rec.size;
    }
    // Recorded only now that the copy is durable: a holder killed before
    // this line leaves no entry (and its staging file is no replica).
    proto::ReplicaEntry entry{rec.upath, self_,          node_,    endpoints_,
                              rec.owner, rec.generation, rec.size, rec.mtime_ns};
    auto put = hooks_.put(proto::replica_namespace(req.ns), proto::replica_key(req.key, self_),
                          entry.to_json().dump());
    if (!put) {
        n_.pull_failed++;
        return Status(put.status()).wrap("replica entry of '" + req.upath + "'");
    }
    n_.pulled++;
    DYAD_INFO(kSub, "holds a replica of '%s' generation %llu from %s (%llu bytes)",
              req.upath.c_str(), static_cast<unsigned long long>(rec.generation), from.c_str(),
              static_cast<unsigned long long>(rec.size));
    return Status::ok();
}

proto::ReplicateBatchAnswer Replicas::hold_many(const proto::ReplicateBatch& batch,
                                                const std::string& from) {
    proto::ReplicateBatchAnswer answer;
    answer.holder = self_;
    answer.files.resize(batch.files.size());
    auto refuse = [&answer](size_t i, const Status& s) {
        answer.files[i].held = false;
        answer.files[i].err = s.err() ? s.err() : EIO;
        answer.files[i].error = s.message();
    };
    // Reserved and verified first, each on its own: one file refused does
    // not refuse the others.
    std::vector<size_t> pulling;
    PullJob job;
    job.ns = batch.ns;
    job.service_uri = own_uri(endpoints_);
    for (size_t i = 0; i < batch.files.size(); ++i) {
        const auto& req = batch.files[i];
        if (Status s = reserve(req, from); !s) {
            refuse(i, s);
            continue;
        }
        auto rec = verify(req, from);
        if (!rec) {
            release(req.size);
            n_.pull_failed++;
            refuse(i, rec.status());
            continue;
        }
        pulling.push_back(i);
        job.records.push_back(std::move(rec.value()));
    }
    if (pulling.empty()) return answer;
    if (pulling.size() > 1) n_.batches++;
    auto dir = make_dir(batch.ns);
    std::vector<Status> pulled;
    if (dir) {
        job.dir = dir.value();
        pulled = pull_(job);
    }
    for (size_t j = 0; j < pulling.size(); ++j) {
        const size_t i = pulling[j];
        const auto& req = batch.files[i];
        Status s = !dir                ? dir.status()
                   : j < pulled.size() ? pulled[j]
                                       : Status(DYAD_RC_SYSFAIL, "the puller gave no outcome", EIO);
        if (!s) {
            release(req.size);
            n_.pull_failed++;
            refuse(i, Status(s).wrap("replica of '" + req.upath + "' from " + from));
            continue;
        }
        if (Status in = install(req, job.records[j], job.dir, from); !in) {
            refuse(i, in);
            continue;
        }
        answer.files[i].held = true;
        answer.files[i].bytes = req.size;
    }
    return answer;
}

Result<nlohmann::json> Replicas::hold(const proto::ReplicateRequest& req, const std::string& from) {
    auto a = hold_many(proto::ReplicateBatch{req.ns, {req}}, from);
    const auto& item = a.files.front();
    if (!item.held) return Status(DYAD_RC_SYSFAIL, item.error, item.err);
    return nlohmann::json{{"holder", self_}, {"generation", req.generation}, {"bytes", req.size}};
}

Status Replicas::check(const std::string& ns, const std::string& upath, uint64_t generation,
                       const struct stat& sb) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = held_.find(ns + std::string(1, '\0') + upath);
    if (it == held_.end()) {
        n_.refused_generation++;
        return Status(DYAD_RC_BADFETCH, "service " + self_ + " holds no replica of '" + upath + "'",
                      ENOENT);
    }
    const Held& h = it->second;
    if (h.generation != generation || static_cast<uint64_t>(sb.st_ino) != h.ino ||
        static_cast<uint64_t>(sb.st_size) != h.size || mtime_of(sb) != h.mtime_ns) {
        n_.refused_generation++;
        return Status(DYAD_RC_BADFETCH,
                      "service " + self_ + " holds generation " + std::to_string(h.generation) +
                          " of '" + upath + "', not " + std::to_string(generation) + ": not served",
                      ENOENT);
    }
    n_.served++;
    return Status::ok();
}

namespace {
// Each counter once: its name in `dyad service status` ("replicas"), its
// metric and what it counts.
struct CounterRow {
    const char* status;
    const char* metric;
    const char* help;
    std::atomic<uint64_t> Replicas::Counters::*member;
};
using C = Replicas::Counters;
constexpr CounterRow kCounterRows[] = {
    {"pushed", "dyad_replica_pushes_total", "replicas of this service's files other services took",
     &C::pushed},
    {"push_failed", "dyad_replica_push_failures_total",
     "services that did not take a replica of this service's files when asked", &C::push_failed},
    {"short_of_services", "dyad_replica_short_total",
     "files published with fewer replicas than asked for (too few services took one)",
     &C::short_of_services},
    {"queue_full", "dyad_replica_queue_full_total",
     "files published without replicas because the replication queue stayed full", &C::queue_full},
    {"pulled", "dyad_replica_pulls_total", "replicas this service pulled and holds", &C::pulled},
    {"batches", "dyad_replica_batches_total",
     "batched pulls (dyad.replicate_many: several files in one consume) this service made",
     &C::batches},
    {"pull_failed", "dyad_replica_pull_failures_total", "replicas this service failed to pull",
     &C::pull_failed},
    {"refused_space", "dyad_replica_refused_space_total",
     "replicas refused for lack of replica space (--replica-space)", &C::refused_space},
    {"refused_busy", "dyad_replica_refused_busy_total",
     "replicas refused because too many pulls were in progress", &C::refused_busy},
    {"served", "dyad_replica_served_total", "replica fetches served (consumers that failed over)",
     &C::served},
    {"refused_generation", "dyad_replica_refused_generation_total",
     "replica fetches refused: no replica held, or one of another generation",
     &C::refused_generation},
    {"unreplicated", "dyad_replica_unreplicated_total",
     "replicas of this service's removed files their holders dropped when asked", &C::unreplicated},
    {"unreplicate_failed", "dyad_replica_unreplicate_failures_total",
     "replicas of this service's removed files not dropped (holder down or refusing)",
     &C::unreplicate_failed},
    {"dropped", "dyad_replica_dropped_total",
     "replicas this service dropped because their owner removed the file", &C::dropped},
};
}  // namespace

nlohmann::json Replicas::status() const {
    std::lock_guard<std::mutex> lk(mu_);
    nlohmann::json s = {{"default_copies", opts_.k},
                        {"held", held_.size()},
                        {"bytes", bytes_held_},
                        {"space", opts_.space}};
    for (const CounterRow& row : kCounterRows) s[row.status] = (n_.*row.member).load();
    return s;
}

void Replicas::metrics(PromText& t) const {
    nlohmann::json s = status();
    t.gauge("dyad_replica_files", "replicas of other services' files this service holds",
            static_cast<double>(s["held"].get<uint64_t>()));
    t.gauge("dyad_replica_bytes", "bytes of the replicas this service holds",
            static_cast<double>(s["bytes"].get<uint64_t>()));
    for (const CounterRow& row : kCounterRows)
        t.counter(row.metric, row.help, (n_.*row.member).load());
}

}  // namespace dyad::service
