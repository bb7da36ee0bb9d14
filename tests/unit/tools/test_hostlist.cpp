// SPDX-License-Identifier: Apache-2.0
// Slurm hostlist expressions and host files (tools/job/hostlist.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "job/hostlist.hpp"

using dyad::job::expand_hostlist;
using dyad::job::read_hostfile;
using V = std::vector<std::string>;

TEST(Hostlist, PlainNamesAndRanges) {
    EXPECT_EQ(expand_hostlist("node1").value(), V({"node1"}));
    EXPECT_EQ(expand_hostlist("node[1-3,7]").value(), V({"node1", "node2", "node3", "node7"}));
    EXPECT_EQ(expand_hostlist("a,b[2-3],c").value(), V({"a", "b2", "b3", "c"}));
}

TEST(Hostlist, PaddingAndSeveralBrackets) {
    EXPECT_EQ(expand_hostlist("n[08-10]").value(), V({"n08", "n09", "n10"}));
    EXPECT_EQ(expand_hostlist("r[1-2]n[1,3]").value(), V({"r1n1", "r1n3", "r2n1", "r2n3"}));
    EXPECT_EQ(expand_hostlist("gpu[01-02]-ib").value(), V({"gpu01-ib", "gpu02-ib"}));
}

TEST(Hostlist, DuplicatesGoOrderStays) {
    EXPECT_EQ(expand_hostlist("n[3,1,3],n1").value(), V({"n3", "n1"}));
}

TEST(Hostlist, Errors) {
    for (const char* bad : {"", "n[1-", "n1]", "n[3-1]", "n[a-b]", "n[]", "n[1-200000]"})
        EXPECT_FALSE(expand_hostlist(bad)) << bad;
}

TEST(Hostlist, Hostfile) {
    char path[] = "/tmp/dyad-hostfile-XXXXXX";
    int fd = ::mkstemp(path);
    ASSERT_GE(fd, 0);
    ::close(fd);
    std::ofstream(path) << "# nodes\nnode2 slots=4\nnode1\n\nnode2\n";
    EXPECT_EQ(read_hostfile(path).value(), V({"node2", "node1"}));
    std::ofstream(path) << "# none\n";
    EXPECT_FALSE(read_hostfile(path));
    std::remove(path);
    EXPECT_FALSE(read_hostfile(path));
}
