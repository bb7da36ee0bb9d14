// SPDX-License-Identifier: Apache-2.0
// proto::Fields: a peer's object read field by field, one error style.
#include <gtest/gtest.h>

#include "proto/fields.hpp"

using dyad::proto::Fields;
using nlohmann::json;

TEST(Fields, ReadsWellFormedFields) {
    json j = {{"s", "x"}, {"n", 7}, {"i", -3}, {"b", true}, {"d", 0.5}, {"a", {"p", "q"}}};
    Fields f(j, "test");
    EXPECT_EQ(f.str("s"), "x");
    EXPECT_EQ(f.u64("n"), 7u);
    EXPECT_EQ(f.i64("i"), -3);
    EXPECT_TRUE(f.boolean("b"));
    EXPECT_DOUBLE_EQ(f.number("d"), 0.5);
    EXPECT_EQ(f.strings("a", 4).size(), 2u);
    EXPECT_FALSE(f.opt_str("absent").has_value());
    EXPECT_TRUE(f.ok());
}

TEST(Fields, FirstErrorNamesMessageAndField) {
    json j = {{"size", -1}, {"path", 5}};
    Fields f(j, "dyad.fetch");
    (void)f.u64("size");
    (void)f.str("path");
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().rc(), DYAD_RC_BADRPC);
    EXPECT_EQ(f.status().message(), "dyad.fetch: field 'size' must not be negative");
}

TEST(Fields, MissingWrongTypeAndBounds) {
    {
        json j = json::object();
        Fields f(j, "m");
        (void)f.str("k");
        EXPECT_EQ(f.status().message(), "m: field 'k' is missing");
    }
    {
        json j = {{"k", std::string(10, 'x')}};
        Fields f(j, "m");
        (void)f.str("k", 4);
        EXPECT_EQ(f.status().message(), "m: field 'k' is longer than 4 bytes");
    }
    {
        json j = {{"k", {1, 2}}};
        Fields f(j, "m");
        (void)f.strings("k", 8);
        EXPECT_FALSE(f.ok());
    }
    {
        json j = {{"k", {"a", "b", "c"}}};
        Fields f(j, "m");
        (void)f.strings("k", 2);
        EXPECT_EQ(f.status().message(), "m: field 'k' has more than 2 items");
    }
    {
        json j = json::array();
        Fields f(j, "m");
        EXPECT_EQ(f.status().message(), "m: not a JSON object");
        EXPECT_EQ(f.u64("x"), 0u);
    }
    {
        json j = {{"n", 1.5}};
        Fields f(j, "m");
        (void)f.u64("n");
        EXPECT_EQ(f.status().message(), "m: field 'n' must be an integer");
    }
}
