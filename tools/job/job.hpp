// SPDX-License-Identifier: Apache-2.0
// `dyad job start|stop`: one dyadd per node of an allocation, a fresh key,
// node-local directories and the environment of the job's tasks. Also the
// per-node halves that the launcher (srun, ssh, nsenter, the SPANK plugin)
// runs on each node: `dyad job node-up` and `dyad job node-down`.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace dyad::job {

struct Options {
    // which nodes and how to reach them (start, stop)
    std::string nodes;     // --nodes HOSTLIST (else $SLURM_JOB_NODELIST)
    std::string hostfile;  // --hostfile FILE
    std::string launcher;  // --launcher 'TEMPLATE {host}' (else srun inside Slurm)
    // the job
    std::string job_id;                   // --job-id (else $SLURM_JOB_ID, $PBS_JOBID, ...)
    std::string dir_template;             // --dir (default ${TMPDIR:-/tmp}/dyad-{jobid})
    std::string kvs;                      // --kvs etcd://... (default: embedded on the first node)
    std::string store;                    // --store auto|etcd|embedded: the job's own store
    std::string etcd;                     // --etcd PATH: the etcd program (default: etcd in PATH)
    std::string kvs_namespace;            // --namespace (default dyad-job-{jobid})
    unsigned port = 0;                    // --port (default: 8 ports derived from the job key)
    std::string ports;                    // --ports LOW-HIGH the derived ports lie in
    std::string dyadd;                    // --dyadd PATH (default: beside this program)
    std::vector<std::string> dyadd_args;  // --dyadd-arg, repeated
    double timeout = 60;                  // seconds until every dyadd is ready / stopped
    std::string env_file;                 // --env-file FILE
    bool keep = false;                    // --keep: leave the directories (the key always goes)
    bool quiet = false;                   // --quiet: no environment on stdout
    // node-up / node-down (one node; run by a launcher or the SPANK plugin)
    std::string node;          // --node NAME: this node's name (resolves to its address)
    std::string first;         // --first NAME: the node whose dyadd hosts the store
    unsigned rank = 0;         // --rank N
    std::string dir;           // --dir: the node's job directory, expanded
    bool detach = false;       // --detach: return once ready, dyadd in its own session
    bool keep_log = false;     // node-down --keep-log: leave dyadd.log
    std::string parent;        // env --parent: the SPANK plugin's parent directory
    std::string slurm_conf;    // --slurm-conf: node addresses (NodeAddr) and PrologFlags
    bool from_prolog = false;  // --from-prolog: the SPANK plugin's job prolog runs us
};

struct Commands {
    CLI::App* job = nullptr;
    CLI::App* start = nullptr;
    CLI::App* stop = nullptr;
    CLI::App* node_up = nullptr;
    CLI::App* node_down = nullptr;
    CLI::App* env = nullptr;
};

// Declares `dyad job ...` on `app`, its values in `o`.
Commands add_commands(CLI::App& app, Options& o);

// Runs the parsed job subcommand; returns the exit code.
int run(const Commands& c, Options& o);

// The job directory's fixed names, shared with the SPANK plugin
// (src/slurm/dyad_spank.c): keep them in step.
inline constexpr const char* kSocketName = "dyadd.sock";
inline constexpr const char* kKeyName = "job.key";
inline constexpr const char* kDataName = "data";
inline constexpr const char* kLogName = "dyadd.log";
inline constexpr const char* kPidName = "dyadd.pid";

}  // namespace dyad::job
