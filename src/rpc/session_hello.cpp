// SPDX-License-Identifier: Apache-2.0
// The hello exchange on the service's side (docs/wire-protocol.md section
// 4): who the peer says it is (pid, role, service id), who the kernel says
// it is (SO_PEERCRED on a Unix socket), the challenge and the proofs of a
// keyed service, then admission. Without a key, role "service" is
// admitted only from this service's own uid and root when the peer is on
// this host (the kernel says who it is; a remote peer is served without a
// key only under --insecure). Nothing about this service is said before
// the peer is admitted: a refused peer gets one error frame
// ("authentication required" and why) and the close.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "common/json_text.hpp"
#include "common/log.hpp"
#include "session.hpp"

namespace dyad::rpc {

bool Session::handle_hello(std::string raw, const nlohmann::json& meta) {
    const AuthPolicy& auth = server_.auth();
    if (h_.type != Type::hello || !meta.is_object()) {
        if (auth.key || awaiting_proof_ || h_.type == Type::hello)
            return refuse(h_.type == Type::hello
                              ? "authentication required: malformed hello"
                              : "authentication required: the first frame must be a hello");
        protocol_error(h_.tag, "first frame must be hello");
        return false;
    }
    if (awaiting_proof_) return check_proof(meta);
    peer_.pid =
        meta.contains("pid") && meta["pid"].is_number_integer() ? meta["pid"].get<int64_t>() : 0;
    auto role = meta.find("role");
    if (role != meta.end() && role->is_string() && role->get<std::string>() == "service") {
        auto id = meta.find("service_id");
        if (id == meta.end() || !id->is_string() || id->get<std::string>().empty() ||
            id->get<std::string>().size() > 255)
            return refuse("a service's hello must carry its service_id");
        peer_.role = "service";
        peer_.service_id = id->get<std::string>();
    }
    if (!check_uid()) return false;
    if (!auth.key && peer_.role == "service" && peer_.local && !peer_.trusted)
        return refuse(
            (peer_.uid >= 0 ? "uid " + std::to_string(peer_.uid) : std::string("a local process")) +
            " may not speak as a service here: without a key, only dyadd's own user (uid " +
            std::to_string(::geteuid()) +
            ") and root are services of this node (docs/security.md, \"The node-wide "
            "service\"); connect as a client, or run the job with a key (dyad keygen)");
    // A client that names the service it wants talks to that one only.
    const std::string own_id = server_.hello_info().value("service_id", std::string());
    auto expect = meta.find("expect");
    if (expect != meta.end() && (!expect->is_string() || expect->get<std::string>() != own_id))
        return refuse(
            "this is not the service the client expected (it asked for another service id): "
            "check the URI it was given (DYAD_SERVICE_URI) or the record's endpoint");
    if (!auth.key) return admit();
    auto n = meta.find("nonce");
    if (n == meta.end() || !n->is_string() || !auth::valid_nonce(n->get<std::string>()))
        return refuse(
            "authentication required: this service accepts only peers that hold the job's "
            "key (set DYAD_AUTH_KEY_FILE)");
    return challenge(std::move(raw), own_id);
}

// The challenge says who this service is and how it sees the connection;
// its proof covers the client's hello as received (`raw`) and the challenge
// as sent, so a relay can change neither.
bool Session::challenge(std::string raw, const std::string& own_id) {
    const AuthPolicy& auth = server_.auth();
    nlohmann::json binding = nlohmann::json::object();
    if (unix_) {
        binding["pid"] = static_cast<int64_t>(::getpid());
    } else {
        binding["local"] = socket_endpoint(sock_.native_handle(), false);
        binding["peer"] = socket_endpoint(sock_.native_handle(), true);
    }
    nlohmann::json challenge = {{"auth", auth::kScheme},
                                {"binding", std::move(binding)},
                                {"nonce", auth::new_nonce()},
                                {"service_id", own_id},
                                {"wire_version", kVersion}};
    client_hello_ = std::move(raw);
    challenge_ = challenge.dump(-1, ' ', false, kBadUtf8Replaced);
    service_proof_ = auth.key->proof("dyad service", {client_hello_, challenge_});
    awaiting_proof_ = true;
    Header r;
    r.type = Type::hello;
    nlohmann::json sent = {
        {"auth", auth::kScheme}, {"challenge", challenge_}, {"proof", service_proof_}};
    send(r, sent.dump(-1, ' ', false, kBadUtf8Replaced), {}, {});
    return true;
}

// The client's second hello: its proof over the transcript.
bool Session::check_proof(const nlohmann::json& meta) {
    const AuthPolicy& auth = server_.auth();
    auto p = meta.find("proof");
    if (p == meta.end() || !p->is_string() ||
        !auth.key->verify(p->get<std::string>(), "dyad client",
                          {client_hello_, challenge_, service_proof_}))
        return refuse(
            "authentication failed: the peer does not hold this service's key, or its "
            "hello was not the one this service answered (check DYAD_AUTH_KEY_FILE: it "
            "must be the file dyadd was given with --auth-key; and that nothing relays "
            "the connection)");
    peer_.authenticated = true;
    // From here on, every frame each way carries a tag under its
    // direction's key, derived from this connection's transcript.
    rx_mac_ =
        auth::FrameMac(auth.key->derive("dyad client to service", {client_hello_, challenge_}));
    tx_mac_ =
        auth::FrameMac(auth.key->derive("dyad service to client", {client_hello_, challenge_}));
    return admit();
}

// Unix socket peers: the kernel says who they are.
bool Session::check_uid() {
    if (!unix_) return true;
    struct ucred cred {};
    socklen_t cl = sizeof cred;
    if (::getsockopt(sock_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0)
        return refuse("cannot tell who the peer on the Unix socket is");
    peer_.uid = cred.uid;
    const AuthPolicy& auth = server_.auth();
    if (auth.any_uid || cred.uid == 0 || cred.uid == ::geteuid() ||
        std::find(auth.uids.begin(), auth.uids.end(), cred.uid) != auth.uids.end())
        return true;
    return refuse("uid " + std::to_string(cred.uid) +
                  " may not use this service's Unix socket (it serves uid " +
                  std::to_string(::geteuid()) + " and root; see dyadd --allow-uid)");
}

bool Session::admit() {
    hello_done_ = true;
    awaiting_proof_ = false;
    client_hello_ = std::string();
    challenge_ = std::string();
    service_proof_ = std::string();
    hello_timer_.cancel();
    last_activity_ = std::chrono::steady_clock::now();
    arm_idle(server_.idle_timeout());
    Header r;
    r.type = Type::hello;
    nlohmann::json info = server_.hello_info();
    info["auth"] = server_.auth().key ? auth::kScheme : "none";
    send(r, info.dump(-1, ' ', false, kBadUtf8Replaced), {}, {});
    return true;
}

bool Session::refuse(const std::string& msg) {
    server_.count_auth_refused();
    if (server_.peer_warning_allowed())
        DYAD_WARN("rpc", "refused a peer (pid %lld): %s", static_cast<long long>(peer_.pid),
                  msg.c_str());
    send_error(0, EACCES, msg, DYAD_RC_NOAUTH, true);
    return false;
}

}  // namespace dyad::rpc
