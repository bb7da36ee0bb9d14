// SPDX-License-Identifier: Apache-2.0
// The steps dyad.fetch and dyad.fetch_many share to serve a file
// (src/service/serve_file.hpp): open beneath the producer directory, lock
// shared without waiting, one fstat under the lock, a regular file.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "service/serve_file.hpp"

using dyad::service::ServedFile;
namespace fs = std::filesystem;

namespace {

class ServeFile : public ::testing::Test {
  protected:
    void SetUp() override {
        tmp_ = fs::temp_directory_path() /
               ("dyad-serve-file-" + std::to_string(::getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(tmp_);
        fs::create_directories(tmp_ / "prod/sub");
        fs::create_directories(tmp_ / "prod/.dyad");
        std::ofstream(tmp_ / "outside.txt") << "secret";
        std::ofstream(tmp_ / "prod/sub/a.txt") << "hello";
        std::ofstream(tmp_ / "prod/.dyad/state") << "x";
        dir_ = (tmp_ / "prod").string();
        dfd_ = ::open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
        ASSERT_GE(dfd_, 0);
    }
    void TearDown() override {
        if (dfd_ >= 0) ::close(dfd_);
        fs::remove_all(tmp_);
    }
    fs::path tmp_;
    std::string dir_;
    int dfd_ = -1;
};

}  // namespace

TEST_F(ServeFile, RegularFileIsTakenWithItsStat) {
    auto f = ServedFile::open(dfd_, dir_, "sub/a.txt");
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    ASSERT_TRUE(f->take().is_ok());
    EXPECT_EQ(f->stat().st_size, 5);
    EXPECT_EQ(f->upath(), "sub/a.txt");
    EXPECT_NE(::fcntl(f->fd(), F_GETFL) & O_NONBLOCK, 0);
    f->make_blocking();
    EXPECT_EQ(::fcntl(f->fd(), F_GETFL) & O_NONBLOCK, 0);
    auto fd = f->release();
    EXPECT_TRUE(fd.valid());
}

TEST_F(ServeFile, OpenSaysWhyNot) {
    auto none = ServedFile::open(dfd_, dir_, "sub/none");
    ASSERT_FALSE(none.is_ok());
    EXPECT_EQ(none.status().err(), ENOENT);
    EXPECT_EQ(none.status().message(), "no file 'sub/none' in producer directory " + dir_);

    fs::create_symlink(tmp_ / "outside.txt", tmp_ / "prod/escape");
    auto out = ServedFile::open(dfd_, dir_, "escape");
    ASSERT_FALSE(out.is_ok());
    EXPECT_EQ(out.status().err(), EACCES);
    EXPECT_NE(out.status().message().find("resolves outside producer directory"),
              std::string::npos);

    // Never into the service's own state, through a link either.
    fs::create_symlink(".dyad", tmp_ / "prod/m");
    auto reserved = ServedFile::open(dfd_, dir_, "m/state");
    ASSERT_FALSE(reserved.is_ok());
    EXPECT_EQ(reserved.status().rc(), DYAD_RC_BADFIO);
}

TEST_F(ServeFile, OnlyRegularFilesAreTaken) {
    auto d = ServedFile::open(dfd_, dir_, "sub");
    ASSERT_TRUE(d.is_ok());
    auto st = d->take();
    EXPECT_EQ(st.err(), EISDIR);
    EXPECT_EQ(st.message(), "'sub' is a directory, not a file");

    // A FIFO opens without waiting for a writer, and is refused.
    ASSERT_EQ(::mkfifo((tmp_ / "prod/fifo").c_str(), 0600), 0);
    auto p = ServedFile::open(dfd_, dir_, "fifo");
    ASSERT_TRUE(p.is_ok());
    st = p->take();
    EXPECT_EQ(st.err(), EINVAL);
    EXPECT_EQ(st.message(), "'fifo' is not a regular file");
}

TEST_F(ServeFile, ALockedFileIsEagainUntilItsProducerLetsGo) {
    // The producer: an exclusive OFD lock on its own open file description.
    int w = ::open((tmp_ / "prod/sub/a.txt").c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(w, 0);
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (::fcntl(w, F_OFD_SETLK, &fl) != 0) {
        ::close(w);
        GTEST_SKIP() << "no OFD locks on this filesystem";
    }
    auto f = ServedFile::open(dfd_, dir_, "sub/a.txt");
    ASSERT_TRUE(f.is_ok());
    auto st = f->take();
    EXPECT_EQ(st.err(), EAGAIN);
    EXPECT_EQ(st.message(), "'sub/a.txt' is locked by its producer");
    ::close(w);  // lets go of its lock
    EXPECT_TRUE(f->take().is_ok());
    // Now the producer waits for the reader.
    w = ::open((tmp_ / "prod/sub/a.txt").c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(w, 0);
    EXPECT_NE(::fcntl(w, F_OFD_SETLK, &fl), 0);
    ::close(w);
}
