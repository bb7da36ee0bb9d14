// dyad::*fstream_dyad: stream state and DYAD errors, without a service.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <dyad/stream/dyad_stream_api.hpp>

namespace fs = std::filesystem;

class Stream : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("dyad-stream-" + std::to_string(getpid()));
        fs::create_directories(dir_ / "managed");
        setenv("DYAD_PATH_CONSUMER", (dir_ / "managed").c_str(), 1);
        setenv("DYAD_PATH_PRODUCER", (dir_ / "managed").c_str(), 1);
        setenv("DYAD_SERVICE_URI", "tcp://127.0.0.1:1", 1);  // nothing listens there
        setenv("DYAD_WAIT_TIMEOUT", "1", 1);
        dyad_finalize();
    }
    void TearDown() override {
        dyad_finalize();
        for (const char* v :
             {"DYAD_PATH_CONSUMER", "DYAD_PATH_PRODUCER", "DYAD_SERVICE_URI", "DYAD_WAIT_TIMEOUT"})
            unsetenv(v);
        fs::remove_all(dir_);
    }
    fs::path dir_;
};

TEST_F(Stream, FailedConsumeSetsFailbitAndExplains) {
    dyad::ifstream_dyad in((dir_ / "managed" / "x.bin").string());
    EXPECT_TRUE(in.fail());
    EXPECT_FALSE(in.is_open());
    EXPECT_EQ(in.dyad_rc(), DYAD_RC_CONNFAIL);
    EXPECT_NE(in.dyad_error().find("DYAD_SERVICE_URI"), std::string::npos) << in.dyad_error();
}

TEST_F(Stream, UnmanagedFilesAreOrdinaryStreams) {
    auto p = (dir_ / "plain.txt").string();
    {
        dyad::ofstream_dyad out(p);
        out << "hello";
        out.close();
        EXPECT_TRUE(out.good()) << out.dyad_error();
    }
    dyad::ifstream_dyad in(p);
    std::string s;
    in >> s;
    EXPECT_EQ(s, "hello");
    EXPECT_EQ(in.dyad_rc(), DYAD_RC_OK);
}

TEST_F(Stream, FailedProduceSetsFailbitButKeepsTheFile) {
    auto p = (dir_ / "managed" / "out.txt").string();
    dyad::ofstream_dyad out(p);
    out << "data";
    out.close();
    EXPECT_TRUE(out.fail());
    EXPECT_EQ(out.dyad_rc(), DYAD_RC_CONNFAIL);
    std::ifstream check(p);
    std::string s;
    check >> s;
    EXPECT_EQ(s, "data");
}

TEST_F(Stream, NamesOfDyad) {
    static_assert(std::is_same_v<dyad::ifstream, dyad::ifstream_dyad>);
    static_assert(std::is_base_of_v<std::wofstream, dyad::wofstream_dyad>);
    static_assert(std::is_base_of_v<std::fstream, dyad::fstream_dyad>);
    SUCCEED();
}

TEST_F(Stream, ProcessesWithoutARoleUsePlainStreams) {
    auto p = (dir_ / "managed" / "mine.txt").string();
    {
        std::ofstream raw(p);
        raw << "42";
    }
    // Producer only: reading is not consuming.
    unsetenv("DYAD_PATH_CONSUMER");
    dyad_finalize();
    {
        dyad::ifstream_dyad in(p);
        int v = 0;
        in >> v;
        EXPECT_EQ(v, 42) << in.dyad_error();
    }
    // No DYAD at all: both directions are plain streams.
    unsetenv("DYAD_PATH_PRODUCER");
    dyad_finalize();
    {
        dyad::ofstream_dyad out(p);
        out << "43";
        out.close();
        EXPECT_TRUE(out.good()) << out.dyad_error();
        dyad::ifstream_dyad in(p);
        int v = 0;
        in >> v;
        EXPECT_EQ(v, 43);
    }
}
