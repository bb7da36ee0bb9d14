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

namespace dyad::job::detail {

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

// The job: nodes, id, directory, port, metadata namespace.
Result<std::vector<std::string>> job_nodes(const Options& o);
std::string job_id(const Options& o);
bool safe_id(const std::string& id);
std::string job_dir(const Options& o, const std::string& id);
unsigned job_port(const Options& o, const std::string& id);
std::string job_namespace(const Options& o, const std::string& id);

// Processes: the launcher's words for a host, children with pipes.
Result<std::vector<std::string>> launcher_words(const std::string& tmpl, const std::string& host);
Result<std::vector<std::string>> launcher_for(const Options& o, const std::string& host);
struct Child {
    pid_t pid = -1;
    UniqueFd in;   // our end of its stdin
    UniqueFd out;  // our end of its stdout
};
Result<Child> spawn(const std::vector<std::string>& argv, const std::string& err_path);
int pidfd_open(pid_t pid);
bool wait_gone(pid_t pid, const Deadline& d);

// The per-node halves (node.cpp).
int node_up(const Options& o);
int node_down(const Options& o);

}  // namespace dyad::job::detail
