// SPDX-License-Identifier: Apache-2.0
// The TLS files of a job's own etcd, derived from the job key on each node
// without anything being sent: a CA whose Ed25519 key is derived from the
// job key (the same on every node; each node writes its own copy of its
// certificate), and this node's certificate for serving clients and peers
// and for being a client (its own key, derived too), signed by that CA.
// Only holders of the job key can make a certificate the job's etcd
// accepts (docs/security.md, "The job's own etcd").
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <sodium.h>

#include <cstring>
#include <memory>
#include <string>

#include "common/auth.hpp"
#include "job/etcd.hpp"

namespace dyad::job::detail {
namespace {

template <typename T, void (*F)(T*)>
struct Free {
    void operator()(T* p) const { F(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, Free<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Free<X509, X509_free>>;

// An Ed25519 key from 32 bytes derived from the job key (label, part).
Pkey derived_key(const auth::Key& key, const char* label, const std::string& part) {
    const std::string hex = key.proof(label, {part});
    unsigned char seed[32];
    size_t len = 0;
    if (::sodium_hex2bin(seed, sizeof seed, hex.data(), 64, nullptr, &len, nullptr) != 0 ||
        len != sizeof seed)
        return nullptr;
    Pkey k(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed, sizeof seed));
    ::sodium_memzero(seed, sizeof seed);
    return k;
}

bool add_ext(X509* x, X509* issuer, int nid, const char* value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, x, nullptr, nullptr, 0);
    X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (!e) return false;
    bool ok = X509_add_ext(x, e, -1) == 1;
    X509_EXTENSION_free(e);
    return ok;
}

Cert make_cert(EVP_PKEY* subject_key, const std::string& cn, X509* issuer, long serial) {
    Cert x(X509_new());
    if (!x) return nullptr;
    X509_set_version(x.get(), 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x.get()), serial);
    X509_gmtime_adj(X509_getm_notBefore(x.get()), -24L * 3600);  // nodes' clocks differ
    X509_gmtime_adj(X509_getm_notAfter(x.get()), 400L * 24 * 3600);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(x.get()), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
    X509_set_issuer_name(x.get(), X509_get_subject_name(issuer ? issuer : x.get()));
    X509_set_pubkey(x.get(), subject_key);
    return x;
}

std::string pem_of(X509* x, EVP_PKEY* k) {
    BIO* b = BIO_new(BIO_s_mem());
    if (!b) return "";
    bool ok = x ? PEM_write_bio_X509(b, x) == 1
                : PEM_write_bio_PrivateKey(b, k, nullptr, nullptr, 0, nullptr, nullptr) == 1;
    char* data = nullptr;
    long n = BIO_get_mem_data(b, &data);
    std::string out = ok && n > 0 ? std::string(data, static_cast<size_t>(n)) : "";
    BIO_free(b);
    return out;
}

}  // namespace

Result<TlsFiles> derive_tls(const std::string& key_hex, const std::string& node,
                            const std::string& addr) {
    auto key = auth::Key::from_secret(key_hex);
    if (!key) return Status(DYAD_RC_BAD_CLI_PARSE, "the job key is not valid", EINVAL);
    Pkey ca_key = derived_key(*key, "dyad-job-etcd-ca-v1", "");
    Pkey node_key = derived_key(*key, "dyad-job-etcd-node-v1", node);
    if (!ca_key || !node_key) return Status(DYAD_RC_SYSFAIL, "cannot make the etcd TLS keys", EIO);
    Cert ca = make_cert(ca_key.get(), "DYAD job etcd CA", nullptr, 1);
    bool ok = ca && add_ext(ca.get(), ca.get(), NID_basic_constraints, "critical,CA:TRUE") &&
              add_ext(ca.get(), ca.get(), NID_key_usage, "critical,keyCertSign,cRLSign") &&
              add_ext(ca.get(), ca.get(), NID_subject_key_identifier, "hash") &&
              X509_sign(ca.get(), ca_key.get(), nullptr) > 0;
    // The node's certificate: its address (peers check it), the name every
    // member carries (DYAD's clients check it: kEtcdServerName) and loopback.
    std::string host = addr;
    if (!host.empty() && host.front() == '[') host = host.substr(1, host.size() - 2);
    const std::string san =
        "IP:" + host + ",IP:127.0.0.1,DNS:" + std::string(kEtcdServerName) + ",DNS:" + node;
    const long serial = 2 + static_cast<long>(std::hash<std::string>{}(node)&0x7fffffff);
    Cert leaf = ok ? make_cert(node_key.get(), "dyad-job-member", ca.get(), serial) : nullptr;
    ok = leaf && add_ext(leaf.get(), ca.get(), NID_basic_constraints, "critical,CA:FALSE") &&
         add_ext(leaf.get(), ca.get(), NID_key_usage, "critical,digitalSignature") &&
         add_ext(leaf.get(), ca.get(), NID_ext_key_usage, "serverAuth,clientAuth") &&
         add_ext(leaf.get(), ca.get(), NID_subject_alt_name, san.c_str()) &&
         add_ext(leaf.get(), ca.get(), NID_authority_key_identifier, "keyid:always") &&
         X509_sign(leaf.get(), ca_key.get(), nullptr) > 0;
    if (!ok) return Status(DYAD_RC_SYSFAIL, "cannot make the etcd TLS certificates (OpenSSL)", EIO);
    TlsFiles t;
    t.ca = pem_of(ca.get(), nullptr);
    t.cert = pem_of(leaf.get(), nullptr);
    t.key = pem_of(nullptr, node_key.get());
    if (t.ca.empty() || t.cert.empty() || t.key.empty())
        return Status(DYAD_RC_SYSFAIL, "cannot write the etcd TLS certificates (OpenSSL)", EIO);
    return t;
}

std::string derive_etcd_password(const std::string& key_hex) {
    auto key = auth::Key::from_secret(key_hex);
    return key ? key->proof("dyad-job-etcd-root-password-v1", {}) : "";
}

}  // namespace dyad::job::detail
