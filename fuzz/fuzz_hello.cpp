// SPDX-License-Identifier: Apache-2.0
// The hello: the service's handling of a peer's first frame lives inside
// its Session (src/rpc/session_hello.cpp) and needs a socket, so this target runs
// the same checks on the same inputs: the meta JSON (parse_meta), the
// claimed pid, role and service_id, the nonce (auth::valid_nonce) and the
// proof (Key::verify against a fixed key); and, the other way, what a client
// makes of a refusal (Connection::error_status). Properties: no crash, no
// exception; a nonce is accepted only as 64 hex digits; a proof verifies
// only when it is the right one; every message can be sent back as JSON.
#include <cctype>
#include <cstdint>
#include <string>

#include "common/auth.hpp"
#include "fuzz_check.hpp"
#include "rpc/client.hpp"
#include "rpc/wire.hpp"

using namespace dyad;

namespace {
const std::shared_ptr<const auth::Key>& key() {
    static auto k = auth::Key::from_secret(std::string(32, 'k'));
    return k;
}
const std::string kServiceNonce(2 * auth::kNonceBytes, 'a');

void check_nonce(const std::string& n) {
    bool ok = auth::valid_nonce(n);
    bool hex = n.size() == 2 * auth::kNonceBytes;
    for (char c : n) hex = hex && std::isxdigit(static_cast<unsigned char>(c));
    FUZZ_CHECK(ok == hex);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string text(reinterpret_cast<const char*>(data), size);
    check_nonce(text);
    auto meta = rpc::parse_meta(text);
    if (meta.is_discarded() || !meta.is_object()) return 0;  // "malformed hello"

    // Service side (Session::handle_hello).
    int64_t pid =
        meta.contains("pid") && meta["pid"].is_number_integer() ? meta["pid"].get<int64_t>() : 0;
    (void)pid;
    auto role = meta.find("role");
    if (role != meta.end() && role->is_string() && role->get<std::string>() == "service") {
        auto id = meta.find("service_id");
        bool good = id != meta.end() && id->is_string() && !id->get<std::string>().empty() &&
                    id->get<std::string>().size() <= 255;
        if (good) (void)nlohmann::json({{"service_id", id->get<std::string>()}}).dump();
    }
    auto n = meta.find("nonce");
    if (n != meta.end() && n->is_string()) {
        const std::string& cn = n->get_ref<const std::string&>();
        check_nonce(cn);
        if (auth::valid_nonce(cn)) {
            // The challenge the service answers with.
            // The challenge the service answers with: its proof covers the
            // hello as received (text) and the challenge as sent.
            std::string proof = key()->proof("dyad service", {text, kServiceNonce});
            FUZZ_CHECK(key()->verify(proof, "dyad service", {text, kServiceNonce}));
            FUZZ_CHECK(!key()->verify(proof, "dyad client", {text, kServiceNonce}));
            auto p = meta.find("proof");
            if (p != meta.end() && p->is_string()) {
                const std::string& given = p->get_ref<const std::string&>();
                bool v = key()->verify(given, "dyad client", {text, kServiceNonce, proof});
                FUZZ_CHECK(v ==
                           (given == key()->proof("dyad client", {text, kServiceNonce, proof})));
            }
        }
    }
    auto p = meta.find("proof");
    if (p != meta.end() && p->is_string())
        (void)key()->verify(p->get<std::string>(), "dyad client", {text, kServiceNonce});

    // Client side: a refusal (error frame) or a service's hello.
    rpc::Frame f;
    f.header.type = rpc::Type::error;
    f.header.errnum = size > 0 ? data[0] : 0;
    f.meta = meta;
    Status st = rpc::Connection::error_status(f, "service at tcp://h:1 refused the connection");
    FUZZ_CHECK(!st.is_ok());  // an error frame is never a success
    (void)nlohmann::json({{"msg", st.message()}}).dump();
    (void)rc_name(st.rc());
    return 0;
}
