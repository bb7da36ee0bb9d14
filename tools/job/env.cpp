// SPDX-License-Identifier: Apache-2.0
// `dyad job env`: the DYAD environment of a `--dyad` job (the SPANK plugin's)
// as `export` lines, for a shell on one of its nodes that did not get it as
// a step does (e.g. an salloc shell on the first node):
//   eval "$(dyad job env)"
// It reads the plugin's record of the job (PARENT/job-JOBID, root's) only.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "common/fd.hpp"
#include "job/support.hpp"

namespace dyad::job::detail {

int job_env(const Options& o) {
    g_cmd = "dyad job env";
    const std::string id = job_id(o);
    if (id.empty() || !safe_id(id))
        return fail("no job id: run it inside the job (SLURM_JOB_ID), or give --job-id");
    const std::string parent = o.parent.empty() ? "/tmp/dyad" : o.parent;
    const std::string path = parent + "/job-" + id;
    char host[256] = "?";
    ::gethostname(host, sizeof host - 1);
    const std::string node = env_or("SLURMD_NODENAME", host);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st;
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 ||
        (st.st_mode & 022))
        return fail("no DYAD of job " + id + " on " + node + " (" + path +
                    "): run it on a node of a job submitted with --dyad, e.g. in `srun -N1 "
                    "--pty bash` (whose steps have the environment already)");
    std::map<std::string, std::string> rec;
    char buf[16384];
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    std::istringstream in(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0));
    for (std::string line; std::getline(in, line);)
        if (size_t eq = line.find('='); eq != std::string::npos)
            rec[line.substr(0, eq)] = line.substr(eq + 1);
    if (rec["uid"] != std::to_string(::getuid()))
        return fail("job " + id + " is not yours (its DYAD belongs to uid " + rec["uid"] + ")");
    if (rec["state"] != "ready")
        return fail("DYAD of job " + id + " did not start on " + node + ": " + rec["reason"]);
    const std::string dir = rec["dir"];
    auto line = [](const char* k, const std::string& v) {
        std::printf("export %s=%s\n", k, shell_quote(v).c_str());
    };
    line("DYAD_SERVICE_URI", "unix:" + dir + "/" + kSocketName);
    line("DYAD_PATH_PRODUCER", dir + "/" + kDataName);
    line("DYAD_PATH_CONSUMER", dir + "/" + kDataName);
    line("DYAD_AUTH_KEY_FILE", dir + "/" + kKeyName);
    line("DYAD_KVS_NAMESPACE", "dyad-job-" + id);
    namespace fs = std::filesystem;
    const fs::path lib = fs::path(self_exe()).parent_path().parent_path() / "lib";
    std::error_code ec;
    if (fs::exists(lib / "libdyad_wrapper.so", ec))
        line("DYAD_WRAPPER", (lib / "libdyad_wrapper.so").string());
    if (fs::exists(lib / "libdyad.so", ec)) line("DYAD_LIBRARY", (lib / "libdyad.so").string());
    return 0;
}

}  // namespace dyad::job::detail
