// SPDX-License-Identifier: Apache-2.0
// dyad: command-line tool for DYAD (produce, consume, stat, ls, config,
// keygen, service status).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include <cctype>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <dyad/dyad_version.h>

#include "client/client.hpp"
#include "capi/intercept.hpp"
#include "common/auth.hpp"
#include "common/config.hpp"
#include "common/settings.hpp"
#include "common/keygen.hpp"
#include "doctor.hpp"
#include "doctor_site.hpp"
#include "dtl/dtl.hpp"
#include "common/json_text.hpp"
#include "job/job.hpp"
#include "cli_common.hpp"
#include "rm.hpp"

using dyad::kBadUtf8Replaced;
using namespace dyad::tool;

namespace {

constexpr const char* kExitCodes =
    "Exit codes:\n"
    "  0  success\n"
    "  1  usage or configuration error (bad option, bad DYAD_* variable)\n"
    "  2  file problem: not produced, not under a managed directory, missing or unreadable\n"
    "  3  timeout: the file was not produced within --timeout / DYAD_WAIT_TIMEOUT\n"
    "  4  the DYAD service, its metadata store or the owner's service could not be reached\n"
    "     (or is not a DYAD service, or refused this client's key)\n"
    "  5  transfer failed or the received file did not match its checksum\n"
    "  6  other error\n";

// "dyad consume", "dyad service status": the prefix of every error line.
// The subcommands, as parsed.
struct Commands {
    CLI::App *produce, *consume, *sync, *stat, *ls, *config, *key, *keygen, *status, *doctor, *rm;
    CLI::Option* status_wait = nullptr;
    dyad::job::Commands job;
};

// The arguments CLI11 parses: --json is taken anywhere on the command line
// (before or after the subcommand) and removed here (it is declared on the
// app for --help); `dyad start|stop` become `dyad job start|stop`.
std::vector<char*> arguments(int argc, char** argv, bool* json) {
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
        if (i > 0 && std::strcmp(argv[i], "--") == 0) {
            for (; i < argc; ++i) args.push_back(argv[i]);
            break;
        }
        if (i > 0 && std::strcmp(argv[i], "--json") == 0) {
            *json = true;
            continue;
        }
        // `dyad start` / `dyad stop`: upstream DYAD's names of `dyad job start|stop`.
        if (args.size() == 1 &&
            (std::strcmp(argv[i], "start") == 0 || std::strcmp(argv[i], "stop") == 0))
            args.push_back(const_cast<char*>("job"));
        args.push_back(argv[i]);
    }
    return args;
}

// --timeout DURATION: seconds ("30", "2.5") or a number with a unit s, m or
// h ("90s", "10m", "1h").
void add_timeout_option(CLI::App* app, double& to, const std::string& help) {
    app->add_option_function<std::string>(
           "--timeout",
           [&to](const std::string& v) {
               if (!parse_duration(v, &to))
                   throw CLI::ValidationError(
                       "--timeout", "'" + v +
                                        "' is not a duration: give seconds (30, 2.5) or a "
                                        "number with a unit s, m or h (90s, 10m, 1h)");
           },
           help)
        ->type_name("DURATION");
}

// produce, consume, sync.
void add_file_commands(CLI::App& app, Cli& o, Commands& c) {
    c.produce = app.add_subcommand("produce", "publish files of DYAD_PATH_PRODUCER");
    c.produce->add_option("FILE", o.files, "files to publish")->required();
    c.produce->add_flag("-r,--recursive", o.recursive,
                        "a directory: publish every regular file under it (not DYAD's own .dyad/ "
                        "nor the temporaries of rsync and sed -i)");
    c.rm = app.add_subcommand("rm",
                              "unpublish files this node produced (their records go, then their "
                              "replicas on other nodes; the files stay on disk)");
    c.rm->add_option("FILE", o.files, "files of DYAD_PATH_PRODUCER to unpublish")->required();
    auto* consume =
        app.add_subcommand("consume", "wait for files and bring them into DYAD_PATH_CONSUMER");
    c.consume = consume;
    consume->add_option("FILE", o.files, "consumer-side paths")->required();
    consume->add_flag("--explain", o.explain,
                      "say which transport moved each file and why (DYAD_DTL_MODE=AUTO: every "
                      "candidate with its estimate)");
    add_timeout_option(consume, o.timeout,
                       "how long to wait for each file to be produced: seconds, or with a unit "
                       "(90s, 10m, 1h) (default DYAD_WAIT_TIMEOUT)");
    auto* pon = consume->add_flag("--progress", o.progress_on,
                                  "show the progress of each transfer on stderr (bytes, rate, "
                                  "ETA) even when stderr is not a terminal, and for small files");
    consume
        ->add_flag("--no-progress", o.progress_off,
                   "never show progress (default: shown on a terminal for files over 64 MiB or "
                   "transfers that take more than 1 s)")
        ->excludes(pon);
    consume
        ->add_option("--window", o.window,
                     "files in flight when consuming several (default DYAD_CONSUME_WINDOW)")
        ->check(CLI::Range(1u, 1024u));
    auto* sync = app.add_subcommand(
        "sync",
        "consume every file produced under a relative path prefix (with --follow: as they "
        "appear)");
    c.sync = sync;
    sync->add_option("PREFIX", o.sync_prefix,
                     "path relative to the managed directory: 'data' takes data and what is "
                     "under it, '' or '.' everything, 'run1/x*' every path starting so")
        ->required();
    sync->add_flag("--follow", o.follow,
                   "keep consuming new files (and new generations) until interrupted or --count");
    sync->add_option("--count", o.sync_count, "with --follow: stop after N files consumed")
        ->check(CLI::PositiveNumber);
    sync->add_option("--window", o.window, "files in flight (default DYAD_CONSUME_WINDOW)")
        ->check(CLI::Range(1u, 1024u));
    add_timeout_option(sync, o.timeout,
                       "how long a listed file may take to be found in the store: seconds, or "
                       "with a unit (90s, 10m, 1h) (default DYAD_WAIT_TIMEOUT)");
}

// stat, ls, config, key, keygen, service status.
void add_info_commands(CLI::App& app, Cli& o, Commands& c) {
    c.stat = app.add_subcommand("stat", "show the metadata of a file");
    c.stat
        ->add_option("FILE", o.stat_file,
                     "a path in the consumer directory, or in the producer directory")
        ->required();
    c.ls = app.add_subcommand(
        "ls", "list the files produced in the namespace, page by page as they arrive");
    c.ls->add_option("PREFIX", o.ls_prefix,
                     "only files whose relative path starts with PREFIX (e.g. 'run3/')");
    c.config = app.add_subcommand(
        "config", "print every setting with its value and source, and the transports");
    c.config->add_flag("--markdown", o.markdown,
                       "print the settings table of the user guide (generated from the table)");
    c.key = app.add_subcommand("key",
                               "print the metadata key of a path relative to a managed directory");
    c.key->add_option("UPATH", o.key_path)->required();
    c.keygen = app.add_subcommand(
        "keygen",
        "write a new key (32 random bytes, mode 0600): a job key (dyadd --auth-key, "
        "DYAD_AUTH_KEY_FILE) or the Slurm plugin's site secret (/etc/dyad/slurm.key)");
    c.keygen->add_option("FILE", o.keygen_path, "where to write it (never overwritten)")
        ->required();
    c.doctor = app.add_subcommand(
        "doctor",
        "check the settings, directories, key, service, metadata store and transport of this "
        "process's environment (inside a --dyad job: also that every node uses one metadata "
        "store), and say what to fix (exit 1 if something must be)");
    c.doctor->add_flag("--site", o.doctor_site,
                       "check instead what a Slurm site needs for --dyad, on this node: "
                       "PrologFlags=Alloc, the plugstack line, node addresses, the job ports, the "
                       "site secret, dyadd of this build");
    c.doctor->add_option("--slurm-conf", o.slurm_conf,
                         "with --site: Slurm's configuration (default $SLURM_CONF, else "
                         "/etc/slurm/slurm.conf)");
    auto* service = app.add_subcommand("service", "ask a service about itself");
    c.status = service->add_subcommand("status", "identity, transports and counters of a service");
    c.status->add_option("--uri", o.uri, "service to ask (default DYAD_SERVICE_URI)");
    c.status_wait =
        c.status
            ->add_option("--wait", o.status_wait_text,
                         "wait until the service answers (for job scripts), at most DURATION "
                         "(seconds, or 90s, 10m, 1h; default 60 s); exit 4 if it did not")
            ->expected(0, 1)
            ->type_name("[DURATION]");
    service->require_subcommand(1);
}

// Parses the command line: -1 when parsed, else the exit code (--help: 0;
// an error, said on stderr: 1).
int parse(CLI::App& app, std::vector<char*>& args) {
    try {
        app.parse(static_cast<int>(args.size()), args.data());
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);  // --help
        std::string sub;
        for (const CLI::App* a = &app; a && !a->get_subcommands().empty();) {
            a = a->get_subcommands().front();
            sub += " " + a->get_name();
        }
        std::fprintf(stderr, "dyad%s: %s (see 'dyad%s --help')\n", sub.c_str(), e.what(),
                     sub.c_str());
        return 1;
    }
    for (const CLI::App* a = &app; !a->get_subcommands().empty();) {
        a = a->get_subcommands().front();
        g_command += " " + a->get_name();
    }
    return -1;
}

// ---- the subcommands of a client ----

// produce -r: the regular files under `dir`, sorted, without DYAD's own
// directory (.dyad) and the temporaries of rsync and sed -i (published
// under their real names when renamed). Symbolic links are not followed.
std::vector<std::string> files_under(const std::string& dir, dyad::Status* err) {
    namespace fs = std::filesystem;
    std::vector<std::string> out;
    std::error_code ec;
    fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
        const auto& p = it->path();
        const std::string name = p.filename().string();
        if (it->is_directory(ec) && !it->is_symlink(ec)) {
            if (name == dyad::kReservedDir) it.disable_recursion_pending();
            continue;
        }
        if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
        if (dyad::capi::is_tool_temporary(name.c_str())) continue;
        out.push_back(p.string());
    }
    if (ec) *err = dyad::Status(DYAD_RC_BADFIO, "cannot list '" + dir + "'", ec.value());
    std::sort(out.begin(), out.end());
    return out;
}

bool is_directory(const std::string& path) {
    struct stat sb;
    return ::stat(path.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode);
}

// Publishes of `dyad produce FILE...` in flight at once.
constexpr size_t kProduceWindow = 16;

int run_produce(dyad::client::Client& c, const Cli& o) {
    int rc = 0;
    std::vector<std::string> files;
    for (const auto& f : o.files) {
        // Not a directory under the producer directory (the directory
        // itself, or outside it): the client says which.
        if (!is_directory(f) || (!o.recursive && !c.producer_upath(f))) {
            files.push_back(f);
            continue;
        }
        if (!o.recursive) {
            rc = report(dyad::Status(DYAD_RC_BADFIO,
                                     "is a directory: 'dyad produce -r " + f +
                                         "' publishes every file under it",
                                     EISDIR),
                        f);
            continue;
        }
        dyad::Status err;
        auto under = files_under(f, &err);
        if (!err) rc = report(err, f);
        if (under.empty() && err)
            std::fprintf(stderr, "%s %s: no regular file under it to publish\n", g_command.c_str(),
                         f.c_str());
        files.insert(files.end(), under.begin(), under.end());
    }
    // Several publishes in flight, so that the node's service batches
    // their records (into one etcd transaction: docs/design.md, "etcd at
    // etcd's speed"); lines and errors in the order of the files. An error
    // every file would meet (the service cannot be reached) stops the
    // command: the files not sent yet are counted, not attempted.
    const size_t n = files.size();
    std::vector<std::optional<dyad::Status>> done(n);
    std::mutex mu;
    std::condition_variable cv;
    size_t next = 0, running = 0;
    bool stop = false;
    auto worker = [&] {
        std::unique_lock<std::mutex> lk(mu);
        while (!stop && next < n) {
            const size_t i = next++;
            lk.unlock();
            dyad::Status s = c.produce(files[i]);
            const bool fatal = !s && service_failure(c, s);
            lk.lock();
            done[i] = std::move(s);
            if (fatal) stop = true;
            cv.notify_all();
        }
        --running;
        cv.notify_all();
    };
    std::vector<std::thread> workers;
    running = std::min(n, kProduceWindow);
    for (size_t k = 0; k < running; ++k) workers.emplace_back(worker);
    size_t printed = 0;
    for (; printed < n; ++printed) {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return done[printed].has_value() || running == 0; });
        if (!done[printed]) break;  // never sent
        dyad::Status s = std::move(*done[printed]);
        lk.unlock();
        const auto& f = files[printed];
        if (!s) {
            rc = report(s, f);
        } else if (o.json) {
            std::cout << nlohmann::json{{"file", f}, {"action", "produced"}, {"ok", true}}.dump(
                             -1, ' ', false, kBadUtf8Replaced)
                      << "\n";
        } else {
            std::cout << "produced " << f << "\n";
        }
    }
    for (auto& t : workers) t.join();
    // Every file handed to a worker has its line above: the rest were
    // never sent.
    const size_t left = n - printed;
    not_attempted(left);
    return rc;
}

int run_rm(dyad::client::Client& c, const Cli& o) {
    return dyad::tools::unpublish_files(
        c, o.files, o.json,
        [](const dyad::Status& s, const std::string& f) { return report(s, f); });
}

// Runs the parsed subcommand; returns the exit code.
int dispatch(const Commands& c, Cli& o, dyad::job::Options& job_options) {
    if (*c.job.job) return dyad::job::run(c.job, job_options);
    if (*c.keygen) return run_keygen(o);
    if (*c.doctor)
        return o.doctor_site ? dyad::tools::doctor_site(o.slurm_conf, o.json)
                             : dyad::tools::doctor(o.json);
    g_json = o.json;
    auto cfg = dyad::Config::from_env();
    if (!cfg && !*c.config) return report(cfg.status());
    if (cfg) {
        if (o.timeout >= 0) cfg->wait_timeout = o.timeout;
        dyad::log::set_level(cfg->log_level);
        g_debug = cfg->log_level <= dyad::log::Level::debug;
    }
    if (c.status_wait->count()) {
        o.status_wait = 60;
        if (!o.status_wait_text.empty() && !parse_duration(o.status_wait_text, &o.status_wait)) {
            std::fprintf(stderr,
                         "%s: --wait: '%s' is not a duration: give seconds (30, 2.5) or a "
                         "number with a unit s, m or h (90s, 10m, 1h)\n",
                         g_command.c_str(), o.status_wait_text.c_str());
            return 1;
        }
    }
    if (*c.config) {
        g_json = false;  // its document says the error
        return run_config(o, cfg);
    }
    if (*c.key) return run_key(o, cfg.value());
    auto client = dyad::client::Client::create(cfg.value());
    // Every reason a client cannot be made is this process's configuration
    // (a transport, a key file that cannot be read): exit 1.
    if (!client) return report(client.status(), "", "", 1);
    // The subcommands of a client.
    const std::pair<const CLI::App*, int (*)(dyad::client::Client&, const Cli&)> table[] = {
        {c.produce, run_produce}, {c.consume, run_consume}, {c.sync, run_sync}, {c.stat, run_stat},
        {c.ls, run_ls},           {c.status, run_status},   {c.rm, run_rm}};
    for (const auto& [app, run] : table)
        if (*app) return run(*client.value(), o);
    return 1;
}

}  // namespace

int main(int argc, char** argv) {
    std::signal(SIGPIPE, SIG_IGN);
    CLI::App app{
        "dyad: produce and consume files through DYAD, inspect the metadata and the services.\n"
        "Configuration comes from DYAD_* environment variables (see 'dyad config')."};
    app.footer(kExitCodes);
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("dyad ") + dyad_version(),
                         "print the version and exit");
    Cli o;
    std::vector<char*> args = arguments(argc, argv, &o.json);
    bool json_flag = false;
    app.add_flag("--json", json_flag, "machine-readable output (anywhere on the command line)");
    Commands c{};
    add_file_commands(app, o, c);
    add_info_commands(app, o, c);
    dyad::job::Options job_options;
    c.job = dyad::job::add_commands(app, job_options);
    if (int rc = parse(app, args); rc >= 0) return rc;
    o.json = o.json || json_flag;
    return dispatch(c, o, job_options);
}
