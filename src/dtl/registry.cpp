// SPDX-License-Identifier: Apache-2.0
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <mutex>

#include <dyad/common/dyad_dtl.h>

#include "common/log.hpp"
#include "common/settings.hpp"
#include "dtl.hpp"
#include "fetch_many.hpp"
#ifdef DYAD_ENABLE_OFI
#include "plugin.h"
#endif

namespace dyad::dtl {

Backend stream_backend();
Backend local_backend();
#ifdef DYAD_ENABLE_UCX
Backend ucx_backend();
#endif
#ifdef DYAD_ENABLE_OFI
namespace {
// What a plugin file says about its build (plugin.h: the id after the
// marker), for a plugin that cannot be loaded or checked otherwise; "" if
// the file holds none (not a plugin of a DYAD that records it).
std::string build_id_in_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return "";
    std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::string marker = DYAD_DTL_BUILD_ID_MARKER;
    size_t at = data.find(marker);
    if (at == std::string::npos) return "";
    at += marker.size();
    size_t end = data.find('\0', at);
    if (end == std::string::npos || end - at > 1024) return "";
    return data.substr(at, end - at);
}

std::string mismatch(const std::string& path, const std::string& theirs) {
    return path + " was built for another DYAD or compiler (plugin: ABI " + theirs +
           "; this libdyad: ABI " + std::to_string(DYAD_DTL_PLUGIN_ABI_VERSION) + ", build '" +
           DYAD_DTL_BUILD_ID +
           "'): rebuild and reinstall the plugin with this DYAD (it must come from the same "
           "build as libdyad.so)";
}

// Opens one candidate and checks its entry point (plugin.h). The backend, or
// why this file is not usable.
// Libraries the plugin pulls in may install signal handlers when loaded:
// libfabric links PSM's libinfinipath, whose constructor takes SIGSEGV,
// SIGBUS, SIGILL, SIGABRT, SIGINT and SIGFPE to write `<program>.<...>.btr`
// backtrace files into the working directory, replacing the program's own
// handlers (dyadd's crash log, an application's). The handlers in place
// before loading are put back.
void* dlopen_keeping_signals(const char* path) {
    const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT, SIGFPE, SIGTERM, SIGQUIT};
    struct sigaction before[sizeof sigs / sizeof sigs[0]];
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; ++i)
        sigaction(sigs[i], nullptr, &before[i]);
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; ++i)
        sigaction(sigs[i], &before[i], nullptr);
    return h;
}

Result<const Backend*> open_plugin(const std::string& path) {
    void* h = dlopen_keeping_signals(path.c_str());
    if (!h) {
        std::string err = dlerror();
        if (access(path.c_str(), F_OK) != 0)
            return Status(DYAD_RC_MARGOINIT_FAIL, path + ": not found", ENOENT);
        std::string theirs = build_id_in_file(path);
        if (!theirs.empty() && theirs != DYAD_DTL_BUILD_ID)
            return Status(DYAD_RC_MARGOINIT_FAIL,
                          mismatch(path, "?, build '" + theirs + "'") + " [dlopen: " + err + "]");
        return Status(DYAD_RC_MARGOINIT_FAIL, path + ": " + err);
    }
    // A rejected plugin stays loaded (RTLD_LOCAL, none of its code called):
    // unloading would run the destructors of a build we do not trust.
    auto entry = reinterpret_cast<dyad_dtl_plugin_entry_fn>(dlsym(h, DYAD_DTL_PLUGIN_ENTRY));
    if (!entry) {
        std::string theirs = build_id_in_file(path);
        return Status(DYAD_RC_MARGOINIT_FAIL,
                      mismatch(path, std::string("? (no entry point ") + DYAD_DTL_PLUGIN_ENTRY +
                                         ")" + (theirs.empty() ? "" : ", build '" + theirs + "'")));
    }
    const dyad_dtl_plugin_t* p = entry();
    if (!p) return Status(DYAD_RC_MARGOINIT_FAIL, path + ": the entry point returned nothing");
    if (p->abi_version != DYAD_DTL_PLUGIN_ABI_VERSION || p->struct_size < sizeof(dyad_dtl_plugin_t))
        return Status(DYAD_RC_MARGOINIT_FAIL,
                      mismatch(path, std::to_string(p->abi_version) + " (struct of " +
                                         std::to_string(p->struct_size) + " bytes)"));
    std::string theirs = p->build_id ? p->build_id : "";
    if (theirs != DYAD_DTL_BUILD_ID)
        return Status(DYAD_RC_MARGOINIT_FAIL,
                      mismatch(path, std::to_string(p->abi_version) + ", build '" + theirs + "'"));
    if (p->use_log) p->use_log(&log::host());
    void* b = p->backend ? p->backend() : nullptr;
    if (!b) return Status(DYAD_RC_MARGOINIT_FAIL, path + ": the plugin made no backend");
    return static_cast<const Backend*>(b);
}

// libdyad_ofi.so, next to the library or program holding this code
// (libdyad.so, the wrapper; dyadd, the dyad tool), in ../lib from it, or in
// the installation's library directory seen from its bin/ (DYAD_BIN_TO_LIB:
// ../lib/x86_64-linux-gnu for the prefix /usr on Debian); loaded once on
// first use.
Result<const Backend*> load_ofi() {
    static std::once_flag once;
    static const Backend* loaded = nullptr;
    static Status failed;
    std::call_once(once, [] {
        Dl_info info{};
        std::string dir = ".";
        if (dladdr(reinterpret_cast<void*>(&load_ofi), &info) && info.dli_fname) {
            dir = info.dli_fname;
            dir = dir.substr(
                0, dir.find_last_of('/') == std::string::npos ? 0 : dir.find_last_of('/'));
        }
        // "prefix/bin/../lib" (the loader's path) -> "prefix/lib", for messages;
        // ../lib from lib/ is lib/ itself: tried once.
        std::vector<std::string> dirs;
        for (const std::string& d : {dir, dir + "/../lib", dir + "/" DYAD_BIN_TO_LIB}) {
            char* real = realpath(d.c_str(), nullptr);
            std::string r = real ? real : d;
            free(real);
            if (std::find(dirs.begin(), dirs.end(), r) == dirs.end()) dirs.push_back(r);
        }
        std::string why;
        bool any_found = false;
        for (const std::string& d : dirs) {
            auto b = open_plugin(d + "/libdyad_ofi.so");
            if (b) {
                loaded = b.value();
                return;
            }
            why += (why.empty() ? "" : "; ") + b.status().message();
            any_found = any_found || b.status().err() != ENOENT;
        }
        // Not found: ENOENT; found but unusable: the message says why.
        failed =
            Status(DYAD_RC_MARGOINIT_FAIL, "cannot load the libfabric transport plugin: " + why,
                   any_found ? 0 : ENOENT);
    });
    if (loaded) return loaded;
    return failed;
}

Backend ofi_backend() {
    Backend b;
    b.name = name_of(Kind::ofi);
    b.aliases = aliases_of(Kind::ofi);
    b.attributes = [] {
        auto l = load_ofi();
        if (l) return l.value()->attributes();
        Attributes a;
        a.name = name_of(Kind::ofi);
        a.info = l.status().message();
        return a;
    };
    b.make_receiver = []() -> Result<std::unique_ptr<Receiver>> {
        auto l = load_ofi();
        if (!l) return l.status();
        return l.value()->make_receiver();
    };
    b.make_sender = [](asio::io_context& io,
                       const ServiceBind& bind) -> Result<std::unique_ptr<Sender>> {
        auto l = load_ofi();
        if (!l) return l.status();
        return l.value()->make_sender(io, bind);
    };
    b.warmup = []() -> Status {
        auto l = load_ofi();
        if (!l) return l.status();
        return l.value()->warmup ? l.value()->warmup() : Status::ok();
    };
    return b;
}
}  // namespace
#endif

// Every transport of this build, in one explicit table: the factories come
// from each transport's folder, the policy is here.
const std::vector<Backend>& backends() {
    static const std::vector<Backend> table = [] {
        std::vector<Backend> t;
        auto add = [&t](Backend b, Kind kind, int preference) -> Backend& {
            b.kind = kind;
            b.preference = preference;
            t.push_back(std::move(b));
            return t.back();
        };
        add(stream_backend(), Kind::stream, 2).universal = true;
#ifdef DYAD_ENABLE_UCX
        add(ucx_backend(), Kind::ucx, 1);
#endif
#ifdef DYAD_ENABLE_OFI
        add(ofi_backend(), Kind::ofi, 3);
#endif
        // The consumer reached the owner over TCP, where the open file
        // cannot be passed (local/local.cpp).
        add(local_backend(), Kind::local, 0).start_errnos = {EOPNOTSUPP};
        return t;
    }();
    return table;
}

const Backend& universal_backend() {
    for (const auto& b : backends())
        if (b.universal) return b;
    return backends().front();
}

bool is_local(const std::string& name) {
    auto b = find_backend(name);
    return b && b.value()->kind == Kind::local;
}

int preference(const std::string& name) {
    for (const auto& b : backends())
        if (b.name == name) return b.preference;
    return 1000;
}

Result<std::string> canonical_mode(const std::string& value) {
    if (strcasecmp(value.c_str(), kAutoMode) == 0) return std::string(kAutoMode);
    auto b = find_backend(value);
    if (b) return b.value()->name;
    std::string names;
    for (const auto& k : backends()) {
        names += k.name;
        for (const auto& a : k.aliases) names += " (alias " + a + ")";
        names += ", ";
    }
    names = names.substr(0, names.size() - 2) + " or " + kAutoMode;
    return Status(DYAD_RC_BADDTLMODE,
                  "DYAD_DTL_MODE='" + value + "' is not a transport of this build: use " + names,
                  EINVAL);
}

namespace {
// The transports of this build other than `b`, for a message: "A, B or AUTO".
std::string other_modes(const Backend& b) {
    std::string out;
    for (const auto& k : backends())
        if (&k != &b) out += k.name + ", ";
    return out.substr(0, out.size() - 2) + (out.empty() ? "" : " or ") + kAutoMode;
}
}  // namespace

Status prepare_fixed_mode(const Backend& b) {
    if (!b.warmup) return Status::ok();
    Status w = b.warmup();
    if (w) return w;
    return Status(w.rc(),
                  "DYAD_DTL_MODE=" + b.name + " cannot work in this process: " + w.message() +
                      ". Correct that setting, or set DYAD_DTL_MODE to another transport of "
                      "this build: " +
                      other_modes(b) + " (AUTO leaves out the transports that cannot work here)",
                  w.err());
}

std::string left_out_message(const Backend& b, const std::string& why) {
    return b.name + " cannot work in this process: " + why +
           "; DYAD_DTL_MODE=AUTO leaves it out and moves files by the other transports "
           "(correct that setting to use " +
           b.name + ")";
}

bool batches_small_files(const Backend& b) {
    if (!may_batch(b)) return false;
    if (b.universal) return true;
    auto proto = settings::choice("DYAD_UCX_PROTO", {"auto", "tag", "put"}, {}, DYAD_RC_BADDTLMODE);
    return proto && proto.value() == "auto";
}

Result<const Backend*> find_backend(const std::string& name) {
    std::string built;
    for (const auto& b : backends()) {
        if (strcasecmp(b.name.c_str(), name.c_str()) == 0) return &b;
        for (const auto& a : b.aliases)
            if (strcasecmp(a.c_str(), name.c_str()) == 0) return &b;
        if (!built.empty()) built += ", ";
        built += b.name;
    }
    return Status(DYAD_RC_BADDTLMODE,
                  "transport '" + name + "' is not available in this build (available: " + built +
                      "); set DYAD_DTL_MODE to one of those",
                  ENOTSUP);
}

}  // namespace dyad::dtl
