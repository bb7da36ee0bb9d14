// SPDX-License-Identifier: Apache-2.0
// The store's topics as types: each message built and parsed back, and
// what a parse refuses.
#include <gtest/gtest.h>

#include "proto/kvs.hpp"

using namespace dyad::proto::kvs;
using nlohmann::json;

TEST(KvsMessages, RoundTrip) {
    PutArgs put{"ns", "k", "v", 7};
    auto p = PutArgs::parse(put.build());
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_EQ(p->ns, "ns");
    EXPECT_EQ(p->value, "v");
    EXPECT_EQ(p->replaces, 7u);
    EXPECT_FALSE((PutArgs{"ns", "k", "v", 0}.build().contains("replaces")));
    EXPECT_EQ(PutAnswer::parse(PutAnswer{9}.build())->version, 9u);

    auto g = GetArgs::parse(GetArgs{"ns", "k", true}.build());
    ASSERT_TRUE(g.is_ok());
    EXPECT_TRUE(g->wait);
    EXPECT_FALSE(GetArgs::parse(json{{"ns", "n"}, {"key", "k"}})->wait);
    auto e = EntryAnswer::parse(EntryAnswer{"v", 3}.build());
    EXPECT_EQ(e->value, "v");
    EXPECT_EQ(e->version, 3u);

    auto l = ListArgs::parse(ListArgs{"ns", "a/", "a/1", 10}.build());
    ASSERT_TRUE(l.is_ok());
    EXPECT_EQ(l->prefix, "a/");
    EXPECT_EQ(l->after, "a/1");
    EXPECT_EQ(l->limit, 10u);
    auto bare = ListArgs::parse(json{{"ns", "n"}});
    ASSERT_TRUE(bare.is_ok());
    EXPECT_EQ(bare->prefix, "");
    EXPECT_EQ(bare->limit, 0u);
    ListAnswer la;
    la.entries = {{"a", "1", 1}, {"b", "2", 2}};
    la.more = true;
    auto lb = ListAnswer::parse(la.build());
    ASSERT_TRUE(lb.is_ok());
    ASSERT_EQ(lb->entries.size(), 2u);
    EXPECT_EQ(lb->entries[1].key, "b");
    EXPECT_EQ(lb->entries[1].version, 2u);
    EXPECT_TRUE(lb->more);

    auto m = GetManyArgs::parse(GetManyArgs{"ns", {"a", "b"}, true}.build());
    ASSERT_TRUE(m.is_ok());
    EXPECT_EQ(m->keys.size(), 2u);
    EXPECT_TRUE(m->raw);
    json raw = GetManyAnswer::build_raw(2);
    auto mr = GetManyAnswer::parse(std::move(raw));
    ASSERT_TRUE(mr.is_ok());
    EXPECT_TRUE(mr->raw);
    EXPECT_EQ(mr->count, 2u);
    json old = GetManyAnswer::build_entries(json::array({0, nullptr}));
    auto mo = GetManyAnswer::parse(std::move(old));
    ASSERT_TRUE(mo.is_ok());
    EXPECT_FALSE(mo->raw);
    EXPECT_EQ(mo->entries.size(), 2u);
}

TEST(KvsMessages, ParseRefusesWhatIsMalformed) {
    auto missing = PutArgs::parse(json{{"ns", "n"}, {"key", "k"}});
    ASSERT_FALSE(missing.is_ok());
    EXPECT_EQ(missing.status().message(), "kvs.put: field 'value' is missing");
    EXPECT_FALSE(PutArgs::parse(json{{"ns", "n"}, {"key", "k"}, {"value", 1}}).is_ok());
    EXPECT_FALSE(
        PutArgs::parse(json{{"ns", "n"}, {"key", "k"}, {"value", "v"}, {"replaces", -1}}).is_ok());
    EXPECT_FALSE(GetArgs::parse(json{{"ns", "n"}, {"key", "k"}, {"wait", 1}}).is_ok());
    EXPECT_FALSE(ListArgs::parse(json{{"ns", "n"}, {"prefix", 5}}).is_ok());
    EXPECT_FALSE(ListArgs::parse(json::array()).is_ok());
    auto many = GetManyArgs::parse(
        json{{"ns", "n"}, {"keys", std::vector<std::string>(kMaxKeys + 1, "k")}});
    ASSERT_FALSE(many.is_ok());
    EXPECT_NE(many.status().message().find("at most 1024 keys"), std::string::npos);
    EXPECT_FALSE(GetManyArgs::parse(json{{"ns", "n"}, {"keys", json::array({"a", 3})}}).is_ok());
    EXPECT_FALSE(GetManyArgs::parse(json{{"ns", "n"}}).is_ok());
    EXPECT_FALSE(GetManyAnswer::parse(json{{"format", "zip"}, {"count", 1}}).is_ok());
    EXPECT_FALSE(ListAnswer::parse(json{{"more", true}}).is_ok());
    EXPECT_FALSE(EntryAnswer::parse(json{{"value", "v"}}).is_ok());
    // An entry of a page it cannot read is left out, the rest kept.
    auto la = ListAnswer::parse(
        json{{"entries", json::array({json{{"key", 1}}, json{{"key", "k"}, {"value", "v"}}})}});
    ASSERT_TRUE(la.is_ok());
    EXPECT_EQ(la->entries.size(), 1u);
}

// kvs.list's compact answer: the entries in the data, read back as written;
// data that does not hold what the meta says is refused, not read past.
TEST(ProtoKvs, ListRawAnswer) {
    auto args = ListArgs::parse(ListArgs{"ns", "", "a", 10, true}.build());
    ASSERT_TRUE(args.is_ok());
    EXPECT_TRUE(args->raw);
    std::string data;
    ListAnswer::append_raw(&data, {"k1", "{\"path\":\"a\"}", 7});
    ListAnswer::append_raw(&data, {"k2", "", 1ull << 40});
    auto meta = ListAnswer::parse(ListAnswer::build_raw(2, true));
    ASSERT_TRUE(meta.is_ok());
    EXPECT_TRUE(meta->raw && meta->more);
    EXPECT_EQ(meta->count, 2u);
    auto got = ListAnswer::parse_raw(data, 2);
    ASSERT_TRUE(got.is_ok());
    ASSERT_EQ(got->size(), 2u);
    EXPECT_EQ((*got)[0].key, "k1");
    EXPECT_EQ((*got)[0].value, "{\"path\":\"a\"}");
    EXPECT_EQ((*got)[0].version, 7u);
    EXPECT_EQ((*got)[1].version, 1ull << 40);
    EXPECT_FALSE(ListAnswer::parse_raw(data, 3).is_ok());                     // fewer than said
    EXPECT_FALSE(ListAnswer::parse_raw(data, 1).is_ok());                     // bytes left over
    EXPECT_FALSE(ListAnswer::parse_raw(data.substr(0, 20), 2).is_ok());       // cut short
    EXPECT_FALSE(ListAnswer::parse_raw(std::string(16, '\xff'), 1).is_ok());  // huge key
    EXPECT_FALSE(ListAnswer::parse(json{{"format", "zip"}, {"count", 1}}).is_ok());
}

// kvs.changes: its arguments and answer round-trip; a wait out of range, an
// entry without its version and an answer without its revision are refused.
TEST(ProtoKvs, ChangesArgsAndAnswer) {
    auto args = ChangesArgs::parse(ChangesArgs{"ns", 42, 0.5}.build());
    ASSERT_TRUE(args.is_ok());
    EXPECT_EQ(args->after, 42u);
    EXPECT_DOUBLE_EQ(args->wait, 0.5);
    EXPECT_FALSE(ChangesArgs::parse(json{{"ns", "n"}, {"wait", -1}}).is_ok());
    EXPECT_FALSE(ChangesArgs::parse(json{{"ns", "n"}, {"wait", 1e9}}).is_ok());
    EXPECT_FALSE(ChangesArgs::parse(json{{"ns", "n"}, {"after", -3}}).is_ok());
    EXPECT_FALSE(ChangesArgs::parse(json{{"after", 3}}).is_ok());
    ChangesAnswer a;
    a.next = 99;
    a.entries.push_back({"k", "{\"path\":\"a\"}", 98});
    auto back = ChangesAnswer::parse(a.build());
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back->next, 99u);
    EXPECT_FALSE(back->compacted);
    ASSERT_EQ(back->entries.size(), 1u);
    EXPECT_EQ(back->entries[0].version, 98u);
    EXPECT_FALSE(
        ChangesAnswer::parse(
            json{{"next", 1}, {"entries", json::array({json{{"key", "k"}, {"value", "v"}}})}})
            .is_ok());
    EXPECT_FALSE(ChangesAnswer::parse(json{{"entries", json::array()}}).is_ok());
}
