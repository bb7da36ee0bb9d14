#include <cstdlib>
#include <gtest/gtest.h>

#include "common/config.hpp"

using dyad::Config;

namespace {
struct EnvGuard {
    std::vector<std::string> names;
    void set(const char* n, const char* v) {
        setenv(n, v, 1);
        names.push_back(n);
    }
    ~EnvGuard() {
        for (auto& n : names) unsetenv(n.c_str());
    }
};
}  // namespace

TEST(Config, BooleansParseValues) {
    EXPECT_FALSE(dyad::parse_bool("X", "0").value());
    EXPECT_FALSE(dyad::parse_bool("X", "false").value());
    EXPECT_FALSE(dyad::parse_bool("X", "No").value());
    EXPECT_FALSE(dyad::parse_bool("X", "off").value());
    EXPECT_TRUE(dyad::parse_bool("X", "1").value());
    EXPECT_TRUE(dyad::parse_bool("X", "TRUE").value());
    EXPECT_TRUE(dyad::parse_bool("X", "yes").value());
    EXPECT_TRUE(dyad::parse_bool("X", "").value());
    auto bad = dyad::parse_bool("DYAD_SHARED_STORAGE", "maybe");
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find("DYAD_SHARED_STORAGE"), std::string::npos);
}

TEST(Config, ReadsDyadVariables) {
    EnvGuard g;
    g.set("DYAD_SHARED_STORAGE", "0");
    g.set("DYAD_ASYNC_PUBLISH", "1");
    g.set("DYAD_KEY_DEPTH", "2");
    g.set("DYAD_KEY_BINS", "256");
    g.set("DYAD_DTL_MODE", "stream");
    g.set("DYAD_WAIT_TIMEOUT", "2.5");
    g.set("DYAD_PATH_CONSUMER", "/tmp/c");
    auto c = Config::from_env();
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_FALSE(c->shared_storage);  // DYAD would have turned this on
    EXPECT_TRUE(c->async_publish);
    EXPECT_EQ(c->key_depth, 2u);
    EXPECT_EQ(c->key_bins, 256u);
    EXPECT_EQ(c->dtl_mode, "FLUX_RPC");
    ASSERT_TRUE(c->wait_timeout.has_value());
    EXPECT_DOUBLE_EQ(*c->wait_timeout, 2.5);
    EXPECT_EQ(c->cons_path, "/tmp/c");
}

TEST(Config, RejectsBadValuesWithTheirName) {
    {
        EnvGuard g;
        g.set("DYAD_KEY_BINS", "0");
        auto c = Config::from_env();
        ASSERT_FALSE(c.is_ok());
        EXPECT_NE(c.status().message().find("DYAD_KEY_BINS"), std::string::npos);
    }
    {
        EnvGuard g;
        g.set("DYAD_DTL_MODE", "CARRIER_PIGEON");
        auto c = Config::from_env();
        ASSERT_FALSE(c.is_ok());
        EXPECT_EQ(c.status().rc(), DYAD_RC_BADDTLMODE);
    }
    {
        EnvGuard g;
        g.set("DYAD_WAIT_TIMEOUT", "soon");
        EXPECT_FALSE(Config::from_env().is_ok());
    }
}
