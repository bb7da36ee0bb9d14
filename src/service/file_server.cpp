// SPDX-License-Identifier: Apache-2.0
// The file server's checks of a file it is asked for (file_server.hpp):
// taken as serve_file.hpp says, then what this service published (the
// publisher) or a replica it holds (the replica holder), and, without a
// key, whether the peer may read it (access.hpp).
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>

#include "access.hpp"
#include "file_server.hpp"
#include "publisher.hpp"
#include "replica_holder.hpp"

namespace dyad::service {

Status FileServer::take_served(ServedFile& f, const proto::FetchRequest& req, const rpc::Peer& peer,
                               Snapshot* snap) {
    Status ok = f.take();
    if (!ok) return ok;
    if (req.replica) {
        ok = replicas_.check(req, f);
        *snap = Snapshot::of(f.stat());
    } else {
        ok = publisher_.check_served(req, f.stat(), f.upath(), snap);
    }
    if (ok) ok = readable_by(peer, f.stat(), f.upath(), req.replica);
    if (ok.err() == ESTALE) refused_.stale++;
    if (ok.err() == ENOENT) refused_.unproduced++;
    return ok;
}

bool FileServer::opens_as_peer(const rpc::Peer& peer) const {
    return !core_.key && !peer.trusted && core_.act_as_users;
}

Result<ServedFile> FileServer::open_for(const rpc::Peer& peer, const std::string& up) {
    if (!opens_as_peer(peer)) return ServedFile::open(core_.prod_fd.get(), core_.prod_dir, up);
    auto f = ServedFile::open_as(core_.prod_fd.get(), core_.prod_dir, up, creds_of(peer));
    if (!f && f.status().err() == EACCES) refused_.unreadable++;
    return f;
}

Status FileServer::readable_by(const rpc::Peer& peer, const struct stat& sb, const std::string& up,
                               bool replica) {
    // With a key every peer proved it belongs to the job; this service's
    // own uid and root can read what it can anyway.
    if (core_.key || peer.trusted) return Status::ok();
    if (replica) {
        refused_.unreadable++;
        return Status(DYAD_RC_BADFIO,
                      "a replica of '" + up + "' is not served to " + peer_text(peer) +
                          ": without a key a holder cannot tell who may read the original "
                          "(fetch it from its owner, or run the job with a key)",
                      EACCES);
    }
    if (opens_as_peer(peer)) return Status::ok();  // the kernel decided (open_for)
    if (peer.uid >= 0 && class_lets_read(creds_of(peer), sb)) return Status::ok();
    refused_.unreadable++;
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(sb.st_mode & 07777));
    return Status(DYAD_RC_BADFIO,
                  "'" + up + "' is not readable by " + peer_text(peer) + " (mode " + mode +
                      "): this service has no key and serves a user only what that user "
                      "could read itself; make the file readable to it, or run the job "
                      "with a key (dyad keygen, dyadd --auth-key)",
                  EACCES);
}

}  // namespace dyad::service
