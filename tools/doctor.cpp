// SPDX-License-Identifier: Apache-2.0
// `dyad doctor`: checks in one go what a new user most often gets wrong
// (the settings, the managed directories, the key, the service URI, the
// producer directory the service serves, its metadata store, the chosen
// transport) and says what to fix. Read-only: it creates and publishes
// nothing.
#include "doctor.hpp"
#include "doctor_site.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/client.hpp"
#include "common/auth.hpp"
#include "common/config.hpp"
#include "common/settings.hpp"
#include "proto/service_status.hpp"

namespace dyad::tools {
namespace {

enum class Verdict { ok, note, warn, fail };

struct Check {
    std::string name;
    Verdict verdict = Verdict::ok;
    std::string detail;
    std::string fix;  // what to do ("" when nothing)
};

class Report {
  public:
    void add(std::string name, Verdict v, std::string detail, std::string fix = "") {
        checks_.push_back({std::move(name), v, std::move(detail), std::move(fix)});
    }
    bool failed() const {
        for (const auto& c : checks_)
            if (c.verdict == Verdict::fail) return true;
        return false;
    }
    // As `dyad doctor --site` prints its findings (doctor_site.cpp).
    void print(bool json) const {
        std::vector<Finding> f;
        for (const auto& c : checks_)
            f.push_back({c.name, static_cast<Finding::Verdict>(c.verdict), c.detail, c.fix});
        print_findings(f, json);
    }

  private:
    std::vector<Check> checks_;
};

std::string canonical(const std::string& p) {
    std::error_code ec;
    auto c = std::filesystem::canonical(p, ec);
    return ec ? p : c.string();
}

// One managed directory: set, a directory, writable by this user.
void check_dir(Report& r, const char* var, const std::string& path, const char* role) {
    const std::string name = std::string(role) + " directory";
    if (path.empty()) {
        r.add(name, Verdict::note,
              std::string(var) + " is not set: this process " +
                  (std::string(role) == "producer" ? "publishes" : "consumes") +
                  " nothing through DYAD");
        return;
    }
    struct stat sb;
    if (::stat(path.c_str(), &sb) != 0) {
        r.add(name, Verdict::fail, path + " (" + var + ") does not exist",
              "create it (mkdir -p " + path + ") or point " + var + " at node-local storage");
        return;
    }
    if (!S_ISDIR(sb.st_mode)) {
        r.add(name, Verdict::fail, path + " (" + var + ") is not a directory",
              "point " + std::string(var) + " at a directory");
        return;
    }
    if (::access(path.c_str(), W_OK | X_OK) != 0) {
        r.add(name, Verdict::fail, path + " (" + var + ") is not writable by this user",
              "use a directory of yours, or fix its permissions");
        return;
    }
    r.add(name, Verdict::ok, path);
}

void check_dirs(Report& r, const Config& cfg) {
    check_dir(r, "DYAD_PATH_PRODUCER", cfg.prod_path, "producer");
    check_dir(r, "DYAD_PATH_CONSUMER", cfg.cons_path, "consumer");
    if (cfg.prod_path.empty() && cfg.cons_path.empty()) {
        r.add("directories", Verdict::fail,
              "neither DYAD_PATH_PRODUCER nor DYAD_PATH_CONSUMER is set",
              "set DYAD_PATH_PRODUCER where files are written, DYAD_PATH_CONSUMER where they are "
              "read");
        return;
    }
    if (cfg.prod_path.empty() || cfg.cons_path.empty()) return;
    const std::string p = canonical(cfg.prod_path), c = canonical(cfg.cons_path);
    if (p == c)
        r.add("directories", Verdict::note,
              "producer and consumer directories are the same (" + p +
                  "): reading a file not yet there waits for it to be produced, also in a "
                  "producer's own tools (rsync, sed -i)",
              "give producer steps DYAD_PATH_PRODUCER alone if their tools read what they write");
    else if (c.rfind(p + "/", 0) == 0 || p.rfind(c + "/", 0) == 0)
        r.add("directories", Verdict::warn,
              "one managed directory is inside the other (" + p + ", " + c +
                  "): files there are both produced and consumed",
              "use two separate directories, or the same one for both");
}

void check_key(Report& r) {
    const std::string path = settings::text("DYAD_AUTH_KEY_FILE");
    if (path.empty()) {
        r.add("key", Verdict::note,
              "DYAD_AUTH_KEY_FILE is not set: only a service without a key (loopback and Unix "
              "sockets) will talk to this process");
        return;
    }
    auto k = auth::Key::load(path);
    if (!k) {
        r.add("key", Verdict::fail, "DYAD_AUTH_KEY_FILE: " + k.status().message(),
              "point DYAD_AUTH_KEY_FILE at the job's key file (dyad keygen makes one; mode 0600)");
        return;
    }
    r.add("key", Verdict::ok, path);
}

void check_service(Report& r, client::Client& c, const Config& cfg) {
    auto svc = c.service();
    if (!svc) {
        r.add("service", Verdict::fail, cfg.service_uri + ": " + svc.status().message(),
              "start this node's dyadd (dyadd [OPTIONS] PRODUCER_DIR; in a Slurm job with --dyad "
              "the prolog starts it: see the job's slurmd log), or set DYAD_SERVICE_URI to its "
              "address (unix:PATH or tcp://HOST:PORT)");
        return;
    }
    r.add("service", Verdict::ok,
          cfg.service_uri + ": service " + svc->id + " on node " + svc->node + ", namespace " +
              svc->ns);
    if (!cfg.prod_path.empty() && !svc->producer_dir.empty() &&
        canonical(cfg.prod_path) != canonical(svc->producer_dir))
        r.add(
            "producer dir", Verdict::fail,
            "DYAD_PATH_PRODUCER is " + canonical(cfg.prod_path) + " but the service serves " +
                svc->producer_dir + ": what you produce cannot be published",
            "set DYAD_PATH_PRODUCER=" + svc->producer_dir + ", or use the dyadd of that directory");
    auto raw = c.service_status();
    auto st =
        raw ? proto::ServiceStatus::parse(raw.value()) : Result<proto::ServiceStatus>(raw.status());
    if (!st) {
        r.add("metadata store", Verdict::warn, "the service's status: " + st.status().message());
        return;
    }
    auto ms = st->rest.find("metadata_store");
    // (A service without the section, or with one not an object: no verdict.)
    auto m = proto::StoreHealth::parse(ms != st->rest.end() ? *ms : nlohmann::json());
    if (m) {
        std::string where = (m->backend.empty() ? std::string("store") : m->backend) + " at " +
                            (m->endpoint.empty() ? std::string("?") : m->endpoint);
        if (m->reachable)
            r.add("metadata store", Verdict::ok, where);
        else if (m->starting)
            r.add("metadata store", Verdict::warn,
                  where + " not reached yet, the service is starting: " + m->error,
                  "a job's own etcd elects its leader within a second or two; ask again");
        else
            r.add("metadata store", Verdict::fail,
                  where + " does not answer: " +
                      (m->error.empty() ? std::string("no reason given") : m->error),
                  "start the store (etcd, or the dyadd that hosts it: dyadd --kvs names it)");
    }
    auto names = st->transport_names();
    std::string served;
    for (const auto& n : names) served += (served.empty() ? "" : ", ") + n;
    if (names.empty()) return;
    if (cfg.dtl_mode == "AUTO") {
        r.add("transport", Verdict::ok, "AUTO, among those the service serves: " + served);
        return;
    }
    bool found = false;
    for (const auto& n : names) found = found || n == cfg.dtl_mode;
    if (cfg.dtl_mode == "STREAM")
        for (const auto& n : names) found = found || n == "FLUX_RPC";
    if (cfg.dtl_mode == "OFI")
        for (const auto& n : names) found = found || n == "MARGO";
    if (found)
        r.add("transport", Verdict::ok,
              "DYAD_DTL_MODE=" + cfg.dtl_mode + " (served: " + served + ")");
    else
        r.add("transport", Verdict::warn,
              "DYAD_DTL_MODE=" + cfg.dtl_mode + " is not among what this node's service serves (" +
                  served + "); owners on other nodes may differ",
              "unset DYAD_DTL_MODE (AUTO), or start dyadd with that transport");
}

}  // namespace

int doctor(bool json) {
    Report r;
    auto cfg = Config::from_env();
    if (!cfg) {
        r.add("settings", Verdict::fail, cfg.status().message(),
              "correct the variable (dyad config lists every setting and its source)");
        r.print(json);
        return 1;
    }
    r.add("settings", Verdict::ok, "every DYAD_* variable parses");
    check_dirs(r, cfg.value());
    check_key(r);
    auto c = client::Client::create(cfg.value());
    if (!c)
        r.add("client", Verdict::fail, c.status().message(), "see the message");
    else
        check_service(r, *c.value(), cfg.value());
    // Inside a --dyad job: one metadata store for every node (doctor_job.cpp).
    for (auto& f : job_store_findings())
        r.add(f.name, static_cast<Verdict>(f.verdict), f.detail, f.fix);
    r.print(json);
    return r.failed() ? 1 : 0;
}

}  // namespace dyad::tools
