// SPDX-License-Identifier: Apache-2.0
// The settings table's checked reads (common/settings.hpp): choices, sizes
// within limits, other libraries' variables. A bad value is an error naming
// the variable (and where it came from), never a silent fallback.
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/settings.hpp"
#include "env_guard.hpp"

using namespace dyad;

TEST(SettingsChoice, TakesTheWordsAndSynonymsAndTheDefault) {
    EnvGuard g;
    unsetenv("DYAD_WRITE_BEHIND");
    EXPECT_EQ(settings::choice("DYAD_WRITE_BEHIND", {"auto", "on", "off"}).value(), "auto");
    g.set("DYAD_WRITE_BEHIND", "off");
    EXPECT_EQ(settings::choice("DYAD_WRITE_BEHIND", {"auto", "on", "off"}).value(), "off");
    g.set("DYAD_WRITE_BEHIND", "1");
    EXPECT_EQ(settings::choice("DYAD_WRITE_BEHIND", {"auto", "on", "off"}, {"1", "0"}).value(),
              "1");
    g.set("DYAD_WRITE_BEHIND", "");  // empty: unset, the default
    EXPECT_EQ(settings::choice("DYAD_WRITE_BEHIND", {"auto", "on", "off"}).value(), "auto");
}

TEST(SettingsChoice, ABadWordIsAnErrorNamingTheVariable) {
    EnvGuard g;
    g.set("DYAD_UCX_PROTO", "rdma");
    auto r = settings::choice("DYAD_UCX_PROTO", {"auto", "tag", "put"}, {}, DYAD_RC_BADDTLMODE);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().rc(), DYAD_RC_BADDTLMODE);
    EXPECT_EQ(r.status().message(), "DYAD_UCX_PROTO='rdma': use auto, tag or put");
    g.set("DYAD_WRITE_BEHIND", "sometimes");
    auto w = settings::choice("DYAD_WRITE_BEHIND", {"auto", "on", "off"}, {"1", "0"});
    ASSERT_FALSE(w.is_ok());
    EXPECT_EQ(w.status().rc(), DYAD_RC_NOCTX);
    EXPECT_EQ(w.status().message(), "DYAD_WRITE_BEHIND='sometimes': use auto, on or off");
}

TEST(SettingsChoice, ABadWordFromTheFileSaysSo) {
    EnvGuard g;
    char path[] = "/tmp/dyad_settings_XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    std::ofstream(path) << "DYAD_UCX_PROTO=rdma\n";
    unsetenv("DYAD_UCX_PROTO");
    g.set("DYAD_CONFIG_FILE", path);
    auto r = settings::choice("DYAD_UCX_PROTO", {"auto", "tag", "put"});
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message(),
              "DYAD_UCX_PROTO='rdma': use auto, tag or put (from DYAD_CONFIG_FILE)");
    unlink(path);
}

TEST(SettingsSize, WithinLimitsOrAnErrorNamingThem) {
    EnvGuard g;
    g.set("DYAD_UCX_WINDOW", "16M");
    EXPECT_EQ(settings::size("DYAD_UCX_WINDOW", 4u << 20, 1ull << 31, "[4M, 2G]").value(),
              16u << 20);
    g.set("DYAD_UCX_WINDOW", "1M");
    auto r = settings::size("DYAD_UCX_WINDOW", 4u << 20, 1ull << 31, "[4M, 2G]");
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message(), "DYAD_UCX_WINDOW=1048576 is outside [4M, 2G]");
    g.set("DYAD_UCX_WINDOW", "big");
    r = settings::size("DYAD_UCX_WINDOW", 4u << 20, 1ull << 31, "[4M, 2G]");
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("DYAD_UCX_WINDOW='big' is not a size"), std::string::npos);
}

TEST(SettingsForeign, OtherLibrariesVariablesAsSet) {
    EnvGuard g;
    unsetenv("UCX_TLS");
    EXPECT_FALSE(settings::foreign("UCX_TLS").has_value());
    g.set("UCX_TLS", "tcp");
    EXPECT_EQ(settings::foreign("UCX_TLS").value(), "tcp");
    g.set("UCX_TLS", "");
    EXPECT_EQ(settings::foreign("UCX_TLS").value(), "");
}
