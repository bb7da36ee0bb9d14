// SPDX-License-Identifier: Apache-2.0
#include "epoch.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "common/fd.hpp"
#include "common/paths.hpp"

namespace dyad::kvs {

Result<uint32_t> next_epoch(const std::string& state_dir) {
    const std::string advice = ": give dyadd a writable --state-dir";
    Status s = mkdir_p(state_dir, 0700);
    if (!s) return s.wrap("state directory" + advice);
    const std::string path = state_dir + "/" + kEpochFile;
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd.valid())
        return Status(DYAD_RC_BADFIO, "cannot open the store's epoch file '" + path + "'" + advice,
                      errno);
    // Two dyadds started at once with one state directory still get
    // different epochs.
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    while (::fcntl(fd.get(), F_OFD_SETLKW, &fl) != 0) {
        if (errno == EINTR) continue;
        if (errno == ENOLCK || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) break;
        return Status(DYAD_RC_BADFIO, "cannot lock the store's epoch file '" + path + "'", errno);
    }
    char buf[32] = {};
    ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
    if (n < 0)
        return Status(DYAD_RC_BADFIO, "cannot read the store's epoch file '" + path + "'", errno);
    uint64_t epoch = 0;  // the epoch of this run: the number the file holds
    if (n > 0) {
        char* end = nullptr;
        errno = 0;
        unsigned long long v = std::strtoull(buf, &end, 10);
        while (end && (*end == '\n' || *end == ' ')) ++end;
        if (end == buf || !end || *end != '\0' || errno != 0 || v >= UINT32_MAX)
            return Status(DYAD_RC_BADFIO,
                          "the store's epoch file '" + path +
                              "' does not hold a number below 4294967295: it is dyadd's own; "
                              "restore it, or remove it only if no consumer keeps copies of "
                              "files produced earlier (their generations may then repeat)",
                          EINVAL);
        epoch = v;
    }
    std::string next = std::to_string(epoch + 1) + "\n";
    if (::pwrite(fd.get(), next.data(), next.size(), 0) != static_cast<ssize_t>(next.size()) ||
        ::ftruncate(fd.get(), static_cast<off_t>(next.size())) != 0 || ::fsync(fd.get()) != 0)
        return Status(DYAD_RC_BADFIO, "cannot write the store's epoch file '" + path + "'" + advice,
                      errno);
    return static_cast<uint32_t>(epoch);
}

}  // namespace dyad::kvs
