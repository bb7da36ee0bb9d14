// SPDX-License-Identifier: Apache-2.0
// The transports' settings (dtl/options.hpp), read once from the settings
// table and handed to each component; and the table of backends' names.
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <dyad/common/dyad_dtl.h>

#include "dtl/dtl.hpp"
#include "dtl/options.hpp"
#include "env_guard.hpp"

using namespace dyad;
using namespace dyad::dtl;

TEST(DtlOptions, Defaults) {
    for (const char* n : {"DYAD_UCX_PROTO", "DYAD_UCX_WINDOW", "DYAD_STREAM_SENDFILE",
                          "DYAD_UCX_EP_CACHE_SIZE", "DYAD_UCX_DIRECT", "DYAD_UCX_SHARED_MEMORY",
                          "DYAD_MARGO_PROTO", "DYAD_OFI_PLACEMENT", "DYAD_WRITE_BEHIND"})
        unsetenv(n);
    auto u = UcxConsumerOptions::from_settings();
    ASSERT_TRUE(u.is_ok());
    EXPECT_EQ(u->proto, "auto");
    EXPECT_EQ(u->window, 64u << 20);
    EXPECT_TRUE(u->write_behind.on.is_ok());
    auto s = UcxServiceOptions::from_settings();
    ASSERT_TRUE(s.is_ok());
    EXPECT_EQ(s->ep_cache, 64u);
    EXPECT_TRUE(s->direct);
    EXPECT_FALSE(s->shared_memory);
    auto o = OfiOptions::from_settings();
    ASSERT_TRUE(o.is_ok());
    EXPECT_EQ(o->proto, "ofi+tcp");
    EXPECT_FALSE(o->placement);
    auto st = StreamOptions::from_settings();
    ASSERT_TRUE(st.is_ok());
    EXPECT_FALSE(st->sendfile);
}

TEST(DtlOptions, BadValuesAreErrorsNamingTheVariable) {
    EnvGuard g;
    g.set("DYAD_UCX_PROTO", "rdma");
    auto u = UcxConsumerOptions::from_settings();
    ASSERT_FALSE(u.is_ok());
    EXPECT_EQ(u.status().rc(), DYAD_RC_BADDTLMODE);
    EXPECT_EQ(u.status().message(), "DYAD_UCX_PROTO='rdma': use auto, tag or put");
    g.set("DYAD_UCX_PROTO", "put");
    g.set("DYAD_UCX_WINDOW", "1M");
    u = UcxConsumerOptions::from_settings();
    ASSERT_FALSE(u.is_ok());
    EXPECT_EQ(u.status().message(),
              "DYAD_UCX_WINDOW=1048576 is outside [4M, 2G] (at least one 4 MiB chunk)");
    g.set("DYAD_UCX_WINDOW", "8M");
    u = UcxConsumerOptions::from_settings();
    ASSERT_TRUE(u.is_ok());
    EXPECT_EQ(u->proto, "put");
    EXPECT_EQ(u->window, 8u << 20);
    g.set("DYAD_UCX_EP_CACHE_SIZE", "0");
    EXPECT_FALSE(UcxServiceOptions::from_settings().is_ok());
}

TEST(DtlOptions, WriteBehindKeepsItsErrorForTheFilesThatUseIt) {
    EnvGuard g;
    g.set("DYAD_WRITE_BEHIND", "sometimes");
    auto w = WriteBehindOption::from_settings();
    ASSERT_FALSE(w.on.is_ok());
    EXPECT_EQ(w.on.status().message(), "DYAD_WRITE_BEHIND='sometimes': use auto, on or off");
    // The transports are still made: only files written behind fail.
    EXPECT_TRUE(StreamOptions::from_settings().is_ok());
    for (const char* v : {"on", "1"}) {
        g.set("DYAD_WRITE_BEHIND", v);
        EXPECT_TRUE(WriteBehindOption::from_settings().on.value()) << v;
    }
    for (const char* v : {"off", "0"}) {
        g.set("DYAD_WRITE_BEHIND", v);
        EXPECT_FALSE(WriteBehindOption::from_settings().on.value()) << v;
    }
}

TEST(DtlNames, TheTableNamesEveryTransportOnce) {
    EXPECT_STREQ(name_of(Kind::stream), "FLUX_RPC");
    EXPECT_STREQ(name_of(Kind::local), "LOCAL");
    EXPECT_EQ(aliases_of(Kind::stream), std::vector<std::string>{"STREAM"});
    EXPECT_STREQ(name_of_dyad_mode(DYAD_DTL_UCX), "UCX");
    EXPECT_STREQ(name_of_dyad_mode(DYAD_DTL_MARGO), "MARGO");
    EXPECT_STREQ(name_of_dyad_mode(DYAD_DTL_FLUX_RPC), "FLUX_RPC");
    EXPECT_EQ(name_of_dyad_mode(7), nullptr);
    for (const auto& b : backends()) {
        EXPECT_EQ(b.name, name_of(b.kind));
        EXPECT_EQ(b.aliases, aliases_of(b.kind));
        // (Not the plugin's: loading it here would bring a second DYAD.)
        if (b.kind != Kind::ofi) {
            EXPECT_EQ(b.attributes().name, b.name);
        }
    }
}

TEST(DtlNames, AttributesReplaceNameComparisons) {
    EXPECT_TRUE(is_local("LOCAL"));
    EXPECT_TRUE(is_local("local"));
    EXPECT_FALSE(is_local("FLUX_RPC"));
    EXPECT_FALSE(is_local("nonsense"));
    // No transport is serialised per process any more: UCX runs a lane per
    // fetch (ucx/receiver.cpp), MARGO concurrent receives with tokens
    // (ofi_receiver.cpp); the concurrency tests are in test_ucx.py and
    // test_ofi.py.
}

// Upstream DYAD's DYAD_MARGO_PROTO values are Mercury's names: the ones a
// libfabric provider serves map to ours, the others keep their value (and
// the transport refuses them, saying why: mercury_only_advice).
TEST(DtlOptions, MercuryProtocolNames) {
    const std::vector<std::pair<std::string, std::string>> mapped = {
        {"sm", "ofi+shm"},          {"na+sm", "ofi+shm"},
        {"na+sm://", "ofi+shm"},    {"tcp", "ofi+tcp"},
        {"ofi+tcp", "ofi+tcp"},     {"ofi+tcp;ofi_rxm", "ofi+tcp"},
        {"OFI+TCP://", "ofi+tcp"},  {"verbs;ofi_rxm", "ofi+verbs"},
        {"ofi+verbs", "ofi+verbs"}, {"sockets", "ofi+sockets"},
        {"cxi", "ofi+cxi"},         {"ofi+shm", "ofi+shm"},
    };
    for (const auto& [given, ours] : mapped) {
        EXPECT_EQ(margo_protocol(given), ours) << given;
        EXPECT_EQ(mercury_only_advice(given), "") << given;
    }
    // Unknown libfabric names pass through for the transport's own error.
    EXPECT_EQ(margo_protocol("ofi+nosuch"), "ofi+nosuch");
    EXPECT_EQ(mercury_only_advice("ofi+nosuch"), "");
    for (const char* only : {"ucx", "ucx+tcp", "ucx+all", "ucx+rc_mlx5", "bmi+tcp", "mpi+static",
                             "na+bmi", "ofi+tcp://10.0.0.1:5000"}) {
        EXPECT_NE(mercury_only_advice(margo_protocol(only)), "") << only;
        const std::string kept = margo_protocol(only);  // never one of ours
        EXPECT_FALSE(kept.rfind("ofi+", 0) == 0 && kept.find("://") == std::string::npos) << only;
    }
    EXPECT_NE(mercury_only_advice("ucx+tcp").find("DYAD_DTL_MODE=UCX with UCX_TLS=tcp"),
              std::string::npos);
    EXPECT_EQ(mercury_only_advice("ucx+all").find("UCX_TLS"), std::string::npos);
    EXPECT_NE(mercury_only_advice("ofi+tcp://10.0.0.1:5000").find("drop the '://10.0.0.1:5000'"),
              std::string::npos);
}

TEST(DtlOptions, MargoProtoSettingIsMapped) {
    EnvGuard g;
    g.set("DYAD_MARGO_PROTO", "na+sm");
    auto o = OfiOptions::from_settings();
    ASSERT_TRUE(o.is_ok());
    EXPECT_EQ(o->proto, "ofi+shm");
}
