// SPDX-License-Identifier: Apache-2.0
// The embedded store (MemoryStore): versions and epochs, the write rules,
// pages, its limits and quotas, and the registry's ranks.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "kvs/epoch.hpp"
#include "kvs/registry.hpp"
#include "kvs/store.hpp"

using namespace dyad;

namespace {
// Only services write the store, and only records they own.
std::string owned(const std::string& owner, int v) {
    return nlohmann::json{{"owner", owner}, {"v", v}}.dump();
}
}  // namespace

TEST(Kvs, VersionsCarryTheEpoch) {
    kvs::MemoryStore s(kvs::StoreLimits(), 7);
    const uint64_t base = uint64_t{7} << 32;
    EXPECT_EQ(s.put("ns", "k", owned("svc", 1), "svc").value(), base | 1);
    EXPECT_EQ(s.put("ns", "k", owned("svc", 2), "svc").value(), base | 2);
    EXPECT_EQ(s.put("ns", "j", owned("svc", 1), "svc").value(), base | 1);
    // A later run (a larger epoch) never gives a version of an earlier one.
    kvs::MemoryStore later(kvs::StoreLimits(), 8);
    EXPECT_GT(later.put("ns", "k", owned("svc", 1), "svc").value(), base | 2);
    // replaces names the version taken over, whole.
    EXPECT_FALSE(s.put("ns", "k", owned("other", 3), "other", 2).is_ok());
    EXPECT_EQ(s.put("ns", "k", owned("other", 3), "other", base | 2).value(), base | 3);
}

// A key removed and published again never gets a version it had: a copy
// or a replica of the removed file names that version (issue 35).
TEST(Kvs, RemovedKeyNeverRepeatsAVersion) {
    kvs::MemoryStore s(kvs::StoreLimits(), 3);
    const uint64_t base = uint64_t{3} << 32;
    EXPECT_EQ(s.put("ns", "k", owned("svc", 1), "svc").value(), base | 1);
    EXPECT_EQ(s.put("ns", "k", owned("svc", 2), "svc").value(), base | 2);
    ASSERT_TRUE(s.remove("ns", "k", "svc").is_ok());
    EXPECT_EQ(s.put("ns", "k", owned("svc", 3), "svc").value(), base | 3);
    // Any new key starts above the removed one, then counts on its own.
    EXPECT_EQ(s.put("ns", "j", owned("svc", 1), "svc").value(), base | 3);
    EXPECT_EQ(s.put("ns", "j", owned("svc", 2), "svc").value(), base | 4);
}

// DYAD's key of "data0.txt" at depth 3 is that of a file named
// "17f.204.15b.data0.txt" at depth 0: the deeper key's record holds it.
TEST(Kvs, KeyDepthCollisionsGoToTheDeeperKey) {
    auto rec = [](const std::string& path, const std::string& owner) {
        return nlohmann::json{{"path", path}, {"owner", owner}}.dump();
    };
    const std::string key = "17f.204.15b.data0.txt";
    kvs::MemoryStore s;
    ASSERT_TRUE(s.put("ns", key, rec(key, "attacker"), "attacker").is_ok());
    // The genuine producer takes it, although another service wrote it.
    ASSERT_TRUE(s.put("ns", key, rec("data0.txt", "genuine"), "genuine").is_ok());
    auto r = s.put("ns", key, rec(key, "attacker"), "attacker");
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().err(), EEXIST);
    EXPECT_NE(r.status().message().find("deeper DYAD_KEY_DEPTH"), std::string::npos);
    EXPECT_NE(s.get("ns", key)->value.find("genuine"), std::string::npos);
    // A record whose path is not the key's tail takes nothing.
    EXPECT_FALSE(s.put("ns", key, rec("x", "attacker"), "attacker").is_ok());
    // The same path again is the usual rule (another writer: EEXIST).
    EXPECT_FALSE(s.put("ns", key, rec("data0.txt", "attacker"), "attacker").is_ok());
}

TEST(Kvs, EpochFileGrowsAtEveryStart) {
    char tmpl[] = "/tmp/dyad-epoch-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    std::string dir = std::string(tmpl) + "/state";
    EXPECT_EQ(kvs::next_epoch(dir).value(), 0u);
    EXPECT_EQ(kvs::next_epoch(dir).value(), 1u);
    EXPECT_EQ(kvs::next_epoch(dir).value(), 2u);
    std::string file = dir + "/" + kvs::kEpochFile;
    {
        std::FILE* f = std::fopen(file.c_str(), "w");
        ASSERT_NE(f, nullptr);
        std::fputs("garbage\n", f);
        std::fclose(f);
    }
    auto bad = kvs::next_epoch(dir);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find(file), std::string::npos) << bad.status().message();
    std::remove(file.c_str());
    ::rmdir(dir.c_str());
    ::rmdir(tmpl);
}

TEST(Kvs, ListPagesInKeyOrder) {
    kvs::MemoryStore s;
    for (int i = 0; i < 25; ++i) {
        char k[16];
        std::snprintf(k, sizeof k, "a/%02d", i);
        ASSERT_TRUE(s.put("ns", k, owned("svc", i), "svc").is_ok());
    }
    ASSERT_TRUE(s.put("ns", "b/0", owned("svc", 0), "svc").is_ok());
    std::vector<std::string> seen;
    std::string after;
    int pages = 0;
    for (;;) {
        auto p = s.list_page("ns", "a/", after, 10);
        ++pages;
        for (auto& [k, e] : p.entries) seen.push_back(k);
        if (!p.more) break;
        ASSERT_FALSE(p.entries.empty());
        after = p.entries.back().first;
    }
    EXPECT_EQ(pages, 3);
    ASSERT_EQ(seen.size(), 25u);
    EXPECT_EQ(seen.front(), "a/00");
    EXPECT_EQ(seen.back(), "a/24");
    // The limit is clamped; the byte budget ends a page early.
    EXPECT_EQ(s.list_page("ns", "", "", 1000000).entries.size(), 26u);
    kvs::MemoryStore big;
    std::string blob(60000, 'x');
    for (int i = 0; i < 10; ++i)
        ASSERT_TRUE(big.put("ns", "k" + std::to_string(i),
                            nlohmann::json{{"owner", "svc"}, {"blob", blob}}.dump(), "svc")
                        .is_ok());
    auto p = big.list_page("ns", "", "", 0);
    EXPECT_TRUE(p.more);
    EXPECT_LT(p.entries.size(), 10u);
    EXPECT_GE(p.entries.size(), 1u);
}

TEST(StoreLimits, OversizeAndFullAreRefusedWithAReason) {
    kvs::StoreLimits lim;
    lim.max_key = 64;
    lim.max_value = 100;
    lim.max_bytes = 3000;  // each record ~290 bytes with its overhead
    kvs::MemoryStore store(lim);
    EXPECT_EQ(store.put("n", std::string(65, 'k'), "v", "a").status().err(), EMSGSIZE);
    EXPECT_EQ(store.put("n", "k", std::string(101, 'v'), "a").status().err(), EMSGSIZE);
    int stored = 0;
    Status last;
    for (int i = 0; i < 100; ++i) {
        auto v = store.put("n", "key" + std::to_string(i), std::string(90, 'v'), "a");
        if (!v) {
            last = v.status();
            break;
        }
        ++stored;
    }
    EXPECT_GT(stored, 5);
    EXPECT_LT(stored, 12);
    EXPECT_EQ(last.err(), ENOSPC);
    EXPECT_NE(last.message().find("--store-max"), std::string::npos);
    EXPECT_LE(store.bytes(), lim.max_bytes);
    EXPECT_EQ(store.refused(), 3u);
    // Replacing a value by one no larger always fits; the space is reused.
    EXPECT_TRUE(store.put("n", "key0", std::string(10, 'w'), "a").is_ok());
    EXPECT_TRUE(store.put("n", "key0", std::string(90, 'x'), "a").is_ok());
    EXPECT_EQ(store.get("n", "key0")->value, std::string(90, 'x'));
}

TEST(StoreLimits, RecordQuotaPerNamespaceNamesTheOption) {
    kvs::StoreLimits lim;
    lim.max_records_per_ns = 3;
    kvs::MemoryStore store(lim);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(store.put("a", "k" + std::to_string(i), "v", "s"));
    auto r = store.put("a", "k3", "v", "s");
    ASSERT_FALSE(r);
    EXPECT_EQ(r.status().err(), EDQUOT);
    EXPECT_EQ(r.status().rc(), DYAD_RC_BADCOMMIT);
    const std::string& m = r.status().message();
    EXPECT_NE(m.find("'a'"), std::string::npos) << m;
    EXPECT_NE(m.find("3 records"), std::string::npos) << m;
    EXPECT_NE(m.find("holds 3"), std::string::npos) << m;
    EXPECT_NE(m.find("--store-max-records-per-namespace"), std::string::npos) << m;
    EXPECT_EQ(store.refusals().ns_records, 1u);
    EXPECT_EQ(store.refused(), 1u);
    // Replacing a key is not a new record.
    EXPECT_TRUE(store.put("a", "k1", "changed", "s"));
    EXPECT_EQ(store.usage("a").records, 3u);
    // Another namespace has a quota of its own.
    EXPECT_TRUE(store.put("b", "k3", "v", "s"));
    EXPECT_EQ(store.usage("b").records, 1u);
}

TEST(StoreLimits, ByteQuotaPerNamespace) {
    kvs::StoreLimits lim;
    lim.max_bytes_per_ns = 1050;  // the namespace 513, a record ~295
    kvs::MemoryStore store(lim);
    EXPECT_EQ(store.ns_byte_quota("a"), 1050u);
    ASSERT_TRUE(store.put("a", "k0", std::string(100, 'v'), "s"));
    auto r = store.put("a", "k1", std::string(100, 'v'), "s");
    ASSERT_FALSE(r);
    EXPECT_EQ(r.status().err(), EDQUOT);
    EXPECT_NE(r.status().message().find("--store-max-bytes-per-namespace"), std::string::npos);
    EXPECT_NE(r.status().message().find("quota of 1050 bytes"), std::string::npos);
    EXPECT_EQ(store.refusals().ns_bytes, 1u);
    // A smaller replacement fits and frees room.
    EXPECT_TRUE(store.put("a", "k0", std::string(10, 'w'), "s"));
    EXPECT_TRUE(store.put("a", "k1", std::string(100, 'v'), "s"));
    EXPECT_TRUE(store.put("b", "k1", std::string(150, 'v'), "s"));
    // Default: the whole store's size.
    kvs::MemoryStore plain;
    EXPECT_EQ(plain.ns_byte_quota("a"), plain.limits().max_bytes);
}

TEST(StoreLimits, AFullDataNamespaceDoesNotStarveTheRegistry) {
    kvs::StoreLimits lim;
    lim.max_bytes = 500;
    kvs::MemoryStore store(lim);
    int stored = 0;
    while (store.put("data", "k" + std::to_string(stored), std::string(50, 'v'), "s")) ++stored;
    EXPECT_EQ(store.refusals().store_full, 1u);
    auto reg = store.put(kvs::kServicesNamespace, "svc-1", R"({"service_id":"svc-1"})", "svc-1");
    EXPECT_TRUE(reg) << reg.status().message();
    // The registry has its own record quota.
    kvs::StoreLimits small;
    small.registry_max_records = 1;
    kvs::MemoryStore s2(small);
    EXPECT_TRUE(s2.put(kvs::kServicesNamespace, "a", "{}", "a"));
    EXPECT_TRUE(s2.put(kvs::kServicesNamespace, "a", "{}", "a"));  // registering again
    EXPECT_EQ(s2.put(kvs::kServicesNamespace, "b", "{}", "b").status().err(), EDQUOT);
}

TEST(Registry, RanksInRegistrationOrderUnlessBrought) {
    kvs::MemoryStore s;
    auto reg = [&](const std::string& id, const std::string& extra = "") {
        std::string v = R"({"service_id":")" + id + R"(","endpoints":[])" + extra + "}";
        EXPECT_TRUE(s.put(kvs::kServicesNamespace, id, v, id));
        return kvs::registry::rank_of(s.get(kvs::kServicesNamespace, id)->value);
    };
    EXPECT_EQ(reg("a"), 0u);
    EXPECT_EQ(reg("b"), 1u);
    EXPECT_EQ(reg("c", R"(,"rank":7,"rank_source":"cli")"), 7u);  // its own
    EXPECT_EQ(reg("d"), 8u);                                      // after the highest
    EXPECT_EQ(reg("a"), 0u);                                      // again: the same
    auto v = nlohmann::json::parse(s.get(kvs::kServicesNamespace, "d")->value);
    EXPECT_EQ(v["rank_source"], "store");
    EXPECT_EQ(nlohmann::json::parse(s.get(kvs::kServicesNamespace, "c")->value)["rank_source"],
              "cli");
    // Not an object: kept as it is (the etcd store refuses it).
    EXPECT_TRUE(s.put(kvs::kServicesNamespace, "e", "[]", "e"));
    EXPECT_EQ(s.get(kvs::kServicesNamespace, "e")->value, "[]");
    auto refused = kvs::registry::with_rank(
        "e", "[]", [] { return Result<std::optional<uint64_t>>(std::optional<uint64_t>(0)); });
    EXPECT_EQ(refused.status().rc(), DYAD_RC_BADPACK);
    // No rank left: the service goes without one.
    std::map<std::string, kvs::Entry> full = {{"x", kvs::Entry{R"({"rank":4294967294})", 1, "x"}}};
    EXPECT_FALSE(kvs::registry::dense_rank("y", full).has_value());
    EXPECT_EQ(kvs::registry::dense_rank("x", full), 4294967294u);
}

// Unpublish (issue 34, item 4): only the writer removes its key, the
// quotas' accounting gives back what the record held, a waiter stays.
TEST(Kvs, RemoveOnlyByItsWriterAndGivesBackItsBytes) {
    kvs::MemoryStore s;
    const uint64_t empty = s.bytes();
    ASSERT_TRUE(s.put("ns", "k", "v", "svc-a").is_ok());
    const uint64_t one = s.bytes();
    Status other = s.remove("ns", "k", "svc-b");
    EXPECT_EQ(other.rc(), DYAD_RC_NOAUTH);
    EXPECT_NE(other.message().find("svc-a"), std::string::npos) << other.message();
    EXPECT_TRUE(s.get("ns", "k").has_value());
    EXPECT_EQ(s.remove("ns", "absent", "svc-a").rc(), DYAD_RC_NOTFOUND);
    EXPECT_EQ(s.remove("nowhere", "k", "svc-a").rc(), DYAD_RC_NOTFOUND);
    bool woke = false;
    s.watch_create("ns", "w", [&](const kvs::Entry&) { woke = true; });
    EXPECT_TRUE(s.remove("ns", "k", "svc-a").is_ok());
    EXPECT_FALSE(s.get("ns", "k").has_value());
    EXPECT_EQ(s.usage("ns").records, 0u);
    EXPECT_LT(s.bytes(), one);
    EXPECT_GE(s.bytes(), empty);
    EXPECT_EQ(s.watcher_count(), 1u);
    EXPECT_FALSE(woke);
    ASSERT_TRUE(s.put("ns", "k", "v2", "svc-b").is_ok());  // free for anyone again
}
