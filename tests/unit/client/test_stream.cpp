// SPDX-License-Identifier: Apache-2.0
// dyad::*fstream_dyad and dyad::dyad_stream_core: stream state, DYAD errors,
// roles, paths and locks, without a service.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>
#include <type_traits>
#include <utility>

#include <dyad/stream/dyad_params.hpp>
#include <dyad/stream/dyad_stream_api.hpp>
#include <dyad/stream/dyad_stream_core.hpp>

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
             {"DYAD_PATH_CONSUMER", "DYAD_PATH_PRODUCER", "DYAD_SERVICE_URI", "DYAD_WAIT_TIMEOUT",
              "DYAD_FSYNC_WRITE", "DYAD_PATH_RELATIVE", "DYAD_KEY_BINS"})
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

// get_stream(): the std stream of a DYAD stream, as upstream's demo uses it.
TEST_F(Stream, GetStreamWritesAndReadsThroughTheStdStreams) {
    auto p = (dir_ / "plain.bin").string();
    const int32_t vals[4] = {7, -1, 1 << 30, 42};
    {
        dyad::ofstream_dyad ofs_dyad;
        ofs_dyad.open(p, std::ofstream::out | std::ios::binary);
        std::ofstream& ofs = ofs_dyad.get_stream();
        EXPECT_EQ(static_cast<void*>(&ofs), static_cast<void*>(&ofs_dyad));
        ofs.write(reinterpret_cast<const char*>(vals), sizeof vals);
        EXPECT_TRUE(ofs.good());
        ofs_dyad.close();
        EXPECT_TRUE(ofs_dyad.good()) << ofs_dyad.dyad_error();
        EXPECT_FALSE(ofs.is_open());
    }
    dyad::ifstream_dyad ifs_dyad;
    ifs_dyad.open(p, std::ifstream::in | std::ios::binary);
    std::ifstream& ifs = ifs_dyad.get_stream();
    int32_t back[4] = {0, 0, 0, 0};
    ifs.read(reinterpret_cast<char*>(back), sizeof back);
    EXPECT_EQ(ifs.gcount(), static_cast<std::streamsize>(sizeof back));
    for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], vals[i]) << i;
    ifs_dyad.close();
    EXPECT_FALSE(ifs_dyad.is_open());
    EXPECT_EQ(ifs_dyad.dyad_rc(), DYAD_RC_OK);
}

TEST_F(Stream, GetStreamTypesAreTheStdStreams) {
    static_assert(std::is_same_v<decltype(std::declval<dyad::ifstream_dyad&>().get_stream()),
                                 std::ifstream&>);
    static_assert(std::is_same_v<decltype(std::declval<dyad::ofstream_dyad&>().get_stream()),
                                 std::ofstream&>);
    static_assert(
        std::is_same_v<decltype(std::declval<dyad::fstream_dyad&>().get_stream()), std::fstream&>);
    static_assert(std::is_same_v<decltype(std::declval<dyad::wifstream_dyad&>().get_stream()),
                                 std::wifstream&>);
    static_assert(std::is_same_v<decltype(std::declval<const dyad::ofstream_dyad&>().get_stream()),
                                 const std::ofstream&>);
    SUCCEED();
}

// With DYAD inert (no managed directory), even paths in the would-be managed
// directory are plain files, also through get_stream().
TEST_F(Stream, GetStreamWithDyadInertPassesThrough) {
    unsetenv("DYAD_PATH_CONSUMER");
    unsetenv("DYAD_PATH_PRODUCER");
    dyad_finalize();
    auto p = (dir_ / "managed" / "inert.txt").string();
    {
        dyad::fstream_dyad fs(p, std::ios::out | std::ios::trunc);
        fs.get_stream() << "abc 12";
        fs.close();
        EXPECT_TRUE(fs.good()) << fs.dyad_error();
    }
    {
        dyad::fstream_dyad fs(p, std::ios::in | std::ios::out);
        ASSERT_TRUE(fs.is_open()) << fs.dyad_error();
        std::fstream& raw = fs.get_stream();
        std::string s;
        int n = 0;
        raw >> s >> n;
        EXPECT_EQ(s, "abc");
        EXPECT_EQ(n, 12);
    }
    dyad::ifstream_dyad in(p);
    std::string s;
    in.get_stream() >> s;
    EXPECT_EQ(s, "abc");
    EXPECT_EQ(in.dyad_rc(), DYAD_RC_OK);
}

TEST_F(Stream, MovedStreamsKeepTheirFileAndPublishOnce) {
    auto p = (dir_ / "moved.txt").string();
    dyad::ofstream_dyad a(p);
    a << "one";
    dyad::ofstream_dyad b(std::move(a));
    EXPECT_FALSE(a.is_open());
    EXPECT_TRUE(b.is_open());
    b << " two";
    dyad::ofstream_dyad c;
    c = std::move(b);
    c.close();
    EXPECT_TRUE(c.good()) << c.dyad_error();
    dyad::ifstream_dyad in1(p);
    dyad::ifstream_dyad in2;
    swap(in1, in2);
    EXPECT_FALSE(in1.is_open());
    std::string s1, s2;
    in2 >> s1 >> s2;
    EXPECT_EQ(s1 + " " + s2, "one two");
}

// A stream given a core uses it: here one configured with dyad_params.
TEST_F(Stream, StreamsTakeACoreInitialisedWithParams) {
    dyad::dyad_params params;
    params.m_prod_managed_path = (dir_ / "managed").string();
    params.m_dtl_mode = 2;  // FLUX_RPC: in every build
    dyad::dyad_stream_core core;
    core.init(params);
    EXPECT_EQ(core.dyad_rc(), DYAD_RC_OK) << core.dyad_error();
    dyad::ofstream_dyad out(core);
    EXPECT_TRUE(out.core().chk_initialized());
    EXPECT_TRUE(out.core().is_dyad_producer());
    EXPECT_FALSE(out.core().is_dyad_consumer());
    auto p = (dir_ / "with-core.txt").string();  // not managed: no service needed
    out.open(p);
    out << "x";
    out.close();
    EXPECT_TRUE(out.good()) << out.dyad_error();

    dyad::ifstream_dyad in;
    dyad::dyad_stream_core blank;
    in.init(blank);  // counts as initialised: no initialisation from the environment
    EXPECT_TRUE(in.core().chk_initialized());
    EXPECT_FALSE(in.core().is_dyad_consumer());
    in.open(p);
    std::string s;
    in >> s;
    EXPECT_EQ(s, "x");
}

// dyad::dyad_stream_core on its own.
class StreamCore : public Stream {};

TEST_F(StreamCore, ParamsHaveTheOriginalDefaults) {
    dyad::dyad_params p;
    EXPECT_FALSE(p.m_debug);
    EXPECT_FALSE(p.m_shared_storage);
    EXPECT_FALSE(p.m_reinit);
    EXPECT_FALSE(p.m_async_publish);
    EXPECT_FALSE(p.m_fsync_write);
    EXPECT_EQ(p.m_key_depth, 2u);
    EXPECT_EQ(p.m_key_bins, 256u);
    EXPECT_EQ(p.m_service_mux, 1u);
    EXPECT_EQ(p.m_dtl_mode, 0);
    EXPECT_TRUE(p.m_kvs_namespace.empty());
    EXPECT_TRUE(p.m_cons_managed_path.empty());
    EXPECT_TRUE(p.m_prod_managed_path.empty());
    EXPECT_FALSE(p.m_relative_to_managed_path);
}

TEST_F(StreamCore, RolesFollowTheEnvironment) {
    dyad::dyad_stream_core core;
    EXPECT_FALSE(core.chk_initialized());
    EXPECT_FALSE(core.is_dyad_producer());
    EXPECT_FALSE(core.is_dyad_consumer());
    core.init();
    EXPECT_TRUE(core.chk_initialized());
    EXPECT_EQ(core.dyad_rc(), DYAD_RC_OK) << core.dyad_error();
    EXPECT_NE(dyad_ctx_get(), nullptr);
    EXPECT_TRUE(core.is_dyad_producer());
    EXPECT_TRUE(core.is_dyad_consumer());
    EXPECT_FALSE(core.chk_fsync_write());

    unsetenv("DYAD_PATH_CONSUMER");
    setenv("DYAD_FSYNC_WRITE", "1", 1);
    core.init();  // already initialised: nothing read
    EXPECT_TRUE(core.is_dyad_consumer());
    core.init(true);
    EXPECT_TRUE(core.is_dyad_producer());
    EXPECT_FALSE(core.is_dyad_consumer());
    EXPECT_TRUE(core.chk_fsync_write());

    unsetenv("DYAD_PATH_PRODUCER");
    dyad::dyad_stream_core fresh;
    fresh.init();
    EXPECT_FALSE(fresh.is_dyad_producer());
    EXPECT_FALSE(fresh.is_dyad_consumer());

    core.finalize();
    EXPECT_FALSE(core.chk_initialized());
    EXPECT_FALSE(core.is_dyad_producer());
    core.set_initialized();
    EXPECT_TRUE(core.chk_initialized());
}

TEST_F(StreamCore, RolesFollowTheParams) {
    dyad::dyad_params p;
    p.m_cons_managed_path = (dir_ / "managed").string();
    p.m_fsync_write = true;
    p.m_dtl_mode = -1;  // not a transport number: DYAD_DTL_MODE from the environment
    dyad::dyad_stream_core core;
    core.init(p);
    EXPECT_EQ(core.dyad_rc(), DYAD_RC_OK) << core.dyad_error();
    EXPECT_TRUE(core.chk_initialized());
    EXPECT_TRUE(core.is_dyad_consumer());
    EXPECT_FALSE(core.is_dyad_producer());
    EXPECT_TRUE(core.chk_fsync_write());
}

TEST_F(StreamCore, OpenAndCloseSyncPassUnmanagedPaths) {
    dyad::dyad_stream_core core;  // not initialised: open_sync initialises it
    auto outside = (dir_ / "elsewhere.txt").string();
    EXPECT_TRUE(core.open_sync(outside.c_str())) << core.dyad_error();
    EXPECT_TRUE(core.chk_initialized());
    EXPECT_EQ(core.dyad_rc(), DYAD_RC_OK);
    EXPECT_TRUE(core.close_sync(outside.c_str())) << core.dyad_error();
    EXPECT_TRUE(core.open_sync(""));
    EXPECT_TRUE(core.open_sync(nullptr));

    // A managed path needs the service, which is not there.
    auto managed = (dir_ / "managed" / "m.txt").string();
    EXPECT_FALSE(core.open_sync(managed.c_str()));
    EXPECT_EQ(core.dyad_rc(), DYAD_RC_CONNFAIL);
    EXPECT_NE(core.dyad_error().find("DYAD_SERVICE_URI"), std::string::npos) << core.dyad_error();
    EXPECT_TRUE(core.open_sync(outside.c_str()));
    EXPECT_EQ(core.dyad_rc(), DYAD_RC_OK);
    EXPECT_TRUE(core.dyad_error().empty());

    // The process's context torn down: initialised again on the next call.
    dyad_finalize();
    EXPECT_TRUE(core.open_sync(outside.c_str())) << core.dyad_error();
    EXPECT_NE(dyad_ctx_get(), nullptr);
}

TEST_F(StreamCore, InertDyadPassesEverything) {
    unsetenv("DYAD_PATH_CONSUMER");
    unsetenv("DYAD_PATH_PRODUCER");
    dyad_finalize();
    dyad::dyad_stream_core core;
    core.init();
    auto managed = (dir_ / "managed" / "m.txt").string();
    EXPECT_TRUE(core.open_sync(managed.c_str())) << core.dyad_error();
    EXPECT_TRUE(core.close_sync(managed.c_str())) << core.dyad_error();
    EXPECT_EQ(core.dyad_rc(), DYAD_RC_OK);
}

TEST_F(StreamCore, BadSettingsFailOnlyTheRoleTheyConcern) {
    setenv("DYAD_KEY_BINS", "many", 1);  // dyad_init_env refuses it
    unsetenv("DYAD_PATH_PRODUCER");
    dyad::dyad_stream_core core;
    core.init();
    EXPECT_TRUE(DYAD_IS_ERROR(core.dyad_rc()));
    EXPECT_EQ(dyad_ctx_get(), nullptr);
    auto managed = (dir_ / "managed" / "m.txt").string();
    EXPECT_FALSE(core.open_sync(managed.c_str()));  // a consumer that cannot consume
    EXPECT_NE(core.dyad_error().find("DYAD_KEY_BINS"), std::string::npos) << core.dyad_error();
    EXPECT_TRUE(core.close_sync(managed.c_str()));  // not a producer: a plain file
}

TEST_F(StreamCore, CanonicalPathPrefix) {
    fs::create_directories(dir_ / "managed" / "sub");
    fs::create_directories(dir_ / "other");
    fs::create_directory_symlink(dir_ / "managed", dir_ / "link");
    dyad::dyad_stream_core core;
    core.init();
    auto m = (dir_ / "managed").string();

    EXPECT_TRUE(core.cmp_canonical_path_prefix(true, (m + "/sub/a.bin").c_str()));
    EXPECT_EQ(core.get_upath(), "sub/a.bin");
    EXPECT_TRUE(core.cmp_canonical_path_prefix(false, (m + "/./sub//../b.bin").c_str()));
    EXPECT_EQ(core.get_upath(), "b.bin");
    EXPECT_TRUE(core.cmp_canonical_path_prefix(true, (dir_ / "link" / "c.bin").c_str()));
    EXPECT_EQ(core.get_upath(), "c.bin");

    EXPECT_FALSE(core.cmp_canonical_path_prefix(true, m.c_str()));
    EXPECT_TRUE(core.get_upath().empty());
    EXPECT_FALSE(core.cmp_canonical_path_prefix(true, (dir_ / "other" / "x").c_str()));
    EXPECT_FALSE(core.cmp_canonical_path_prefix(true, (m + "/../other/x").c_str()));
    EXPECT_FALSE(core.cmp_canonical_path_prefix(true, (m + "-not/x").c_str()));
    EXPECT_FALSE(core.cmp_canonical_path_prefix(true, "relative.bin"));
    EXPECT_FALSE(core.cmp_canonical_path_prefix(true, ""));

    // The managed directory given through a symbolic link.
    setenv("DYAD_PATH_PRODUCER", (dir_ / "link").c_str(), 1);
    core.init(true);
    EXPECT_TRUE(core.cmp_canonical_path_prefix(true, (m + "/sub/d.bin").c_str()));
    EXPECT_EQ(core.get_upath(), "sub/d.bin");

    // Relative paths, relative to the managed directory.
    setenv("DYAD_PATH_RELATIVE", "1", 1);
    core.init(true);
    EXPECT_TRUE(core.cmp_canonical_path_prefix(false, "sub/e.bin"));
    EXPECT_EQ(core.get_upath(), "sub/e.bin");
    EXPECT_FALSE(core.cmp_canonical_path_prefix(false, "../e.bin"));
    unsetenv("DYAD_PATH_RELATIVE");

    // No consumer directory: nothing is consumer-managed.
    unsetenv("DYAD_PATH_CONSUMER");
    core.init(true);
    EXPECT_FALSE(core.cmp_canonical_path_prefix(false, (m + "/f.bin").c_str()));
}

namespace {
// From a child process (so that its locks are its own whatever their kind):
// whether a non-blocking lock of `type` on `path` would be granted now.
bool child_could_lock(const std::string& path, short type) {
    pid_t pid = fork();
    if (pid == 0) {
        int fd = ::open(path.c_str(), O_RDWR);
        struct flock fl;
        std::memset(&fl, 0, sizeof fl);
        fl.l_type = type;
        fl.l_whence = SEEK_SET;
        _exit(fd >= 0 && ::fcntl(fd, F_SETLK, &fl) == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
}  // namespace

TEST_F(StreamCore, SharedLocksAreShared) {
    auto p = (dir_ / "locked.bin").string();
    { std::ofstream(p) << "data"; }
    dyad::dyad_stream_core core;
    int fd1 = ::open(p.c_str(), O_RDWR);
    int fd2 = ::open(p.c_str(), O_RDONLY);
    ASSERT_GE(fd1, 0);
    ASSERT_GE(fd2, 0);
    EXPECT_EQ(core.file_lock_shared(fd1), DYAD_RC_OK);
    // A second shared lock, on another open of the file, is granted at once
    // (an exclusive one would wait for the first: bounded here, then released).
    std::promise<int> second;
    auto granted = second.get_future();
    std::thread t([&] { second.set_value(core.file_lock_shared(fd2)); });
    bool in_time = granted.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    if (!in_time) core.file_unlock(fd1);
    t.join();
    EXPECT_TRUE(in_time) << "the second shared lock waited for the first";
    EXPECT_EQ(granted.get(), DYAD_RC_OK);
    // Readers share, writers wait.
    EXPECT_TRUE(child_could_lock(p, F_RDLCK));
    EXPECT_FALSE(child_could_lock(p, F_WRLCK));
    EXPECT_EQ(core.file_unlock(fd1), DYAD_RC_OK);
    EXPECT_EQ(core.file_unlock(fd2), DYAD_RC_OK);
    EXPECT_TRUE(child_could_lock(p, F_WRLCK));

    EXPECT_EQ(core.file_lock_exclusive(fd1), DYAD_RC_OK);
    EXPECT_FALSE(child_could_lock(p, F_RDLCK));
    EXPECT_EQ(core.file_unlock(fd1), DYAD_RC_OK);
    EXPECT_TRUE(child_could_lock(p, F_RDLCK));
    ::close(fd1);
    ::close(fd2);

    errno = 0;
    EXPECT_EQ(core.file_lock_shared(-1), DYAD_RC_BADFIO);
    EXPECT_EQ(errno, EBADF);
}
