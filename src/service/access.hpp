// SPDX-License-Identifier: Apache-2.0
// What a keyless node-wide service (root dyadd --allow-uid any, several
// users; docs/security.md, "The node-wide service") lets each local user do,
// decided as the kernel decides it:
//   - a consumer's file is opened with that consumer's file-system
//     credentials (fsuid, fsgid, supplementary groups) on the serving
//     thread: every directory from / down, ACLs and group classes count as
//     they do for `cat` (ActingAs);
//   - a publish proves its user may open the file: the client passes the
//     open descriptor (SCM_RIGHTS), which must be the named file
//     (check_passed_file).
// With a key, or for dyadd's own uid and root, none of this applies: the
// service opens as itself.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "rpc/server.hpp"

namespace dyad::service {

// A user as the file system sees it.
struct FsCreds {
    uid_t uid = 65534;
    gid_t gid = 65534;
    std::vector<gid_t> groups;
    std::string who;  // "uid 1001", for messages
};

// Whether this process may take other users' file-system credentials
// (CAP_SETUID and CAP_SETGID in its effective set: root).
bool can_act_as_users();

// The credentials of `peer`: on the Unix socket the process's own (uid,
// gid, supplementary groups as the kernel gave them at connect); a local
// TCP peer of known uid: that user's primary and supplementary groups
// (passwd, group); a peer of unknown uid: nobody (65534), no groups.
FsCreds creds_of(const rpc::Peer& peer);

// While it lives, the calling thread's fsuid, fsgid and supplementary
// groups are another user's (raw syscalls: glibc's setgroups would change
// every thread of the process). The destructor puts the service's back
// (the process ends if it cannot: a file thread must never keep a user's
// credentials).
class ActingAs {
  public:
    static Result<ActingAs> take(const FsCreds& c);
    ActingAs(ActingAs&& o) noexcept : saved_(std::move(o.saved_)), active_(o.active_) {
        o.active_ = false;
    }
    ActingAs& operator=(ActingAs&&) = delete;
    ~ActingAs();

  private:
    ActingAs() = default;
    void restore();
    std::vector<gid_t> saved_;  // the thread's groups before
    bool active_ = false;
};

// Whether the descriptor a client passed with its publish (`passed`) is the
// file `sb` named `up`, opened for reading: OK, else why not (EACCES).
Status check_passed_file(const std::optional<rpc::PassedFile>& passed, const struct stat& sb,
                         const std::string& up, const std::string& who);

// Whether `c` may read a file `sb` by its permission classes alone (owner,
// group, others; no ACLs): for a dyadd that cannot open files as its peers.
bool class_lets_read(const FsCreds& c, const struct stat& sb);

// "uid 1001", "a peer of unknown uid".
std::string peer_text(const rpc::Peer& peer);

}  // namespace dyad::service
