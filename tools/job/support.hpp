// SPDX-License-Identifier: Apache-2.0
// Internal to `dyad job` (tools/job/*.cpp): what its parts share.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/deadline.hpp"
#include "common/fd.hpp"
#include "common/status.hpp"
#include "job/job.hpp"
#include "job/slurm_conf.hpp"

namespace dyad::job::detail {

// node-up's exit code when a dyadd of the job runs already on the node (it
// prints "running NODE pid N"); node-down's when the dyadd does not end
// after SIGKILL (a node fault: the SPANK plugin then fails the epilog).
inline constexpr int kAlreadyRunning = 3;
inline constexpr int kDoesNotEnd = 5;

// "dyad job" or the alias the user typed ("dyad start"), for messages.
extern std::string g_cmd;
// Prints "CMD: msg" on stderr; returns 1 (the exit code).
int fail(const std::string& msg);
// An environment variable of the job's context (not a DYAD_* setting).
std::string env_or(const char* name, const std::string& fallback = "");
std::string self_exe();
std::string default_dyadd();  // beside this program
// The last n lines of a file, indented, for error messages.
std::string last_lines(const std::string& path, size_t n = 8);
void replace_all(std::string& s, const std::string& from, const std::string& to);
std::string shell_quote(const std::string& s);

// The job: nodes, id, directory, metadata namespace.
Result<std::vector<std::string>> job_nodes(const Options& o);
std::string job_id(const Options& o);
bool safe_id(const std::string& id);
std::string job_dir(const Options& o, const std::string& id);
std::string job_namespace(const Options& o, const std::string& id);

// Processes: the launcher's words for a host, children with pipes.
Result<std::vector<std::string>> launcher_words(const std::string& tmpl, const std::string& host);
Result<std::vector<std::string>> launcher_for(const Options& o, const std::string& host);
// The one way the job's tools start a program: fork, then in the child its
// standard descriptors (each >= 0 is put on 0, 1, 2), a process group or a
// session of its own, variables it must not inherit removed, SIGPIPE back
// to its default, and exec (with PATH search or not). A program that
// cannot run says so on its stderr and exits 127. The child's pid.
struct ExecPlan {
    std::vector<std::string> argv;
    int in = -1, out = -1, err = -1;
    enum class Group { inherit, process_group, session } group = Group::inherit;
    std::vector<const char*> unset;
    bool search_path = false;      // execvp, else execv
    bool default_sigpipe = false;  // SIGPIPE back to SIG_DFL
    // Descriptors handed to the program: (ours, its number there, >= 3).
    std::vector<std::pair<int, int>> pass;
};
Result<pid_t> fork_exec(const ExecPlan& plan);
struct Child {
    pid_t pid = -1;
    UniqueFd in;   // our end of its stdin
    UniqueFd out;  // our end of its stdout
};
Result<Child> spawn(const std::vector<std::string>& argv, const std::string& err_path);
int pidfd_open(pid_t pid);
bool wait_gone(pid_t pid, const Deadline& d);

// node-up's network side (ready.cpp).
Result<std::string> resolve(const std::string& host);
// The address slurmd uses for `node` (NodeAddr of slurm.conf when `conf`
// names it), else the name resolved.
Result<std::string> node_address(const std::string& node, const SlurmConf* conf);
// The job's TCP ports, in the order every node tries them: --port alone if
// given, else 8 ports of --ports (default 20000-29999) derived from the job
// key (hex), so that only the key's holders know them.
Result<std::vector<unsigned>> candidate_ports(const Options& o, const std::string& key_hex);
// 8 ports of --ports (default 20000-29999) derived from the job key under
// `label` (empty when --ports is not valid).
std::vector<unsigned> derived_ports(const Options& o, const std::string& key_hex,
                                    const char* label);
// No one (another user's program, another job) holds addr:port.
bool port_free(const std::string& addr, unsigned port);
// A TCP socket bound to addr:port and listening (EADDRINUSE: held by
// another program), and a Unix one bound at `path` (a stale socket there is
// replaced; dyadd listens on it): node-up binds dyadd's sockets and hands
// them over, so that the job's start does not wait for dyadd's (TCP
// connections wait in the backlog, local clients try again).
Result<UniqueFd> bind_listening(const std::string& addr, unsigned port);
Result<UniqueFd> bind_unix_listening(const std::string& path);
// A hello with the job key to addr:port: ok when the service proves the key
// and says it is `node`'s (its pid then); foreign when something else
// answered there (no key, another key, not DYAD).
struct Hello {
    bool ok = false;
    bool foreign = false;
    pid_t pid = -1;
    std::string error;
};
Hello hello(const std::string& addr, unsigned port, const std::string& key_path,
            const std::string& node, const Deadline& deadline);
// The port of the first node's dyadd (the job's store): the first of `ports`
// where it answers the hello, retried until `deadline`.
Result<unsigned> find_store(const Options& o, const std::string& first_addr,
                            const std::vector<unsigned>& ports, const std::string& key_path,
                            const Deadline& deadline, const std::string& log);

// The per-node halves (node.cpp).
int node_up(const Options& o);
int node_down(const Options& o);
int job_env(const Options& o);  // env.cpp

}  // namespace dyad::job::detail
