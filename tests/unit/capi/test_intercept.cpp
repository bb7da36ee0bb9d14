// SPDX-License-Identifier: Apache-2.0
// The wrapper's policy: which names are a tool's temporaries.
#include <gtest/gtest.h>

#include "capi/intercept.hpp"

using dyad::capi::is_tool_temporary;

TEST(Intercept, ToolTemporaries) {
    EXPECT_TRUE(is_tool_temporary(".data.bin.Ab12Zq"));  // rsync
    EXPECT_TRUE(is_tool_temporary(".x.a1b2c3"));
    EXPECT_TRUE(is_tool_temporary("sedX9k2Lm"));  // sed -i
    EXPECT_FALSE(is_tool_temporary("data.bin"));
    EXPECT_FALSE(is_tool_temporary(".hidden"));
    EXPECT_FALSE(is_tool_temporary("..a1b2c3"));     // no name before the suffix
    EXPECT_FALSE(is_tool_temporary(".data.a1b2c"));  // five
    EXPECT_FALSE(is_tool_temporary(".data.a1-2c3"));
    EXPECT_FALSE(is_tool_temporary("sed"));
    EXPECT_FALSE(is_tool_temporary("sedimentary"));
    EXPECT_FALSE(is_tool_temporary("frame.000123"));
    EXPECT_FALSE(is_tool_temporary(nullptr));
}
