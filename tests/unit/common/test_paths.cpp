// SPDX-License-Identifier: Apache-2.0
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/paths.hpp"

namespace fs = std::filesystem;
using dyad::ManagedDir;
using dyad::normalize_upath;

TEST(Paths, NormalizeRefusesEscapes) {
    EXPECT_EQ(normalize_upath("a//./b").value(), "a/b");
    EXPECT_FALSE(normalize_upath("../x").is_ok());
    EXPECT_FALSE(normalize_upath("a/../../x").is_ok());
    EXPECT_FALSE(normalize_upath("/etc/passwd").is_ok());
    EXPECT_FALSE(normalize_upath("").is_ok());
    EXPECT_FALSE(normalize_upath(".").is_ok());
}

TEST(Paths, Utf8IsCheckedAndTheRefusalShowsTheBytes) {
    using dyad::valid_utf8;
    EXPECT_TRUE(valid_utf8("plain/ascii.txt"));
    EXPECT_TRUE(valid_utf8("caf\xc3\xa9/\xe2\x82\xac/\xf0\x9f\x98\x80"));  // e-acute, euro, emoji
    EXPECT_TRUE(valid_utf8("\xf4\x8f\xbf\xbf"));                           // U+10FFFF
    EXPECT_FALSE(valid_utf8("caf\xe9"));                                   // Latin-1
    EXPECT_FALSE(valid_utf8("\x80"));                                      // continuation
    EXPECT_FALSE(valid_utf8("\xc0\xaf"));                                  // overlong '/'
    EXPECT_FALSE(valid_utf8("\xe0\x80\xaf"));                              // overlong
    EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));                              // surrogate
    EXPECT_FALSE(valid_utf8("\xf4\x90\x80\x80"));                          // past U+10FFFF
    EXPECT_FALSE(valid_utf8("\xe2\x82"));                                  // cut short
    EXPECT_FALSE(valid_utf8("\xff"));
    auto r = normalize_upath("dir/caf\xe9.bin");
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().err(), EILSEQ);
    EXPECT_NE(r.status().message().find("'dir/caf\\xE9.bin' is not UTF-8"), std::string::npos)
        << r.status().message();
    EXPECT_TRUE(valid_utf8(r.status().message()));  // a message JSON can carry
}

TEST(Paths, ManagedMatchingIsOnComponents) {
    auto tmp = fs::temp_directory_path() / ("dyad-paths-" + std::to_string(getpid()));
    fs::create_directories(tmp / "dir");
    fs::create_directories(tmp / "dir2");
    ManagedDir m((tmp / "dir").string());
    EXPECT_EQ(m.relative((tmp / "dir/a/b.txt").string(), false).value(), "a/b.txt");
    EXPECT_FALSE(m.relative((tmp / "dir2/x").string(), false).has_value());
    EXPECT_FALSE(m.relative((tmp / "dir").string(), false).has_value());
    EXPECT_EQ(m.relative((tmp / "dir/./sub/../f").string(), false).value(), "f");
    // Through a symlink to the managed directory.
    fs::create_directory_symlink(tmp / "dir", tmp / "link");
    EXPECT_EQ(m.relative((tmp / "link/f").string(), false).value(), "f");
    // Relative mode.
    EXPECT_EQ(m.relative("x/y", true).value(), "x/y");
    EXPECT_FALSE(m.relative("x/y", false).has_value() && false);
    fs::remove_all(tmp);
}

TEST(Paths, OpenBeneathRefusesSymlinkEscapes) {
    auto tmp = fs::temp_directory_path() / ("dyad-beneath-" + std::to_string(getpid()));
    fs::create_directories(tmp / "prod/sub");
    std::ofstream(tmp / "outside.txt") << "secret";
    std::ofstream(tmp / "prod/sub/in.txt") << "ok";
    fs::create_symlink(tmp / "outside.txt", tmp / "prod/escape");
    fs::create_symlink("sub/in.txt", tmp / "prod/inside");
    int dfd = ::open((tmp / "prod").c_str(), O_PATH | O_DIRECTORY);
    ASSERT_GE(dfd, 0);
    EXPECT_TRUE(dyad::open_beneath(dfd, "sub/in.txt", O_RDONLY).is_ok());
    EXPECT_TRUE(dyad::open_beneath(dfd, "inside", O_RDONLY).is_ok());
    auto bad = dyad::open_beneath(dfd, "escape", O_RDONLY);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().err(), EXDEV);
    ::close(dfd);
    fs::remove_all(tmp);
}

TEST(Paths, DirBeneathFollowsNoLinkAndNamesTheOne) {
    auto tmp = fs::temp_directory_path() / ("dyad-dirbeneath-" + std::to_string(getpid()));
    fs::create_directories(tmp / "cons/run1");
    fs::create_directories(tmp / "elsewhere");
    fs::create_symlink(tmp / "elsewhere", tmp / "cons/run1/x");
    fs::create_symlink("run1", tmp / "cons/alias");  // stays inside: refused all the same
    std::ofstream(tmp / "cons/plain") << "f";
    int dfd = ::open((tmp / "cons").c_str(), O_PATH | O_DIRECTORY);
    ASSERT_GE(dfd, 0);
    auto made = dyad::dir_beneath(dfd, "a/b/c", true, 0755);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    EXPECT_TRUE(fs::is_directory(tmp / "cons/a/b/c"));
    EXPECT_FALSE(dyad::dir_beneath(dfd, "d/e", false, 0755).is_ok());
    EXPECT_FALSE(fs::exists(tmp / "cons/d"));
    for (bool create : {false, true}) {
        auto bad = dyad::dir_beneath(dfd, "run1/x/deeper", create, 0755);
        ASSERT_FALSE(bad.is_ok());
        EXPECT_EQ(bad.status().err(), ELOOP);
        EXPECT_NE(bad.status().message().find("'run1/x' is a symbolic link (-> '" +
                                              (tmp / "elsewhere").string() + "')"),
                  std::string::npos)
            << bad.status().to_string();
        EXPECT_EQ(dyad::dir_beneath(dfd, "alias", create, 0755).status().err(), ELOOP);
    }
    EXPECT_TRUE(fs::is_empty(tmp / "elsewhere"));
    EXPECT_EQ(dyad::dir_beneath(dfd, "plain/sub", true, 0755).status().err(), ENOTDIR);
    EXPECT_EQ(dyad::first_symlink(dfd, "run1/x/passwd"), "run1/x");
    EXPECT_EQ(dyad::first_symlink(dfd, "a/b/c"), "");
    ::close(dfd);
    fs::remove_all(tmp);
}

TEST(Paths, OpenBeneathUnreservedKeepsOutOfDyad) {
    auto tmp = fs::temp_directory_path() / ("dyad-unreserved-" + std::to_string(getpid()));
    fs::create_directories(tmp / "prod/.dyad");
    fs::create_directories(tmp / "prod/real");
    std::ofstream(tmp / "prod/.dyad/secret") << "s";
    std::ofstream(tmp / "prod/real/ok") << "ok";
    fs::create_symlink(".dyad", tmp / "prod/m");
    fs::create_symlink(".dyad/secret", tmp / "prod/e");
    fs::create_symlink("real", tmp / "prod/alias");
    const std::string dir = fs::canonical(tmp / "prod").string();
    int dfd = ::open(dir.c_str(), O_PATH | O_DIRECTORY);
    ASSERT_GE(dfd, 0);
    for (const char* p : {"m/secret", "e"}) {
        auto bad = dyad::open_beneath_unreserved(dfd, dir, p, O_RDONLY);
        ASSERT_FALSE(bad.is_ok()) << p;
        EXPECT_EQ(bad.status().err(), EACCES);
        EXPECT_NE(bad.status().message().find("into " + dir + "/.dyad"), std::string::npos)
            << bad.status().to_string();
    }
    EXPECT_TRUE(dyad::open_beneath_unreserved(dfd, dir, "alias/ok", O_RDONLY).is_ok());
    EXPECT_TRUE(dyad::open_beneath_unreserved(dfd, dir, "real/ok", O_RDONLY).is_ok());
    ::close(dfd);
    fs::remove_all(tmp);
}

TEST(Paths, MkdirP) {
    auto tmp = fs::temp_directory_path() / ("dyad-mkdir-" + std::to_string(getpid()));
    EXPECT_TRUE(dyad::mkdir_p((tmp / "a/b/c").string()).is_ok());
    EXPECT_TRUE(fs::is_directory(tmp / "a/b/c"));
    std::ofstream(tmp / "file") << "x";
    EXPECT_FALSE(dyad::mkdir_p((tmp / "file/sub").string()).is_ok());
    fs::remove_all(tmp);
}
