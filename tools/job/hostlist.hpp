// SPDX-License-Identifier: Apache-2.0
// Slurm hostlist expressions ("node[1-3,7],gpu[01-02]") and host files.
#pragma once

#include <string>
#include <vector>

#include "common/status.hpp"

namespace dyad::job {

// The host names of a Slurm hostlist expression, in order, duplicates
// removed: "node[1-3,7]" -> node1 node2 node3 node7; zero padding is kept
// ("n[08-10]" -> n08 n09 n10); several bracket groups multiply
// ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2); commas outside brackets separate
// expressions. An empty list, an unclosed bracket, a range whose end is
// below its start or a list of more than 100,000 hosts is an error.
Result<std::vector<std::string>> expand_hostlist(const std::string& expr);

// The hosts of a host file (PBS_NODEFILE, an mpirun --hostfile): one per
// line, the first word of each line (so "node1 slots=4" is node1), '#'
// comments and blank lines skipped, duplicates removed (a PBS node file
// names a host once per slot).
Result<std::vector<std::string>> read_hostfile(const std::string& path);

}  // namespace dyad::job
