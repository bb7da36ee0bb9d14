// SPDX-License-Identifier: Apache-2.0
// The fetch and publish messages: build and parse agree, and a peer's bad
// fields give the protocol's errors.
#include <gtest/gtest.h>

#include "proto/fetch.hpp"
#include "proto/publish.hpp"

using namespace dyad::proto;
using nlohmann::json;

TEST(ProtoFetch, RequestRoundTripsAndKeepsReceiverFields) {
    FetchRequest r;
    r.upath = "a/b";
    r.transport = "UCX";
    r.generation = 7;
    r.ns = "dyad";
    r.key = "k";
    json a = {{"ucx_tag", 3}};
    r.build_into(a);
    EXPECT_EQ(a["ucx_tag"], 3);
    auto p = FetchRequest::parse(a);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->upath, "a/b");
    EXPECT_EQ(p->transport, "UCX");
    EXPECT_EQ(p->generation, 7u);
    EXPECT_EQ(p->ns.value_or(""), "dyad");
}

TEST(ProtoFetch, RequestWithoutUpathAndLooseFields) {
    json a = {{"transport", 5}, {"generation", -1}};
    auto p = FetchRequest::parse(a);
    ASSERT_FALSE(p.is_ok());
    EXPECT_EQ(p.status().message(), "fetch request without 'upath'");
    EXPECT_EQ(p.status().rc(), DYAD_RC_BADUNPACK);
    EXPECT_EQ(FetchRequest::transport_of(a), "");
    a["upath"] = "x";
    p = FetchRequest::parse(a);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->generation, 0u);  // a negative generation is not checked
}

TEST(ProtoFetch, EndNeedsSizeAndChecksum) {
    auto e = FetchEnd::parse(FetchEnd{5, "ab"}.build(), "f");
    ASSERT_TRUE(e.is_ok());
    EXPECT_EQ(e->size, 5u);
    json bad = {{"size", 5}};
    auto b = FetchEnd::parse(bad, "f");
    ASSERT_FALSE(b.is_ok());
    EXPECT_EQ(b.status().rc(), DYAD_RC_BADRPC);
    EXPECT_NE(b.status().message().find("the end of the fetch of 'f' lacks"), std::string::npos);
}

TEST(ProtoFetch, FetchManyBoundsAndItems) {
    json none = {{"files", json::array()}};
    EXPECT_FALSE(FetchManyRequest::parse(none).is_ok());
    FetchManyRequest r;
    r.transport = "FLUX_RPC";
    r.raw_answer = true;
    r.files.resize(2);
    r.files[0].upath = "a";
    r.files[1].generation = 4;  // no upath: refused alone
    auto p = FetchManyRequest::parse(r.build());
    ASSERT_TRUE(p.is_ok());
    EXPECT_TRUE(p->raw_answer);
    EXPECT_EQ(p->files[0].upath.value_or(""), "a");
    EXPECT_FALSE(p->files[1].upath.has_value());
    json many = {{"files", json::array()}};
    for (size_t i = 0; i <= kFetchManyFiles; ++i) many["files"].push_back({{"upath", "x"}});
    EXPECT_FALSE(FetchManyRequest::parse(many).is_ok());

    auto s = FetchManyItem::parse(FetchManyItem::served(1, 9, "ff").build());
    ASSERT_TRUE(s.is_ok());
    EXPECT_FALSE(s->refused);
    EXPECT_EQ(s->size, 9u);
    auto f = FetchManyItem::parse(
        FetchManyItem::refusal(2, dyad::Status(DYAD_RC_BADFIO, "busy", EBUSY)).build());
    ASSERT_TRUE(f.is_ok());
    EXPECT_TRUE(f->refused);
    EXPECT_EQ(f->err, EBUSY);
    json noindex = {{"size", 1}};
    EXPECT_FALSE(FetchManyItem::parse(noindex).is_ok());
}

TEST(ProtoFetch, TransportAskedTellsAbsentFromEmpty) {
    EXPECT_FALSE(FetchRequest::transport_asked(json::object()).has_value());
    EXPECT_FALSE(FetchRequest::transport_asked(json{{"transport", 3}}).has_value());
    auto empty = FetchRequest::transport_asked(json{{"transport", ""}});
    ASSERT_TRUE(empty.has_value());
    EXPECT_EQ(*empty, "");  // given: refused by a service that does not serve it
    EXPECT_EQ(FetchRequest::transport_asked(json{{"transport", "UCX"}}).value_or(""), "UCX");
}

TEST(ProtoFetch, FetchManyEntryWithoutUpathIsRefusedAlone) {
    json a = {{"files", json::array({json{{"upath", "a"}, {"generation", 3}, {"ns", "n"}},
                                     json{{"generation", 4}}, 7})}};
    auto p = FetchManyRequest::parse(a);
    ASSERT_TRUE(p.is_ok());
    auto first = p->entry(0);
    ASSERT_TRUE(first.is_ok());
    EXPECT_EQ(first->upath, "a");
    EXPECT_EQ(first->generation, 3u);
    EXPECT_EQ(first->ns.value_or(""), "n");
    EXPECT_FALSE(first->key.has_value());
    for (size_t i : {1, 2}) {
        auto e = p->entry(i);
        ASSERT_FALSE(e.is_ok());
        EXPECT_EQ(e.status().message(), "fetch_many entry without 'upath'");
        EXPECT_EQ(e.status().rc(), DYAD_RC_BADUNPACK);
        EXPECT_EQ(e.status().err(), EINVAL);
    }
}

TEST(ProtoFetch, AnswersAsTheServiceSendsThem) {
    json start = FetchStart{10, "FLUX_RPC"}.build();
    EXPECT_EQ(start, (json{{"size", 10}, {"transport", "FLUX_RPC"}}));
    EXPECT_EQ((FetchEnd{10, "ab"}.build()), (json{{"size", 10}, {"xxh3", "ab"}}));
    EXPECT_EQ((FetchManyEnd{3, false}.build()), (json{{"files", 3}}));
    EXPECT_EQ((FetchManyEnd{3, true}.build()), (json{{"files", 3}, {"format", "raw"}}));
    // A refusal without an errno says EIO.
    auto r = FetchManyItem::refusal(1, dyad::Status(DYAD_RC_BADFIO, "no", 0)).build();
    EXPECT_EQ(
        r,
        (json{{"i", 1}, {"rc", static_cast<int>(DYAD_RC_BADFIO)}, {"errno", EIO}, {"msg", "no"}}));
    EXPECT_EQ(FetchManyItem::served(2, 5, "ff").build(),
              (json{{"i", 2}, {"size", 5}, {"xxh3", "ff"}}));
}

TEST(ProtoPublish, DefaultsAndRanges) {
    json a = {{"upath", "f"}, {"key_depth", "x"}, {"key_bins", 0}};
    auto p = PublishRequest::parse(a);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->key_depth, 3u);  // not an integer: the default
    EXPECT_EQ(p->key_bins, 0u);
    EXPECT_FALSE(p->check().is_ok());
    json none = json::object();
    EXPECT_EQ(PublishRequest::parse(none).status().message(), "publish request without 'upath'");
    PublishAnswer ans{12, "k", {{"path", "f"}}};
    auto back = PublishAnswer::parse(ans.build());
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back->version, 12u);
}

TEST(ProtoFetch, EndDigestAsANumber) {
    EXPECT_EQ(digest_of_hex("ff").value_or(0), 255u);
    EXPECT_EQ(digest_of_hex("FFFFFFFFFFFFFFFF").value_or(0), UINT64_MAX);
    EXPECT_FALSE(digest_of_hex("").has_value());
    EXPECT_FALSE(digest_of_hex("12345678901234567").has_value());  // 17 digits
    EXPECT_FALSE(digest_of_hex("12g").has_value());
    EXPECT_FALSE(digest_of_hex("-1").has_value());
    FetchEnd e = FetchEnd::of(3, 0xabc);
    EXPECT_EQ(e.xxh3, "0000000000000abc");
    EXPECT_EQ(e.digest().value_or(0), 0xabcu);
    auto back = FetchEnd::parse(e.build(), "f");
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back->size, 3u);
    EXPECT_EQ(back->xxh3, e.xxh3);
    auto item = FetchManyItem::parse(FetchManyItem::served(0, 4, "ff").build());
    ASSERT_TRUE(item.is_ok());
    EXPECT_EQ(item->end().size, 4u);
    EXPECT_EQ(item->end().digest().value_or(0), 255u);
}

TEST(ProtoFetch, RequestBuildsTheFieldsAConsumerSends) {
    FetchRequest r;
    r.upath = "d/f";
    r.transport = "FLUX_RPC";
    r.generation = 2;
    r.ns = "n";
    r.key = "k/d/f";
    json a = r.build();
    EXPECT_EQ(a, json({{"upath", "d/f"},
                       {"transport", "FLUX_RPC"},
                       {"generation", 2},
                       {"ns", "n"},
                       {"key", "k/d/f"}}));
    FetchManyRequest m;
    m.transport = "FLUX_RPC";
    m.raw_answer = true;
    m.files.push_back({std::string("d/f"), 2, std::string("n"), std::string("k/d/f")});
    EXPECT_EQ(
        m.build(),
        json({{"transport", "FLUX_RPC"},
              {"answer", "raw"},
              {"files",
               json::array(
                   {{{"upath", "d/f"}, {"generation", 2}, {"ns", "n"}, {"key", "k/d/f"}}})}}));
}

TEST(ProtoPublish, RequestAsAProducerSendsIt) {
    PublishRequest r;
    r.upath = "f";
    r.ns = "n";
    r.key_depth = 2;
    r.key_bins = 256;
    EXPECT_EQ(r.build(), json({{"upath", "f"}, {"ns", "n"}, {"key_depth", 2}, {"key_bins", 256}}));
    r.replaces = 4;
    EXPECT_EQ(r.build()["replaces"], 4);
    json partial = {{"version", 3}};
    auto a = PublishAnswer::parse(partial);
    EXPECT_FALSE(a.is_ok());  // no key
}

TEST(ProtoFetch, ByteRangeRoundTripsAndBadRangesAreRefused) {
    FetchRequest r;
    r.upath = "big.bin";
    r.offset = 1ull << 29;
    r.length = 1ull << 20;
    json a = r.build();
    EXPECT_EQ(a["offset"], 1ull << 29);
    EXPECT_EQ(a["length"], 1ull << 20);
    auto p = FetchRequest::parse(a);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->offset.value_or(0), 1ull << 29);
    EXPECT_EQ(p->length.value_or(0), 1ull << 20);
    // Without a range: the whole file, and neither field is written.
    FetchRequest whole;
    whole.upath = "big.bin";
    EXPECT_FALSE(whole.build().contains("offset"));
    EXPECT_FALSE(FetchRequest::parse(whole.build())->offset.has_value());
    // A range that cannot be served as asked is refused, not served whole.
    for (json bad : {json{{"upath", "f"}, {"offset", 3}}, json{{"upath", "f"}, {"length", 3}},
                     json{{"upath", "f"}, {"offset", -1}, {"length", 3}},
                     json{{"upath", "f"}, {"offset", "3"}, {"length", 3}},
                     json{{"upath", "f"}, {"offset", ~0ull}, {"length", 2}}}) {
        auto q = FetchRequest::parse(bad);
        ASSERT_FALSE(q.is_ok()) << bad.dump();
        EXPECT_EQ(q.status().rc(), DYAD_RC_BADUNPACK);
        EXPECT_EQ(q.status().err(), EINVAL);
        EXPECT_NE(q.status().message().find("bad byte range"), std::string::npos);
    }
    // An overflowing sum is called that, not "not unsigned integers".
    auto over = FetchRequest::parse(json{{"upath", "f"}, {"offset", ~0ull}, {"length", 2}});
    ASSERT_FALSE(over.is_ok());
    EXPECT_NE(over.status().message().find("offset 18446744073709551615 + length 2 overflows"),
              std::string::npos)
        << over.status().message();
    EXPECT_EQ(over.status().message().find("unsigned integers"), std::string::npos);
}
