// SPDX-License-Identifier: Apache-2.0
#include "access.hpp"

#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/log.hpp"

namespace dyad::service {
namespace {

// The calling thread's supplementary groups (the kernel's, per thread).
std::vector<gid_t> thread_groups() {
    int n = ::getgroups(0, nullptr);
    std::vector<gid_t> g(n > 0 ? static_cast<size_t>(n) : 0);
    if (n > 0) {
        n = ::getgroups(n, g.data());
        g.resize(n > 0 ? static_cast<size_t>(n) : 0);
    }
    return g;
}

// setgroups(2) for this thread alone.
bool set_thread_groups(const std::vector<gid_t>& g) {
    return ::syscall(SYS_setgroups, g.size(), g.empty() ? nullptr : g.data()) == 0;
}

// setfsuid/setfsgid do not say whether they failed: the value read back does.
bool set_fsuid(uid_t u) {
    ::setfsuid(u);
    return static_cast<uid_t>(::setfsuid(static_cast<uid_t>(-1))) == u;
}
bool set_fsgid(gid_t g) {
    ::setfsgid(g);
    return static_cast<gid_t>(::setfsgid(static_cast<gid_t>(-1))) == g;
}

}  // namespace

bool can_act_as_users() {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2] = {};
    if (::syscall(SYS_capget, &h, d) != 0) return ::geteuid() == 0;
    const auto has = [&](int cap) { return (d[cap / 32].effective >> (cap % 32)) & 1u; };
    return has(CAP_SETUID) && has(CAP_SETGID);
}

std::string peer_text(const rpc::Peer& peer) {
    return peer.uid >= 0 ? "uid " + std::to_string(peer.uid) : std::string("a peer of unknown uid");
}

FsCreds creds_of(const rpc::Peer& peer) {
    FsCreds c;
    c.who = peer_text(peer);
    if (peer.uid < 0) return c;  // nobody, no groups
    c.uid = static_cast<uid_t>(peer.uid);
    if (peer.gid >= 0) {  // the Unix socket: the process's own, as the kernel gave them
        c.gid = static_cast<gid_t>(peer.gid);
        if (peer.groups) c.groups.assign(peer.groups->begin(), peer.groups->end());
        return c;
    }
    // Over TCP the kernel names the user only: its groups as login gives them.
    struct passwd pw, *found = nullptr;
    std::vector<char> buf(16384);
    if (::getpwuid_r(c.uid, &pw, buf.data(), buf.size(), &found) != 0 || !found) return c;
    c.gid = pw.pw_gid;
    int n = 64;
    std::vector<gid_t> g(static_cast<size_t>(n));
    if (::getgrouplist(pw.pw_name, pw.pw_gid, g.data(), &n) < 0 && n > 64 && n <= 65536) {
        g.resize(static_cast<size_t>(n));
        if (::getgrouplist(pw.pw_name, pw.pw_gid, g.data(), &n) < 0) n = 0;
    } else if (n > 64) {
        n = 0;
    }
    g.resize(static_cast<size_t>(n));
    c.groups = std::move(g);
    return c;
}

Result<ActingAs> ActingAs::take(const FsCreds& c) {
    ActingAs a;
    errno = 0;
    a.saved_ = thread_groups();
    a.active_ = true;
    // Groups and gid first: once fsuid is not root's, the file-system
    // capabilities are gone (CAP_SETGID is not one of them, but keep the
    // order the kernel documents).
    if (!set_thread_groups(c.groups) || !set_fsgid(c.gid) || !set_fsuid(c.uid)) {
        const int e = errno ? errno : EPERM;
        return Status(DYAD_RC_BADFIO,
                      "cannot open a file as " + c.who +
                          " (this dyadd cannot take that user's file-system credentials: run "
                          "the node-wide service as root, or give the job a key)",
                      e);
    }
    return Result<ActingAs>(std::move(a));
}

void ActingAs::restore() {
    if (!active_) return;
    active_ = false;
    if (set_fsuid(::geteuid()) && set_fsgid(::getegid()) && set_thread_groups(saved_)) return;
    // A file thread that kept a user's credentials would serve the next
    // consumer as that user: never go on.
    DYAD_ERROR("dyadd", "cannot restore the service's credentials on a file thread (%s): exiting",
               std::strerror(errno));
    std::abort();
}

ActingAs::~ActingAs() {
    restore();
}

Status check_passed_file(const std::optional<rpc::PassedFile>& passed, const struct stat& sb,
                         const std::string& up, const std::string& who) {
    const std::string why =
        ": without a key, a publish of a user other than dyadd's and root proves that its user "
        "may open the file, passing the open file over the service's Unix socket (DYAD does "
        "this itself: set DYAD_SERVICE_URI=unix:PATH of the node's dyadd)";
    if (!passed)
        return Status(
            DYAD_RC_NOAUTH,
            "cannot publish '" + up + "' for " + who + ": no open file came with it" + why, EACCES);
    if (!S_ISREG(passed->mode) || !passed->readable)
        return Status(DYAD_RC_NOAUTH,
                      "cannot publish '" + up + "' for " + who +
                          ": the descriptor passed is not a regular file opened for reading" + why,
                      EACCES);
    if (passed->dev != static_cast<uint64_t>(sb.st_dev) ||
        passed->ino != static_cast<uint64_t>(sb.st_ino))
        return Status(DYAD_RC_NOAUTH,
                      "cannot publish '" + up + "' for " + who +
                          ": the descriptor passed is another file than the one of that name in "
                          "the producer directory (was it replaced meanwhile?)",
                      EACCES);
    return Status::ok();
}

// Whether `c` may read a file of this owner, group and mode by its
// permission classes alone, as the kernel takes them: the owner's bits for
// the owner, else the group's for a member, else the others' (a member of
// the group is not given the others' bits). ACLs and directories are not
// looked at: for a dyadd that cannot open files as its peers.
bool class_lets_read(const FsCreds& c, const struct stat& sb) {
    if (sb.st_uid == c.uid) return sb.st_mode & S_IRUSR;
    bool member = sb.st_gid == c.gid;
    for (gid_t g : c.groups) member = member || g == sb.st_gid;
    if (member) return sb.st_mode & S_IRGRP;
    return sb.st_mode & S_IROTH;
}

}  // namespace dyad::service
