// SPDX-License-Identifier: Apache-2.0
// The wrapper's decision for an open of a consumer path (issue 46): only a
// read-only open of an absent path by name, or of a file another process
// still writes, waits.
#include <fcntl.h>
#include <gtest/gtest.h>

#include "capi/intercept.hpp"

using dyad::capi::consume_mode;
using dyad::capi::ConsumeMode;
using dyad::capi::OpenFacts;

namespace {
OpenFacts facts(int oflag) {
    OpenFacts f;
    f.oflag = oflag;
    return f;
}
}  // namespace

TEST(OpenPolicy, OnlyAReadOfAnAbsentPathByNameWaits) {
    EXPECT_EQ(consume_mode(facts(O_RDONLY)), ConsumeMode::wait);  // cat f
    OpenFacts via_dir = facts(O_RDONLY | O_NOFOLLOW);
    via_dir.via_dirfd = true;  // rsync's basis, tar, cp -r
    EXPECT_EQ(consume_mode(via_dir), ConsumeMode::look);
}

TEST(OpenPolicy, WriteModesNeverWait) {
    EXPECT_EQ(consume_mode(facts(O_WRONLY | O_CREAT | O_TRUNC)), ConsumeMode::none);   // >
    EXPECT_EQ(consume_mode(facts(O_WRONLY | O_CREAT | O_APPEND)), ConsumeMode::none);  // >>
    EXPECT_EQ(consume_mode(facts(O_RDWR | O_CREAT | O_EXCL)), ConsumeMode::none);      // mkstemp
    EXPECT_EQ(consume_mode(facts(O_RDWR)), ConsumeMode::look);  // h5py 'w' probes, 'r+'
}

TEST(OpenPolicy, PresentFilesAreReadUnlessStillBeingWritten) {
    OpenFacts f = facts(O_RDONLY);
    f.exists = true;
    EXPECT_EQ(consume_mode(f), ConsumeMode::look);  // sed -i on a file written here
    f.being_written = true;
    EXPECT_EQ(consume_mode(f), ConsumeMode::wait);  // its publish comes at its writer's close
    f.is_dir = true;
    EXPECT_EQ(consume_mode(f), ConsumeMode::none);
}

TEST(OpenPolicy, TemporariesAndProbesAreNeverConsumed) {
    OpenFacts f = facts(O_RDONLY);
    f.temporary = true;
    EXPECT_EQ(consume_mode(f), ConsumeMode::none);
    EXPECT_EQ(consume_mode(facts(O_RDONLY | O_PATH)), ConsumeMode::none);
    EXPECT_EQ(consume_mode(facts(O_RDONLY | O_DIRECTORY)), ConsumeMode::none);
}
