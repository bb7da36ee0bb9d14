// SPDX-License-Identifier: Apache-2.0
// What `dyad job node-up` reads of slurm.conf: the address slurmd uses for
// each node (NodeAddr, else NodeHostname, else the name) and PrologFlags.
// Node names then need not resolve (docs/user-guide.md, "Slurm: for
// administrators").
#pragma once

#include <map>
#include <string>

#include "common/status.hpp"

namespace dyad::job {

struct SlurmConf {
    std::string path;
    std::map<std::string, std::string> node_addr;  // NodeName -> NodeAddr
    std::string prolog_flags;                      // as written ("" when absent)
    // PrologFlags has Alloc (or Contain, which implies it).
    bool prolog_alloc() const;
};

// Reads `path` and the files it includes (Include/include, relative to its
// directory, at most 8 deep). Lines are "Key=Value Key=Value ..." with
// '#' comments; NodeName lists and NodeAddr lists are Slurm hostlists.
Result<SlurmConf> read_slurm_conf(const std::string& path);

}  // namespace dyad::job
