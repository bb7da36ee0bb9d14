// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "rpc/wire.hpp"

using namespace dyad::rpc;

TEST(Wire, HeaderRoundTrip) {
    Header h;
    h.type = Type::error;
    h.tag = 0xdeadbeef;
    h.errnum = -5;
    h.meta_len = 17;
    h.data_len = 1 << 20;
    uint8_t buf[kHeaderSize];
    encode_header(h, buf);
    EXPECT_EQ(buf[0], 'D');
    EXPECT_EQ(buf[1], 'Y');
    EXPECT_EQ(buf[2], 'A');
    EXPECT_EQ(buf[3], 'D');
    Header d;
    ASSERT_TRUE(decode_header(buf, &d).is_ok());
    EXPECT_EQ(d.type, Type::error);
    EXPECT_EQ(d.tag, h.tag);
    EXPECT_EQ(d.errnum, -5);
    EXPECT_EQ(d.meta_len, 17u);
    EXPECT_EQ(d.data_len, 1u << 20);
}

// The flags say how much of the data a frame's tag covers (issue 45): all of
// it (at most a meta's size), or its first kTagHead bytes (that many at least).
TEST(Wire, TagFlagsNameACoveredPartThatExists) {
    auto decoded = [](uint8_t flags, uint32_t data_len, Header* d) {
        Header h;
        h.type = Type::response;
        h.flags = flags;
        h.data_len = data_len;
        uint8_t buf[kHeaderSize];
        encode_header(h, buf);
        return decode_header(buf, d);
    };
    Header d;
    ASSERT_TRUE(decoded(kFlagTagData, 1000, &d).is_ok());
    EXPECT_EQ(tagged_data_len(d), 1000u);
    ASSERT_TRUE(decoded(kFlagTagHead, 1000, &d).is_ok());
    EXPECT_EQ(tagged_data_len(d), kTagHead);
    ASSERT_TRUE(decoded(0, 1000, &d).is_ok());
    EXPECT_EQ(tagged_data_len(d), 0u);
    ASSERT_TRUE(decoded(0x80, 1000, &d).is_ok());  // another bit: ignored
    EXPECT_EQ(tagged_data_len(d), 0u);
    EXPECT_EQ(decoded(kFlagTagData | kFlagTagHead, 1000, &d).err(), EPROTO);
    EXPECT_EQ(decoded(kFlagTagHead, kTagHead - 1, &d).err(), EPROTO);
    EXPECT_EQ(decoded(kFlagTagData, kMaxMeta + 1, &d).err(), EPROTO);
}

TEST(Wire, RejectsOtherVersionsAndJunk) {
    Header h;
    uint8_t buf[kHeaderSize];
    encode_header(h, buf);
    buf[4] = 9;  // version 9
    Header d;
    auto s = decode_header(buf, &d);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("version 9"), std::string::npos);
    encode_header(h, buf);
    buf[0] = 'X';
    EXPECT_FALSE(decode_header(buf, &d).is_ok());
    encode_header(h, buf);
    buf[6] = 42;  // type
    EXPECT_FALSE(decode_header(buf, &d).is_ok());
    h.data_len = kMaxData + 1;
    encode_header(h, buf);
    EXPECT_FALSE(decode_header(buf, &d).is_ok());
}

TEST(Wire, ParsesUris) {
    auto t = parse_uri("tcp://127.0.0.2:7000");
    ASSERT_TRUE(t.is_ok());
    EXPECT_EQ(t->host, "127.0.0.2");
    EXPECT_EQ(t->port, 7000);
    auto u = parse_uri("unix:/tmp/d.sock");
    ASSERT_TRUE(u.is_ok());
    EXPECT_TRUE(u->is_unix);
    EXPECT_EQ(u->path, "/tmp/d.sock");
    EXPECT_FALSE(parse_uri("tcp://host").is_ok());
    EXPECT_FALSE(parse_uri("http://x:1").is_ok());
    EXPECT_FALSE(parse_uri("tcp://h:99999").is_ok());
}
