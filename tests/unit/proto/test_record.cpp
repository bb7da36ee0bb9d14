// SPDX-License-Identifier: Apache-2.0
// Record::from_json reads a record without building its document
// (src/kvs/record.cpp). These tests hold it to the rules of the record's
// format, and compare it on many texts with a reading through the document
// (reference(), below: the earlier implementation, stricter only in refusing
// booleans as numbers).
#include <gtest/gtest.h>

#include "proto/record.hpp"

using dyad::proto::Record;

namespace {

std::optional<Record> reference(const std::string& text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return std::nullopt;
    for (const char* k : {"size", "mtime_ns", "mode", "ino"}) {
        auto it = j.find(k);
        if (it != j.end() && !it->is_number_integer()) return std::nullopt;
    }
    Record r;
    try {
        r.upath = j.at("path").get<std::string>();
        r.owner = j.at("owner").get<std::string>();
        r.node = j.value("node", r.owner);
        r.producer_dir = j.value("producer_dir", "");
        r.endpoints = j.at("endpoints").get<std::vector<std::string>>();
        r.size = j.at("size").get<uint64_t>();
        r.mtime_ns = j.value("mtime_ns", static_cast<int64_t>(0));
        r.mode = j.value("mode", 0644u);
        r.ino = j.value("ino", static_cast<uint64_t>(0));
        auto rk = j.find("rank");
        if (rk != j.end() && rk->is_number_unsigned() && rk->get<uint64_t>() < UINT32_MAX)
            r.rank = rk->get<uint32_t>();
    } catch (const std::exception&) {
        return std::nullopt;
    }
    return r;
}

void equal(const Record& a, const Record& b) {
    EXPECT_EQ(a.upath, b.upath);
    EXPECT_EQ(a.owner, b.owner);
    EXPECT_EQ(a.node, b.node);
    EXPECT_EQ(a.producer_dir, b.producer_dir);
    EXPECT_EQ(a.endpoints, b.endpoints);
    EXPECT_EQ(a.size, b.size);
    EXPECT_EQ(a.mtime_ns, b.mtime_ns);
    EXPECT_EQ(a.mode, b.mode);
    EXPECT_EQ(a.ino, b.ino);
    EXPECT_EQ(a.rank, b.rank);
}

// The one-pass reading of canonical text, where it reads, reads what the
// SAX reading reads.
void canonical_agrees(const std::string& text) {
    auto fast = dyad::proto::record_detail::read_canonical(text);
    if (!fast) return;
    auto full = dyad::proto::record_detail::read_any(text);
    ASSERT_TRUE(full.is_ok()) << "read canonically but refused: " << full.status().message();
    equal(*fast, full.value());
}

void same(const std::string& text) {
    SCOPED_TRACE(text);
    canonical_agrees(text);
    auto want = reference(text);
    auto got = Record::from_json(text, 9);
    ASSERT_EQ(want.has_value(), got.is_ok()) << (got ? "" : got.status().message());
    if (!want) {
        EXPECT_EQ(got.status().rc(), DYAD_RC_BADMETADATA);
        EXPECT_EQ(got.status().err(), EPROTO);
        return;
    }
    equal(*want, got.value());
    EXPECT_EQ(got->generation, 9u);
}

const char* kFull =
    R"({"path":"a/b.bin","owner":"svc-1","node":"3","producer_dir":"/p","endpoints":)"
    R"(["tcp://10.0.0.1:4000","unix:/run/d.sock"],"size":4096,"mtime_ns":1700000000123456789,)"
    R"("mode":420,"ino":77,"rank":3})";

}  // namespace

TEST(Record, ReadsEveryField) {
    auto r = Record::from_json(kFull, 5);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->upath, "a/b.bin");
    EXPECT_EQ(r->owner, "svc-1");
    EXPECT_EQ(r->node, "3");
    EXPECT_EQ(r->producer_dir, "/p");
    EXPECT_EQ(r->endpoints, (std::vector<std::string>{"tcp://10.0.0.1:4000", "unix:/run/d.sock"}));
    EXPECT_EQ(r->size, 4096u);
    EXPECT_EQ(r->mtime_ns, 1700000000123456789);
    EXPECT_EQ(r->mode, 420u);
    EXPECT_EQ(r->ino, 77u);
    EXPECT_EQ(r->rank, 3u);
    EXPECT_EQ(r->generation, 5u);
}

TEST(Record, RoundTripsThroughToJson) {
    Record a = Record::from_json(kFull, 1).value();
    a.endpoints.push_back("tcp://[::1]:9");
    a.rank.reset();
    Record b = Record::from_json(a.to_json().dump(), 1).value();
    EXPECT_EQ(b.endpoints, a.endpoints);
    EXPECT_FALSE(b.rank.has_value());
    EXPECT_EQ(b.to_json(), a.to_json());
}

TEST(Record, WhatToJsonWritesIsReadInOnePass) {
    Record a = Record::from_json(kFull, 1).value();
    std::vector<Record> records(6, a);
    records[1].rank.reset();
    records[2].endpoints.clear();
    records[3].mtime_ns = -1700000000123456789;
    records[4].mtime_ns = INT64_MAX;
    records[4].size = UINT64_MAX / 10;
    records[5].node = records[5].owner;
    for (const Record& r : records) {
        const std::string text = r.to_json().dump();
        SCOPED_TRACE(text);
        auto fast = dyad::proto::record_detail::read_canonical(text);
        ASSERT_TRUE(fast.has_value());
        equal(*fast, r);
        canonical_agrees(text);
    }
    // -0 is an integer that is not negative (the document reading, above,
    // takes it for a signed one and drops the rank).
    canonical_agrees(R"({"path":"p","owner":"o","endpoints":[],"size":1,"rank":-0})");
    // Past ASCII, or escaped: declined, and read all the same.
    Record u = a;
    u.upath = "caf\xc3\xa9/\"q\".bin";
    const std::string text = u.to_json().dump();
    EXPECT_FALSE(dyad::proto::record_detail::read_canonical(text).has_value());
    auto r = Record::from_json(text, 4);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->upath, u.upath);
    EXPECT_EQ(r->generation, 4u);
}

TEST(Record, DefaultsOfOptionalFields) {
    auto r = Record::from_json(R"({"path":"p","owner":"o","endpoints":[],"size":0})", 1);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->node, "o");  // the owner's name
    EXPECT_EQ(r->producer_dir, "");
    EXPECT_EQ(r->mtime_ns, 0);
    EXPECT_EQ(r->mode, 0644u);
    EXPECT_EQ(r->ino, 0u);
    EXPECT_FALSE(r->rank.has_value());
}

TEST(Record, SaysWhatIsWrong) {
    auto no_size = Record::from_json(R"({"path":"p","owner":"o","endpoints":[]})", 1);
    ASSERT_FALSE(no_size.is_ok());
    EXPECT_NE(no_size.status().message().find("'size'"), std::string::npos);
    auto float_size =
        Record::from_json(R"({"path":"p","owner":"o","endpoints":[],"size":1e300})", 1);
    ASSERT_FALSE(float_size.is_ok());
    EXPECT_NE(float_size.status().message().find("'size' is not an integer"), std::string::npos);
    auto not_json = Record::from_json("{\"path\":", 1);
    ASSERT_FALSE(not_json.is_ok());
    EXPECT_NE(not_json.status().message().find("not JSON"), std::string::npos);
    auto bad_ep = Record::from_json(R"({"path":"p","owner":"o","endpoints":["a",2],"size":1})", 1);
    ASSERT_FALSE(bad_ep.is_ok());
    EXPECT_NE(bad_ep.status().message().find("'endpoints'"), std::string::npos);
}

TEST(Record, AgreesWithTheDocumentReading) {
    const std::string ok = R"("path":"p","owner":"o","endpoints":["e"],"size":1)";
    const std::vector<std::string> texts = {
        kFull,
        "{" + ok + "}",
        "{" + ok + R"(,"node":"n","producer_dir":"d"})",
        // unknown fields of every shape, nested
        "{" + ok + R"(,"x":{"a":[1,{"b":[[]]}],"path":3},"y":[{"size":"z"}],"z":null})",
        // repeated fields: the last counts
        "{" + ok + R"(,"size":7,"endpoints":["f","g"],"path":"q"})",
        // wrong types
        "{" + ok + R"(,"node":null})",
        "{" + ok + R"(,"node":5})",
        "{" + ok + R"(,"producer_dir":[]})",
        "{" + ok + R"(,"mode":"644"})",
        "{" + ok + R"(,"mode":1.5})",
        "{" + ok + R"(,"mtime_ns":{}})",
        "{" + ok + R"(,"ino":-1})",
        "{" + ok + R"(,"size":-5})",
        "{" + ok + R"(,"mode":4294967297})",
        "{" + ok + R"(,"mtime_ns":18446744073709551615})",
        R"({"path":1,"owner":"o","endpoints":[],"size":1})",
        R"({"path":"p","owner":["o"],"endpoints":[],"size":1})",
        R"({"path":"p","owner":"o","endpoints":"e","size":1})",
        R"({"path":"p","owner":"o","endpoints":{"a":"b"},"size":1})",
        R"({"path":"p","owner":"o","endpoints":[["e"]],"size":1})",
        R"({"path":"p","owner":"o","endpoints":[{"e":1}],"size":1})",
        R"({"path":"p","owner":"o","endpoints":[null],"size":1})",
        // rank: kept only as a small unsigned integer; anything else ignored
        "{" + ok + R"(,"rank":4294967294})",
        "{" + ok + R"(,"rank":4294967295})",
        "{" + ok + R"(,"rank":-1})",
        "{" + ok + R"(,"rank":2.0})",
        "{" + ok + R"(,"rank":"2"})",
        "{" + ok + R"(,"rank":[2]})",
        "{" + ok + R"(,"rank":{"r":2}})",
        "{" + ok + R"(,"rank":2,"rank":null})",
        // not a record
        "",
        " ",
        "null",
        "[]",
        "[{" + ok + "}]",
        "\"x\"",
        "42",
        "{" + ok + "} {}",
        "{" + ok + "",
        "{" + ok + ",}",
        "{" + ok + "}x",
        R"({"path":"p\u0000q","owner":"o"})",
        "{" + ok + R"(,"path":"\ud800"})",
        // the edges of the one-pass reading (declined: the SAX reading reads)
        "{" + ok + R"(,"mtime_ns":9999999999999999999})",
        "{" + ok + R"(,"mtime_ns":10000000000000000000})",
        "{" + ok + R"(,"mtime_ns":-999999999999999999})",
        "{" + ok + R"(,"mtime_ns":-9223372036854775808})",
        "{" + ok + R"(,"mtime_ns":-9223372036854775807})",
        "{" + ok + R"(,"mtime_ns":-0})",
        "{" + ok + R"(,"size":0})",
        "{" + ok + R"(,"size":01})",
        "{" + ok + R"(,"size":1.0})",
        "{" + ok + R"(,"size":1e3})",
        "{" + ok + R"(,"size":-})",
        "{" + ok + R"(,"path":"a\/b"})",
        "{" + ok + R"(,"path":"caf\u00e9"})",
        "{" + ok + ",\"path\":\"caf\xc3\xa9\"}",
        "{" + ok + ",\"path\":\"caf\xe9\"}",
        "{" + ok + ",\"path\":\"a\tb\"}",
        "{" + ok + R"(,"":"x","endpoints":[],"endpoints":["h"]})",
        R"({ "path":"p","owner":"o","endpoints":["e"],"size":1})",
        R"({"path" :"p","owner":"o","endpoints":["e"],"size":1})",
        R"({"path":"p","owner":"o","endpoints":["e" ,"f"],"size":1})",
        R"({"path":"p","owner":"o","endpoints":["e"],"size":1} )",
        R"({"path":"p","owner":"o","endpoints":[,],"size":1})",
        R"({"path":"p","owner":"o","endpoints":["e",],"size":1})",
        R"({"path":"p","owner":"o","endpoints":["e"]"size":1})",
        R"({"path":"p","owner":"o","endpoints":["e"],"size":1,"x":true})",
        R"({"path":"p","owner":"o","endpoints":["e"],"size":1,"x":[1]})",
        R"({"path":"p","owner":"o","endpoints":["e"],"size":1,"x":["y"]})",
        R"({"path":"p","owner":"o","endpoints":["e"],"size":1,"x":-7})",
        R"({"path":"p","owner":"o","endpoints":["e"],"size":1,"x":"y"})",
        R"({"path":"p","owner":"o","endpoints":["e"],"size":"1"})",
        R"({"path":"p","owner":"o","endpoints":["e"],"size":1,"owner":2})",
        R"({"path":"p","owner":"o","endpoints":["e"],"size":1)",
        R"({"path":"p","owner":"o","endpoints":["e"],"size":1}})",
        R"({"path":"p","owner":"o","endpoints":["e"],"size":1,"node":"p","node":"q"})",
        "{}",
    };
    for (const auto& t : texts) same(t);
}
