// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cerrno>

#include "proto/record.hpp"
#include "registry.hpp"
#include "store.hpp"
#include "common/json_text.hpp"

namespace dyad::kvs {
namespace {

// `key` is DYAD's key of `upath` at some depth: hex bins, each followed by
// a dot, then the path.
bool key_of_path(const std::string& key, const std::string& upath) {
    if (upath.empty() || key.size() < upath.size() ||
        key.compare(key.size() - upath.size(), upath.size(), upath) != 0)
        return false;
    size_t digits = 0;
    for (size_t i = 0; i < key.size() - upath.size(); ++i) {
        char c = key[i];
        if (c == '.') {
            if (digits == 0) return false;
            digits = 0;
        } else if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) {
            ++digits;
        } else {
            return false;
        }
    }
    return digits == 0;
}

}  // namespace

Result<bool> key_collision(const std::string& ns, const std::string& key, const std::string& had,
                           const std::string& value) {
    std::string was = proto::record_path(had);
    std::string now = proto::record_path(value);
    if (was == now || !key_of_path(key, was) || !key_of_path(key, now)) return false;
    if (now.size() < was.size()) return true;
    return Status(DYAD_RC_BADCOMMIT,
                  "'" + now + "' has the key '" + key + "' in namespace '" + ns +
                      "', which already holds '" + was +
                      "' at a deeper DYAD_KEY_DEPTH (this name spells that path's key): rename "
                      "the file, or produce it with the key depth its consumers use",
                  EEXIST);
}

// The store's limits for a put that changes a record's cost from `before`
// to `after` bytes: namespaces, records and bytes per namespace, bytes.
Status MemoryStore::check_room(const std::string& ns, const std::string& key, bool new_ns,
                               bool new_key, uint64_t before, uint64_t after) {
    const bool registry = ns == kServicesNamespace;
    if (new_ns && !registry && namespace_count() >= limits_.max_namespaces) {
        ++refused_.namespaces;
        return Status(DYAD_RC_BADCOMMIT,
                      "the metadata store holds " + std::to_string(namespace_count()) +
                          " namespaces, the most it may: cannot add namespace '" + ns +
                          "': start the store's dyadd with a larger --store-max-namespaces",
                      EDQUOT);
    }
    const NamespaceUse cur = usage(ns);
    // A new key is a new record; replacing one is not.
    if (new_key && cur.records + 1 > ns_record_quota(ns)) {
        ++refused_.ns_records;
        return Status(DYAD_RC_BADCOMMIT,
                      "namespace '" + ns + "' is at its quota of " +
                          std::to_string(ns_record_quota(ns)) + " records (it holds " +
                          std::to_string(cur.records) + "): cannot add '" + key + "'" +
                          (registry ? std::string(" (the registry's quota is fixed)")
                                    : std::string(": start the store's dyadd with a larger "
                                                  "--store-max-records-per-namespace")),
                      EDQUOT);
    }
    const uint64_t charged = bytes_ - registry_bytes_;
    if (!registry && after > before && charged + (after - before) > limits_.max_bytes) {
        ++refused_.store_full;
        return Status(DYAD_RC_BADCOMMIT,
                      "the metadata store is full (" + std::to_string(charged) + " of " +
                          std::to_string(limits_.max_bytes) +
                          " bytes): start the store's dyadd with a larger --store-max",
                      ENOSPC);
    }
    if (after > before && cur.bytes + (after - before) > ns_byte_quota(ns)) {
        ++refused_.ns_bytes;
        return Status(DYAD_RC_BADCOMMIT,
                      "namespace '" + ns + "' would exceed its quota of " +
                          std::to_string(ns_byte_quota(ns)) + " bytes (it holds " +
                          std::to_string(cur.bytes) + ", the put of '" + key + "' adds " +
                          std::to_string(after - before) + ")" +
                          (registry ? std::string(" (the registry's quota is fixed)")
                                    : std::string(": start the store's dyadd with a larger "
                                                  "--store-max-bytes-per-namespace")),
                      EDQUOT);
    }
    return Status::ok();
}

// The next version of a key (`had`: its entry, if any): the first of this
// epoch, or one more.
Result<uint64_t> MemoryStore::next_version(const std::string& ns, const std::string& key,
                                           const Entry* had) const {
    const uint64_t base = static_cast<uint64_t>(epoch_) << 32;
    uint64_t version = base | 1;
    // A key removed and put again never repeats a version it had (a
    // consumer's copy or another service's replica of the removed file
    // names that version): a new key starts above every removed one.
    if (!had && removed_high_ >= version) {
        if ((removed_high_ & 0xffffffffu) == 0xffffffffu)
            return Status(DYAD_RC_BADCOMMIT,
                          "'" + key + "' in namespace '" + ns +
                              "': the store ran out of generations since it started: restart "
                              "the store's dyadd to publish it again",
                          EOVERFLOW);
        version = removed_high_ + 1;
    }
    if (had && had->version > base) {
        if ((had->version & 0xffffffffu) == 0xffffffffu)
            return Status(DYAD_RC_BADCOMMIT,
                          "'" + key + "' in namespace '" + ns +
                              "' was put 4294967295 times since the store started: restart the "
                              "store's dyadd to publish it again",
                          EOVERFLOW);
        version = had->version + 1;
    }
    return version;
}

// Calls (once) the watchers of a key that was just put.
void MemoryStore::notify(const std::string& ns, const std::string& key, const Entry& e) {
    auto it = watchers_.find({ns, key});
    if (it == watchers_.end()) return;
    auto fired = std::move(it->second);
    watchers_.erase(it);
    for (auto& [id, fn] : fired) {
        watch_index_.erase(id);
        fn(e);
    }
}

Result<uint64_t> MemoryStore::put(const std::string& ns, const std::string& key, std::string value,
                                  const std::string& writer, uint64_t replaces) {
    if (ns.size() > limits_.max_key || key.size() > limits_.max_key ||
        value.size() > limits_.max_value) {
        ++refused_.too_large;
        return Status(DYAD_RC_BADCOMMIT,
                      "metadata entry too large (key " + std::to_string(key.size()) +
                          " bytes, value " + std::to_string(value.size()) + " bytes; at most " +
                          std::to_string(limits_.max_key) + " and " +
                          std::to_string(limits_.max_value) + ")",
                      EMSGSIZE);
    }
    const bool registry = ns == kServicesNamespace;
    if (registry) assign_rank(key, value);
    auto nsit = data_.find(ns);
    const Entry* old = nullptr;
    if (nsit != data_.end()) {
        auto k = nsit->second.find(key);
        if (k != nsit->second.end()) old = &k->second;
    }
    // What the record costs in memory, not only its key and value.
    auto cost = [&key](const std::string& v, const std::string& w) {
        return kRecordOverhead + key.size() + v.size() + w.size();
    };
    uint64_t before = old ? cost(old->value, old->writer) : 0;
    uint64_t after =
        cost(value, writer) + (nsit == data_.end() ? kNamespaceOverhead + ns.size() : 0);
    Status room = check_room(ns, key, nsit == data_.end(), !old, before, after);
    if (!room) return room;
    auto& space = data_[ns];
    auto found = space.find(key);
    bool collision_won = false;
    if (found != space.end() && !registry) {
        auto won = key_collision(ns, key, found->second.value, value);
        if (!won) return won.status();
        collision_won = won.value();
    }
    if (found != space.end() && !collision_won && !found->second.writer.empty() &&
        found->second.writer != writer && replaces != found->second.version)
        return Status(DYAD_RC_BADCOMMIT,
                      "'" + key + "' in namespace '" + ns + "' is produced by service '" +
                          found->second.writer + "' (generation " +
                          std::to_string(found->second.version) +
                          "): another service may publish it only as a change of the version it "
                          "consumed" +
                          (replaces ? " (it consumed generation " + std::to_string(replaces) + ")"
                                    : std::string()),
                      EEXIST);
    auto version = next_version(ns, key, found != space.end() ? &found->second : nullptr);
    if (!version) return version.status();
    NamespaceUse& u = use_[ns];
    if (found == space.end()) ++u.records;
    u.bytes = u.bytes - before + after;
    bytes_ = bytes_ - before + after;
    if (registry) registry_bytes_ = registry_bytes_ - before + after;
    Entry& e = found != space.end() ? found->second : space[key];
    e.value = std::move(value);
    e.writer = writer;
    e.version = version.value();
    notify(ns, key, e);
    return e.version;
}

std::optional<Entry> MemoryStore::get(const std::string& ns, const std::string& key) const {
    auto n = data_.find(ns);
    if (n == data_.end()) return std::nullopt;
    auto k = n->second.find(key);
    if (k == n->second.end()) return std::nullopt;
    return k->second;
}

uint64_t MemoryStore::watch_create(const std::string& ns, const std::string& key, Watcher fn) {
    uint64_t id = next_watch_++;
    watchers_[{ns, key}][id] = std::move(fn);
    watch_index_[id] = {ns, key};
    return id;
}

void MemoryStore::unwatch(uint64_t id) {
    auto it = watch_index_.find(id);
    if (it == watch_index_.end()) return;
    auto w = watchers_.find(it->second);
    if (w != watchers_.end()) {
        w->second.erase(id);
        if (w->second.empty()) watchers_.erase(w);
    }
    watch_index_.erase(it);
}

std::vector<std::pair<std::string, Entry>> MemoryStore::list(const std::string& ns,
                                                             const std::string& prefix) const {
    std::vector<std::pair<std::string, Entry>> out;
    auto n = data_.find(ns);
    if (n == data_.end()) return out;
    for (auto it = n->second.lower_bound(prefix); it != n->second.end(); ++it) {
        if (it->first.compare(0, prefix.size(), prefix) != 0) break;
        out.emplace_back(it->first, it->second);
    }
    return out;
}

Page MemoryStore::list_page(const std::string& ns, const std::string& prefix,
                            const std::string& after, uint64_t limit) const {
    PageBuilder page(limit);
    auto n = data_.find(ns);
    if (n == data_.end()) return page.take();
    const auto& m = n->second;
    auto it = after < prefix ? m.lower_bound(prefix) : m.upper_bound(after);
    for (; it != m.end(); ++it) {
        if (it->first.compare(0, prefix.size(), prefix) != 0) break;
        if (!page.add(it->first, it->second)) break;
    }
    return page.take();
}

// The registry gives each service a dense rank in registration order, unless
// the service brought its own. A service registering again keeps its rank.
void MemoryStore::assign_rank(const std::string& key, std::string& value) const {
    auto ranked = registry::with_rank(key, value, [&]() -> Result<std::optional<uint64_t>> {
        auto reg = data_.find(kServicesNamespace);
        return reg == data_.end() ? std::optional<uint64_t>(0)
                                  : registry::dense_rank(key, reg->second);
    });
    if (ranked) value = std::move(ranked.value());  // (a value that is no object stays as it is)
}

NamespaceUse MemoryStore::usage(const std::string& ns) const {
    auto it = use_.find(ns);
    return it == use_.end() ? NamespaceUse() : it->second;
}

uint64_t MemoryStore::ns_byte_quota(const std::string& ns) const {
    if (ns == kServicesNamespace) return limits_.registry_max_bytes;
    return limits_.max_bytes_per_ns ? limits_.max_bytes_per_ns : limits_.max_bytes;
}

uint64_t MemoryStore::ns_record_quota(const std::string& ns) const {
    return ns == kServicesNamespace ? limits_.registry_max_records : limits_.max_records_per_ns;
}

size_t MemoryStore::namespace_count() const {
    return data_.size() - data_.count(kServicesNamespace);
}

Status MemoryStore::remove(const std::string& ns, const std::string& key,
                           const std::string& writer) {
    auto nsit = data_.find(ns);
    auto k =
        nsit == data_.end() ? std::map<std::string, Entry>::iterator() : nsit->second.find(key);
    if (nsit == data_.end() || k == nsit->second.end())
        return Status(DYAD_RC_NOTFOUND, "key '" + key + "' not found in namespace '" + ns + "'",
                      ENOENT);
    if (!k->second.writer.empty() && k->second.writer != writer)
        return Status(DYAD_RC_NOAUTH,
                      "'" + key + "' in namespace '" + ns + "' is produced by service '" +
                          k->second.writer + "': only that service may unpublish it",
                      EPERM);
    const uint64_t cost =
        kRecordOverhead + key.size() + k->second.value.size() + k->second.writer.size();
    NamespaceUse& u = use_[ns];
    --u.records;
    u.bytes -= cost;
    bytes_ -= cost;
    if (ns == kServicesNamespace) registry_bytes_ -= cost;
    removed_high_ = std::max(removed_high_, k->second.version);
    nsit->second.erase(k);
    return Status::ok();
}

size_t MemoryStore::key_count() const {
    size_t n = 0;
    for (auto& [ns, m] : data_) n += m.size();
    return n;
}

Status check_put(const std::string& writer, const std::string& ns, const std::string& key,
                 const std::string& value) {
    if (writer.empty())
        return Status(DYAD_RC_NOAUTH,
                      "only services write the metadata store: publish through this node's dyadd "
                      "(dyad produce, dyad_produce)",
                      EPERM);
    if (ns == kServicesNamespace) {
        if (key != writer)
            return Status(DYAD_RC_NOAUTH,
                          "service '" + writer + "' may register only itself, not '" + key + "'",
                          EPERM);
        return Status::ok();
    }
    if (proto::record_owner(value) != writer)
        return Status(DYAD_RC_NOAUTH,
                      "service '" + writer + "' may publish only records that name it as owner",
                      EPERM);
    return Status::ok();
}

Status check_remove(const std::string& writer, const std::string& ns) {
    if (writer.empty())
        return Status(DYAD_RC_NOAUTH,
                      "only services write the metadata store: unpublish through this node's "
                      "dyadd (dyad rm)",
                      EPERM);
    if (ns == kServicesNamespace)
        return Status(DYAD_RC_NOAUTH, "the registry's entries are not removed by request", EPERM);
    return Status::ok();
}

}  // namespace dyad::kvs
