// SPDX-License-Identifier: Apache-2.0
#include <cstdlib>
#include <set>
#include <utility>
#include <vector>
#include <unistd.h>
#include <gtest/gtest.h>

#include "common/config.hpp"
#include "dtl/dtl.hpp"
#include "env_guard.hpp"

using dyad::Config;

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
    EXPECT_EQ(c->dtl_mode, "stream");  // canonical names come from the table of backends
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
        ASSERT_TRUE(c.is_ok());  // the table of backends judges transports
        auto m = dyad::dtl::canonical_mode(c->dtl_mode);
        ASSERT_FALSE(m.is_ok());
        EXPECT_EQ(m.status().rc(), DYAD_RC_BADDTLMODE);
        EXPECT_NE(m.status().message().find("FLUX_RPC (alias STREAM)"), std::string::npos);
    }
    {
        EnvGuard g;
        g.set("DYAD_WAIT_TIMEOUT", "soon");
        EXPECT_FALSE(Config::from_env().is_ok());
    }
}

// ---- the settings table ----

#include <fstream>

#include "common/settings.hpp"

namespace settings = dyad::settings;

TEST(Settings, EveryEntryIsComplete) {
    std::set<std::string> names;
    for (const auto& s : settings::table()) {
        EXPECT_EQ(std::string(s.name).rfind("DYAD_", 0), 0u) << s.name;
        EXPECT_TRUE(names.insert(s.name).second) << "listed twice: " << s.name;
        EXPECT_NE(std::string(s.readers), "") << s.name;
        EXPECT_NE(std::string(s.meaning), "") << s.name;
    }
    // Every default parses as its own type.
    EXPECT_TRUE(settings::check().is_ok()) << settings::check().to_string();
}

TEST(Settings, BooleansMeanTheSameEverywhere) {
    const std::pair<const char*, bool> cases[] = {
        {"0", false}, {"false", false}, {"no", false}, {"off", false}, {"OFF", false},
        {"1", true},  {"true", true},   {"yes", true}, {"on", true},   {"", true}};
    for (const auto& [text, want] : cases) {
        EnvGuard g;
        g.set("DYAD_OFI_PLACEMENT", text);
        auto b = settings::flag("DYAD_OFI_PLACEMENT");
        ASSERT_TRUE(b.is_ok());
        EXPECT_EQ(b.value(), want) << "'" << text << "'";
    }
    EXPECT_FALSE(settings::flag("DYAD_OFI_PLACEMENT").value());  // default
    EXPECT_TRUE(settings::flag("DYAD_UCX_DIRECT").value());      // default on
}

namespace {
// A configuration file with `text`, removed at the end of the test.
struct ConfFile {
    std::string path;
    explicit ConfFile(const std::string& text) {
        char tmpl[] = "/tmp/dyad-settings-XXXXXX";
        int fd = mkstemp(tmpl);
        EXPECT_GE(fd, 0);
        close(fd);
        path = tmpl;
        std::ofstream(path) << text;
    }
    ~ConfFile() { unlink(path.c_str()); }
};
}  // namespace

TEST(Settings, SourcesInOrderOfPrecedence) {
    ConfFile conf("# a comment\n\nDYAD_KEY_BINS = 77\nDYAD_UCX_WINDOW=1M\n");
    const char* path = conf.path.c_str();
    EnvGuard g;
    EXPECT_EQ(settings::lookup("DYAD_KEY_BINS").source, settings::Source::defaults);
    EXPECT_EQ(settings::lookup("DYAD_PATH_CONSUMER").source, settings::Source::none);
    g.set("DYAD_CONFIG_FILE", path);
    EXPECT_EQ(settings::lookup("DYAD_KEY_BINS").source, settings::Source::file);
    EXPECT_EQ(settings::count("DYAD_KEY_BINS", 1, 1u << 30).value(), 77u);
    EXPECT_EQ(settings::size("DYAD_UCX_WINDOW").value(), 1u << 20);
    g.set("DYAD_KEY_BINS", "99");
    EXPECT_EQ(settings::lookup("DYAD_KEY_BINS").source, settings::Source::env);
    EXPECT_EQ(settings::count("DYAD_KEY_BINS", 1, 1u << 30).value(), 99u);
    auto c = Config::from_env();
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->key_bins, 99u);
}

TEST(Settings, BadFileAndBadValuesNameTheirSource) {
    ConfFile bad_value("DYAD_SERVICE_MEMORY=lots\n");
    EnvGuard g;
    g.set("DYAD_CONFIG_FILE", bad_value.path.c_str());
    auto m = settings::size("DYAD_SERVICE_MEMORY");
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("DYAD_SERVICE_MEMORY"), std::string::npos);
    EXPECT_NE(m.status().message().find("DYAD_CONFIG_FILE"), std::string::npos);
    ConfFile unknown("DYAD_NOT_A_SETTING=1\n");
    g.set("DYAD_CONFIG_FILE", unknown.path.c_str());
    auto u = settings::check();
    ASSERT_FALSE(u.is_ok());
    EXPECT_NE(u.message().find("DYAD_NOT_A_SETTING"), std::string::npos);
    g.set("DYAD_CONFIG_FILE", "/nonexistent/dyad.conf");
    auto missing = settings::check();
    ASSERT_FALSE(missing.is_ok());
    EXPECT_NE(missing.message().find("/nonexistent/dyad.conf"), std::string::npos);
}

TEST(Settings, DescribeListsEverySettingWithItsSource) {
    EnvGuard g;
    g.set("DYAD_MARGO_PROTO", "ofi+shm");
    auto d = settings::describe();
    ASSERT_EQ(d.size(), settings::table().size());
    bool seen = false;
    for (const auto& s : d)
        if (s["name"] == "DYAD_MARGO_PROTO") {
            EXPECT_EQ(s["value"], "ofi+shm");
            EXPECT_EQ(s["source"], "env");
            seen = true;
        }
    EXPECT_TRUE(seen);
    EXPECT_NE(settings::markdown().find("`DYAD_MARGO_PROTO`"), std::string::npos);
}

TEST(Backends, TableCanonicalizesNamesAndAliases) {
    EXPECT_EQ(dyad::dtl::canonical_mode("stream").value(), "FLUX_RPC");
    EXPECT_EQ(dyad::dtl::canonical_mode("auto").value(), "AUTO");
    EXPECT_EQ(dyad::dtl::canonical_mode("local").value(), "LOCAL");
    EXPECT_EQ(dyad::dtl::universal_backend().name, "FLUX_RPC");
    EXPECT_LT(dyad::dtl::preference("LOCAL"), dyad::dtl::preference("FLUX_RPC"));
    for (const auto& b : dyad::dtl::backends()) {
        EXPECT_EQ(dyad::dtl::canonical_mode(b.name).value(), b.name);
        for (const auto& a : b.aliases) EXPECT_EQ(dyad::dtl::canonical_mode(a).value(), b.name);
    }
}

TEST(Settings, EachProgramChecksOnlyWhatItReads) {
    EnvGuard g;
    g.set("DYAD_SERVICE_MEMORY", "lots");  // dyadd's: a client does not care
    EXPECT_TRUE(Config::from_env().is_ok());
    EXPECT_FALSE(settings::check("dyadd").is_ok());
    g.set("DYAD_TRANSFER_TIMEOUT", "soon");  // a client's: dyadd does not care
    EXPECT_FALSE(Config::from_env().is_ok());
}

TEST(Config, CacheAndOriginSettings) {
    {
        EnvGuard g;
        auto c = Config::from_env();
        ASSERT_TRUE(c.is_ok()) << c.status().to_string();
        EXPECT_EQ(c->cache_capacity, 0u);  // upstream's defaults
        EXPECT_EQ(c->cache_policy, "LRU");
        EXPECT_DOUBLE_EQ(c->cache_low_watermark, 0.8);
        EXPECT_DOUBLE_EQ(c->cache_grace_period, 5);
        EXPECT_TRUE(c->path_origin.empty());
        EXPECT_FALSE(c->origin_publish);
        EXPECT_EQ(c->fetch_worker_threads, 0u);
        EXPECT_EQ(c->consume_window, 16u);
    }
    {
        EnvGuard g;
        g.set("DYAD_CACHE_CAPACITY", "4M");
        g.set("DYAD_CACHE_POLICY", "fifo");
        g.set("DYAD_CACHE_LOW_WATERMARK", "0.5");
        g.set("DYAD_CACHE_GRACE_PERIOD", "0");
        g.set("DYAD_PATH_ORIGIN", "/lustre/set");
        g.set("DYAD_PATH_PRODUCER", "/tmp/p");
        g.set("DYAD_ORIGIN_PUBLISH", "1");
        g.set("DYAD_FETCH_WORKER_THREADS", "32");
        auto c = Config::from_env();
        ASSERT_TRUE(c.is_ok()) << c.status().to_string();
        EXPECT_EQ(c->cache_capacity, 4u << 20);
        EXPECT_EQ(c->cache_policy, "FIFO");
        EXPECT_DOUBLE_EQ(c->cache_low_watermark, 0.5);
        EXPECT_DOUBLE_EQ(c->cache_grace_period, 0);
        EXPECT_EQ(c->path_origin, "/lustre/set");
        EXPECT_TRUE(c->origin_publish);
        EXPECT_EQ(c->consume_window, 32u);  // the worker pool's nearest setting
        auto j = c->to_json();
        EXPECT_EQ(j["DYAD_CACHE_POLICY"], "FIFO");
        EXPECT_EQ(j["DYAD_FETCH_WORKER_THREADS"], 32);
    }
    {
        EnvGuard g;  // an explicit window wins over the worker count
        g.set("DYAD_FETCH_WORKER_THREADS", "32");
        g.set("DYAD_CONSUME_WINDOW", "4");
        EXPECT_EQ(Config::from_env()->consume_window, 4u);
    }
    for (auto [name, value] : std::vector<std::pair<const char*, const char*>>{
             {"DYAD_CACHE_POLICY", "LFU"},
             {"DYAD_CACHE_LOW_WATERMARK", "0"},
             {"DYAD_CACHE_LOW_WATERMARK", "1.5"},
             {"DYAD_CACHE_CAPACITY", "lots"},
             {"DYAD_CACHE_GRACE_PERIOD", "-1"},
             {"DYAD_ORIGIN_PUBLISH", "1"}}) {  // without DYAD_PATH_ORIGIN
        EnvGuard g;
        g.set(name, value);
        auto c = Config::from_env();
        ASSERT_FALSE(c.is_ok()) << name << "=" << value;
        EXPECT_NE(c.status().message().find(name), std::string::npos) << c.status().message();
    }
}
