// SPDX-License-Identifier: Apache-2.0
// `dyad doctor --site` (doctor_site.cpp): what a Slurm site needs for
// `--dyad`, checked on one node; and, for `dyad doctor` inside a --dyad
// job, whether every node's dyadd uses the same metadata store
// (doctor_job.cpp). docs/user-guide.md, "Slurm: for administrators".
#pragma once

#include <map>
#include <string>
#include <vector>

namespace dyad::tools {

// One check's outcome, as `dyad doctor` prints it.
struct Finding {
    enum Verdict { ok, note, warn, fail };
    std::string name;
    Verdict verdict = ok;
    std::string detail;
    std::string fix;  // what to do ("" when nothing)
};

// Prints findings as `dyad doctor` does (or one JSON object); 1 if one failed.
int print_findings(const std::vector<Finding>& f, bool json);

// The plugin's line of plugstack.conf: its path and its arguments.
struct PlugstackEntry {
    std::string file;                         // the plugstack file it is in
    std::string plugin;                       // the .so
    std::map<std::string, std::string> args;  // key=value
    bool required = false;
};

// slurm.conf: `given`, else $SLURM_CONF, else /etc/slurm/slurm.conf (or
// /etc/slurm-llnl/); "" when none is readable.
std::string find_slurm_conf(const std::string& given);
// The dyad_spank.so line of the plugstack of `slurm_conf` (PlugStackConfig,
// else plugstack.conf beside it, with its include globs); `where` says
// which files were read when none has it.
bool find_plugstack_entry(const std::string& slurm_conf, PlugstackEntry* out, std::string* where);

// `dyad doctor --site`.
int doctor_site(const std::string& slurm_conf, bool json);

// Inside a --dyad job (SLURM_JOB_NODELIST and DYAD_JOB_MANAGER=slurm): asks
// every node's dyadd which metadata store it uses; none outside a job.
std::vector<Finding> job_store_findings();

}  // namespace dyad::tools
