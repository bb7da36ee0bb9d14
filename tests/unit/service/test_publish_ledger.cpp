// SPDX-License-Identifier: Apache-2.0
// The publish ledger: what a service published, the served-file check of
// its fetches, and what it publishes again after a re-join.
#include <gtest/gtest.h>

#include <cerrno>

#include "kvs/record.hpp"
#include "service/publish_ledger.hpp"

using namespace dyad;
using service::Published;
using service::PublishLedger;

namespace {
struct stat file(uint64_t ino, uint64_t size, int64_t mtime_s, int64_t ctime_s = 0) {
    struct stat sb {};
    sb.st_dev = 7;
    sb.st_ino = ino;
    sb.st_size = static_cast<off_t>(size);
    sb.st_mtim.tv_sec = mtime_s;
    sb.st_ctim.tv_sec = ctime_s ? ctime_s : mtime_s;
    sb.st_nlink = 1;
    return sb;
}

PublishLedger::Recall nothing() {
    return [](const std::string&, const std::string&) -> Result<kvs::Entry> {
        return Status(DYAD_RC_NOTFOUND, "no record", ENOENT);
    };
}

// Publishes `up` as `sb` with the store answering `version`.
void publish(PublishLedger& l, const std::string& up, const struct stat& sb, uint64_t version) {
    auto gate = l.publishing();
    Published p = Published::of(sb, "ns", "key/" + up);
    auto before = l.begin(up, p);
    l.end(up, p, Result<uint64_t>(version), before);
}
}  // namespace

TEST(PublishLedger, ServesOnlyWhatWasPublishedUnchanged) {
    PublishLedger l;
    auto sb = file(1, 10, 100);
    EXPECT_EQ(l.check("svc", "a", sb, {}, nothing()).err(), ENOENT);
    publish(l, "a", sb, 5);
    EXPECT_TRUE(l.check("svc", "a", sb, {}, nothing()).is_ok());
    // Changed since: size, mtime, or ctime alone (an mtime put back).
    for (auto changed :
         {file(1, 11, 100), file(1, 10, 101), file(1, 10, 100, 200), file(2, 10, 100)}) {
        Status st = l.check("svc", "a", changed, {}, nothing());
        EXPECT_EQ(st.err(), ESTALE);
        EXPECT_NE(st.message().find("changed since it was published (generation 5)"),
                  std::string::npos)
            << st.message();
    }
    // A consumer that looked up another generation looks it up again.
    Status again = l.check("svc", "a", sb, {std::nullopt, std::nullopt, 4}, nothing());
    EXPECT_EQ(again.err(), ESTALE);
    EXPECT_NE(again.message().find("produced again"), std::string::npos);
    EXPECT_TRUE(l.check("svc", "a", sb, {std::nullopt, std::nullopt, 5}, nothing()).is_ok());
    EXPECT_TRUE(l.check("svc", "a", sb, {std::nullopt, std::nullopt, 0}, nothing()).is_ok());
}

TEST(PublishLedger, AFailedPublishPutsBackWhatWasBefore) {
    PublishLedger l;
    auto first = file(1, 10, 100);
    publish(l, "a", first, 5);
    auto second = file(1, 20, 200);
    Published p = Published::of(second, "ns", "key/a");
    auto before = l.begin("a", p);
    ASSERT_TRUE(before.has_value());
    // Meanwhile the new one is served (generation 0: not checked).
    EXPECT_TRUE(l.check("svc", "a", second, {std::nullopt, std::nullopt, 9}, nothing()).is_ok());
    l.end("a", p, Result<uint64_t>(Status(DYAD_RC_CONNFAIL, "gone", ECONNREFUSED)), before);
    EXPECT_EQ(l.find("a")->generation, 5u);
    EXPECT_TRUE(l.check("svc", "a", first, {}, nothing()).is_ok());
    // A first publish that fails leaves nothing.
    Published q = Published::of(first, "ns", "key/b");
    auto none = l.begin("b", q);
    EXPECT_FALSE(none.has_value());
    l.end("b", q, Result<uint64_t>(Status(DYAD_RC_CONNFAIL, "gone", ECONNREFUSED)), none);
    EXPECT_FALSE(l.find("b").has_value());
}

TEST(PublishLedger, AfterARestartTheStoreSaysWhatWasPublished) {
    PublishLedger l;
    auto sb = file(3, 42, 300);
    kvs::Record rec;
    rec.upath = "a";
    rec.owner = "svc";
    rec.size = 42;
    rec.mtime_ns = 300ll * 1000000000ll;
    rec.ino = 3;
    const std::string value = rec.to_json().dump();
    int asked = 0;
    PublishLedger::Recall store = [&](const std::string& ns, const std::string& key) {
        ++asked;
        EXPECT_EQ(ns, "ns");
        EXPECT_EQ(key, "k");
        return Result<kvs::Entry>(kvs::Entry{value, 11, "svc"});
    };
    // Without ns and key the store is not asked.
    EXPECT_EQ(l.check("svc", "a", sb, {}, store).err(), ENOENT);
    EXPECT_EQ(asked, 0);
    // Another owner's record, or another path's, is not this service's.
    EXPECT_EQ(l.check("other", "a", sb, {"ns", "k", std::nullopt}, store).err(), ENOENT);
    EXPECT_EQ(l.check("svc", "b", sb, {"ns", "k", std::nullopt}, store).err(), ENOENT);
    EXPECT_TRUE(l.check("svc", "a", sb, {"ns", "k", 11}, store).is_ok());
    // Learnt: the store is not asked again.
    asked = 0;
    EXPECT_TRUE(l.check("svc", "a", sb, {}, store).is_ok());
    EXPECT_EQ(asked, 0);
    EXPECT_EQ(l.find("a")->generation, 11u);
    // The store's error is said.
    PublishLedger fresh;
    Status st = fresh.check("svc", "a", sb, {"ns", "k", std::nullopt}, nothing());
    EXPECT_NE(st.message().find("(no record)"), std::string::npos) << st.message();
}

TEST(PublishLedger, RepublishListsWhatTheStoreAnswered) {
    PublishLedger l;
    publish(l, "a", file(1, 1, 1), 5);
    publish(l, "b", file(2, 2, 2), 6);
    Published pending = Published::of(file(3, 3, 3), "ns", "key/c");
    auto none = l.begin("c", pending);  // the store has not answered yet
    auto all = l.to_republish();
    ASSERT_EQ(all.size(), 2u);
    for (auto& [up, pub] : all) {
        EXPECT_TRUE(l.current(up, pub.generation));
        EXPECT_EQ(pub.key, "key/" + up);
    }
    l.republished("a", 5, 50);
    EXPECT_EQ(l.find("a")->generation, 50u);
    EXPECT_FALSE(l.current("a", 5));
    // A re-publish of a generation published again meanwhile changes nothing.
    l.republished("a", 5, 60);
    EXPECT_EQ(l.find("a")->generation, 50u);
    auto gate = l.republishing();  // alone
    EXPECT_EQ(l.size(), 3u);
}

TEST(PublishLedger, OneNameOnly) {
    auto sb = file(1, 1, 1);
    EXPECT_TRUE(service::one_name("a", sb).is_ok());
    sb.st_nlink = 2;
    Status st = service::one_name("a", sb);
    EXPECT_EQ(st.err(), EPERM);
    EXPECT_NE(st.message().find("2 hard links"), std::string::npos);
}
