// SPDX-License-Identifier: Apache-2.0
// The publish ledger's durable copy (SQLite): what a service published
// survives the process, in the ledger's order, and only its own rows.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "service/ledger_journal.hpp"
#include "service/publish_ledger.hpp"

using namespace dyad;
using service::LedgerJournal;
using service::Published;
using service::PublishLedger;

namespace {
struct TempDir {
    std::string path;
    TempDir() {
        std::string t = ::testing::TempDir() + "/ledger.XXXXXX";
        path = ::mkdtemp(t.data()) ? t : std::string();
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
};

struct stat file(uint64_t ino, uint64_t size, int64_t mtime_s) {
    struct stat sb {};
    sb.st_dev = 7;
    sb.st_ino = ino;
    sb.st_size = static_cast<off_t>(size);
    sb.st_mtim.tv_sec = mtime_s;
    sb.st_ctim.tv_sec = mtime_s + 1;
    sb.st_nlink = 1;
    return sb;
}

std::unique_ptr<LedgerJournal> open(const std::string& dir, const std::string& id = "n0",
                                    const std::string& prod = "/p") {
    auto j = service::open_sqlite_journal(dir, id, prod);
    EXPECT_TRUE(j) << j.status().to_string();
    return j ? std::move(j.value()) : nullptr;
}

void publish(PublishLedger& l, const std::string& up, const struct stat& sb, Result<uint64_t> v) {
    auto gate = l.publishing();
    Published p = Published::of(sb, "ns", "key/" + up);
    auto before = l.begin(up, p);
    l.end(up, p, v, before);
}
}  // namespace

TEST(LedgerJournal, WhatWasPublishedOutlivesTheLedger) {
    TempDir d;
    ASSERT_FALSE(d.path.empty());
    {
        PublishLedger l;
        l.attach(open(d.path));
        publish(l, "a.bin", file(11, 100, 5), Result<uint64_t>(uint64_t{1}));
        publish(l, "b.bin", file(12, 200, 6), Result<uint64_t>(uint64_t{1}));
        publish(l, "b.bin", file(12, 300, 7), Result<uint64_t>(uint64_t{2}));  // again
        publish(l, "c.bin", file(13, 1, 1), Result<uint64_t>(uint64_t{1}));
        l.forget("c.bin");  // unpublished
        publish(l, "d.bin", file(14, 1, 1),
                Result<uint64_t>(Status(DYAD_RC_CONNFAIL, "store down", EIO)));  // failed
        l.republished("a.bin", 1, (uint64_t{1} << 32) | 1);
        l.flush();
        EXPECT_EQ(l.journal_errors(), 0u);
        // Saved once flushed, while the ledger lives.
        auto now = open(d.path)->load();
        ASSERT_TRUE(now);
        EXPECT_EQ(now->size(), 2u);
        publish(l, "e.bin", file(15, 1, 1), Result<uint64_t>(uint64_t{1}));
        l.forget("e.bin");
    }
    auto rows = open(d.path)->load();
    ASSERT_TRUE(rows) << rows.status().to_string();
    std::map<std::string, Published> by(rows->begin(), rows->end());
    ASSERT_EQ(by.size(), 2u);
    const Published& a = by.at("a.bin");
    EXPECT_EQ(a.generation, (uint64_t{1} << 32) | 1);
    EXPECT_TRUE(a.unchanged(file(11, 100, 5)));
    EXPECT_EQ(a.ns, "ns");
    EXPECT_EQ(a.key, "key/a.bin");
    const Published& b = by.at("b.bin");
    EXPECT_EQ(b.generation, 2u);
    EXPECT_TRUE(b.unchanged(file(12, 300, 7)));
    EXPECT_FALSE(b.unchanged(file(12, 200, 6)));
}

TEST(LedgerJournal, OnlyThisServiceAndDirectory) {
    TempDir d;
    ASSERT_FALSE(d.path.empty());
    PublishLedger mine, other_id, other_dir;
    mine.attach(open(d.path, "n0", "/p"));
    other_id.attach(open(d.path, "n1", "/p"));
    other_dir.attach(open(d.path, "n0", "/q"));
    publish(mine, "x", file(1, 1, 1), Result<uint64_t>(uint64_t{1}));
    publish(other_id, "y", file(2, 1, 1), Result<uint64_t>(uint64_t{1}));
    publish(other_dir, "z", file(3, 1, 1), Result<uint64_t>(uint64_t{1}));
    for (auto* l : {&mine, &other_id, &other_dir}) l->flush();
    auto j = open(d.path, "n0", "/p");
    auto rows = j->load();
    ASSERT_TRUE(rows);
    ASSERT_EQ(rows->size(), 1u);
    EXPECT_EQ(rows->front().first, "x");
    Published w = Published::of(file(9, 9, 9), "ns", "key/w");
    w.generation = 5;
    ASSERT_TRUE(j->replace({{"w", w}}));
    rows = j->load();
    ASSERT_EQ(rows->size(), 1u);
    EXPECT_EQ(rows->front().first, "w");
    EXPECT_EQ(rows->front().second.generation, 5u);
    ASSERT_TRUE(j->clear());
    EXPECT_TRUE(j->load()->empty());
    EXPECT_EQ(open(d.path, "n1", "/p")->load()->size(), 1u);
}

TEST(LedgerJournal, AFileThatIsNotALedgerIsAClearError) {
    TempDir d;
    ASSERT_FALSE(d.path.empty());
    const std::string path = d.path + "/" + service::kLedgerFile;
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    const std::string junk(4096, 'x');
    ASSERT_EQ(::write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    ::close(fd);
    auto j = service::open_sqlite_journal(d.path, "n0", "/p");
    ASSERT_FALSE(j);
    EXPECT_NE(j.status().message().find(path), std::string::npos) << j.status().message();
    EXPECT_NE(j.status().message().find("--state-dir"), std::string::npos);
}
