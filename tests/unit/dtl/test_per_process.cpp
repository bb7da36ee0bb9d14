// SPDX-License-Identifier: Apache-2.0
// A per-process singleton's state (dtl/per_process.hpp): a forked child
// starts from a fresh state and leaves its parent's alone.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include "dtl/per_process.hpp"

using dyad::dtl::PerProcess;

namespace {
struct State {
    int made = 0;
};
}  // namespace

TEST(PerProcess, AForkedChildStartsAfresh) {
    PerProcess<State> pp;
    pp.lock()->made = 7;
    EXPECT_EQ(pp.lock()->made, 7);  // the same process: the same state
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        int fresh = pp.lock()->made;
        pp.lock()->made = 9;
        _exit(fresh == 0 && pp.lock()->made == 9 ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    EXPECT_EQ(pp.lock()->made, 7);  // the parent's is untouched
}
