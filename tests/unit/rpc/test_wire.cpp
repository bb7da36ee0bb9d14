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
