// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "common/keygen.hpp"

using dyad::gen_path_key;

TEST(Keygen, MatchesDyadVectors) {
    EXPECT_EQ(gen_path_key("1/data0.txt", 3, 1024).value(), "263.2ce.2e1.1/data0.txt");
    EXPECT_EQ(gen_path_key("data0.txt", 3, 1024).value(), "17f.204.15b.data0.txt");
    EXPECT_EQ(gen_path_key("file0.npy", 3, 1024).value(), "141.f6.129.file0.npy");
    EXPECT_EQ(gen_path_key("test_string", 3, 5).value(), "2.0.2.test_string");
}

TEST(Keygen, DepthZeroIsThePath) {
    EXPECT_EQ(gen_path_key("a/b", 0, 7).value(), "a/b");
}

TEST(Keygen, LongPathsAreHashedUnpadded) {
    std::string p(200, 'x');
    auto k = gen_path_key(p, 2, 16);
    ASSERT_TRUE(k.is_ok());
    EXPECT_EQ(k->substr(k->size() - 200), p);
    EXPECT_NE(gen_path_key(p, 2, 16).value(), gen_path_key(p + "y", 2, 16).value().substr(0, 0));
}

TEST(Keygen, RejectsZeroBinsAndEmptyPath) {
    EXPECT_EQ(gen_path_key("a", 3, 0).status().rc(), DYAD_RC_BADMETADATA);
    EXPECT_EQ(gen_path_key("", 3, 8).status().rc(), DYAD_RC_BADFIO);
}

TEST(Murmur3, KnownAnswer) {
    // MurmurHash3_x64_128("", seed 0) is all zeros; "hello" with seed 0 is a
    // published value.
    uint64_t h[2];
    dyad::murmur3_x64_128("", 0, 0, h);
    EXPECT_EQ(h[0], 0u);
    EXPECT_EQ(h[1], 0u);
    dyad::murmur3_x64_128("hello", 5, 0, h);
    EXPECT_EQ(h[0], 0xcbd8a7b341bd9b02ULL);
    EXPECT_EQ(h[1], 0x5b1e906a48ae1d19ULL);
}

#include "common/base64.hpp"

TEST(Base64, Rfc4648Vectors) {
    const char* plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char* coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; ++i) {
        EXPECT_EQ(dyad::base64_encode(plain[i]), coded[i]);
        EXPECT_EQ(dyad::base64_decode(coded[i]).value(), plain[i]);
    }
    std::string bin("\x00\xff\x10\x80", 4);
    EXPECT_EQ(dyad::base64_decode(dyad::base64_encode(bin)).value(), bin);
    EXPECT_FALSE(dyad::base64_decode("Zm9").is_ok());
    EXPECT_FALSE(dyad::base64_decode("Zm!v").is_ok());
    EXPECT_FALSE(dyad::base64_decode("Zg==Zg==").is_ok());
}
