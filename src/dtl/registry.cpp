#include <dlfcn.h>
#include <strings.h>

#include <mutex>

#include "dtl.hpp"

namespace dyad::dtl {

Backend stream_backend();
Backend local_backend();
#ifdef DYAD_ENABLE_UCX
Backend ucx_backend();
#endif
#ifdef DYAD_ENABLE_OFI
namespace {
// libdyad_ofi.so, next to the library or program holding this code (lib/,
// or ../lib from bin/), loaded once on first use.
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
        std::string tried, err;
        for (const std::string& path : {dir + "/libdyad_ofi.so", dir + "/../lib/libdyad_ofi.so"}) {
            void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
            if (!h) {
                err = dlerror();
                tried += (tried.empty() ? "" : ", ") + path;
                continue;
            }
            auto fn = reinterpret_cast<Backend* (*)()>(dlsym(h, "dyad_ofi_backend"));
            if (fn) {
                loaded = fn();
                return;
            }
            err = "no dyad_ofi_backend in " + path;
        }
        failed = Status(DYAD_RC_MARGOINIT_FAIL,
                        "cannot load the libfabric transport plugin (tried " + tried + "): " + err,
                        ENOENT);
    });
    if (loaded) return loaded;
    return failed;
}

Backend ofi_backend() {
    Backend b;
    b.name = "MARGO";
    b.aliases = {"OFI"};
    b.attributes = [] {
        auto l = load_ofi();
        if (l) return l.value()->attributes();
        Attributes a;
        a.name = "MARGO";
        a.info = l.status().message();
        return a;
    };
    b.make_receiver = []() -> Result<std::unique_ptr<Receiver>> {
        auto l = load_ofi();
        if (!l) return l.status();
        return l.value()->make_receiver();
    };
    b.make_sender = [](asio::io_context& io) -> Result<std::unique_ptr<Sender>> {
        auto l = load_ofi();
        if (!l) return l.status();
        return l.value()->make_sender(io);
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
        Backend stream = stream_backend();
        stream.preference = 2;
        stream.universal = true;
        t.push_back(std::move(stream));
#ifdef DYAD_ENABLE_UCX
        Backend ucx = ucx_backend();
        ucx.preference = 1;
        t.push_back(std::move(ucx));
#endif
#ifdef DYAD_ENABLE_OFI
        Backend ofi = ofi_backend();
        ofi.preference = 3;
        t.push_back(std::move(ofi));
#endif
        Backend local = local_backend();
        local.preference = 0;
        // The producer's file cannot be opened or identified from here.
        local.start_errnos = {EACCES, EPERM, ESTALE, ENOENT, ELOOP};
        t.push_back(std::move(local));
        return t;
    }();
    return table;
}

const Backend& universal_backend() {
    for (const auto& b : backends())
        if (b.universal) return b;
    return backends().front();
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
