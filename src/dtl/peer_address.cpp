// SPDX-License-Identifier: Apache-2.0
// Checks of peers' transport addresses (peer_address.hpp).
#include "peer_address.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

namespace dyad::dtl {
namespace {

// The layout of UCX 1.13's packed worker address (src/ucp/wireup/address.c).
constexpr unsigned kV1 = 0, kV2 = 1;
constexpr unsigned kFlagDebugInfo = 1, kFlagUuid = 2, kFlagClientId = 4, kFlagAmOnly = 8;
constexpr uint8_t kNullResource = 0xff;  // an empty address list
constexpr uint8_t kLast = 0x80;          // last device / last interface
constexpr uint8_t kMdEmptyDev = 0x80;    // a device without transports
constexpr uint8_t kDevNumPaths = 0x40;   // number of paths follows
constexpr uint8_t kDevSysDevice = 0x20;  // system device follows
constexpr uint8_t kIfaceHasEp = 0x40;    // endpoint addresses follow
constexpr uint8_t kDevLenMask = 0x1f;    // device address length
constexpr uint8_t kIfaceLenMask = 0x3f;  // interface address length
constexpr uint8_t kMdMaskV1 = 0x1f;
constexpr uint8_t kMdMaskV2 = 0x7f;
constexpr size_t kIfaceAttrV1 = 16;    // 3 floats and prio/flags (non-unified mode)
constexpr size_t kIfaceAttrV2 = 8;     // fp8 figures, prio, segment size, flags
constexpr size_t kMaxResources = 128;  // UCP_MAX_RESOURCES
constexpr unsigned kMaxMds = 64;       // UCP_MAX_MDS

Status bad(const std::string& what, size_t at) {
    return Status(DYAD_RC_UCXEP_FAIL,
                  "malformed UCX worker address: " + what + " (at byte " + std::to_string(at) +
                      "); the consumer must send what ucp_worker_get_address of UCX 1.13 gives",
                  EINVAL);
}

class Reader {
  public:
    explicit Reader(const std::string& b)
        : p_(reinterpret_cast<const uint8_t*>(b.data())), n_(b.size()) {}
    size_t pos() const { return pos_; }
    size_t left() const { return n_ - pos_; }
    bool u8(uint8_t* v) {
        if (left() < 1) return false;
        *v = p_[pos_++];
        return true;
    }
    bool peek(uint8_t* v) const {
        if (left() < 1) return false;
        *v = p_[pos_];
        return true;
    }
    bool bytes(size_t k, const uint8_t** at = nullptr) {
        if (left() < k) return false;
        if (at) *at = p_ + pos_;
        pos_ += k;
        return true;
    }
    // UCX's "byte extended" value: in v2, the masked value equal to the mask
    // means that the value is in the next byte.
    bool extended(uint8_t mask, unsigned version, size_t* v) {
        uint8_t b = 0;
        if (!u8(&b)) return false;
        *v = b & mask;
        if (version != kV1 && *v == mask) {
            if (!u8(&b)) return false;
            *v = b;
        }
        return true;
    }

  private:
    const uint8_t* p_;
    size_t n_;
    size_t pos_ = 0;
};

// The header: version, flags, uuid, client id, worker name.
Status read_header(Reader& r, UcxAddressInfo& a) {
    uint8_t b = 0;
    if (!r.u8(&b)) return bad("empty", 0);
    a.version = b & 0x0f;
    if (a.version == kV1) {
        a.flags = b >> 4;
    } else if (a.version == kV2) {
        if (b >> 4) return bad("bits set beside version 2 in the first byte", 0);
        uint8_t f = 0;
        if (!r.u8(&f)) return bad("truncated in the header", r.pos());
        a.flags = f;
    } else {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", b);
        return bad(std::string("version ") + std::to_string(a.version) + " (first byte " + hex +
                       "); UCX 1.13 knows versions 0 and 1",
                   0);
    }
    if (a.flags & ~(kFlagDebugInfo | kFlagUuid | kFlagClientId | kFlagAmOnly))
        return bad("unknown header flags " + std::to_string(a.flags), 1);
    // A v1 address always carries the worker's uuid.
    a.has_uuid = a.version == kV1 || (a.flags & kFlagUuid);
    if (a.has_uuid) {
        const uint8_t* u = nullptr;
        if (!r.bytes(8, &u)) return bad("truncated in the worker uuid", r.pos());
        std::memcpy(&a.uuid, u, 8);
    }
    if ((a.flags & kFlagClientId) && !r.bytes(8)) return bad("truncated in the client id", r.pos());
    if (a.flags & kFlagDebugInfo) {
        uint8_t len = 0;
        if (!r.u8(&len) || !r.bytes(len)) return bad("truncated in the worker name", r.pos());
    }
    return Status::ok();
}

// One transport (interface) of a device, into a.entries; *last: the
// device's last one.
Status read_transport(Reader& r, UcxAddressInfo& a, size_t md, size_t dev_len, bool* last) {
    if (a.entries.size() >= kMaxResources) return bad("more than 128 transports", r.pos());
    UcxAddressEntry e;
    e.md_index = static_cast<unsigned>(md);
    e.dev_index = static_cast<unsigned>(a.devices);
    e.dev_addr_len = dev_len;
    const uint8_t* csum = nullptr;
    if (!r.bytes(2, &csum)) return bad("truncated in a transport name checksum", r.pos());
    std::memcpy(&e.tl_csum, csum, 2);
    const uint8_t* attr = nullptr;
    size_t attr_len = a.version == kV1 ? kIfaceAttrV1 : kIfaceAttrV2;
    if (!r.bytes(attr_len, &attr)) return bad("truncated in interface attributes", r.pos());
    if (a.version == kV1) {
        float f[3];
        std::memcpy(f, attr, sizeof f);
        for (float x : f)
            if (!std::isfinite(x)) return bad("a non-finite interface figure", r.pos());
        if (f[1] == 0) return bad("an interface without bandwidth", r.pos());
    }
    uint8_t len_byte = 0;
    if (!r.peek(&len_byte)) return bad("truncated at an interface address", r.pos());
    *last = len_byte & kLast;
    if (len_byte & kIfaceHasEp) return bad("endpoint addresses in a worker address", r.pos());
    size_t iface_len = 0;
    if (!r.extended(kIfaceLenMask, a.version, &iface_len))
        return bad("truncated in an interface address length", r.pos());
    if (!r.bytes(iface_len)) return bad("truncated in an interface address", r.pos());
    e.iface_addr_len = iface_len;
    a.entries.push_back(e);
    return Status::ok();
}

// One device with its transports; *last: the address's last device.
Status read_device(Reader& r, UcxAddressInfo& a, bool* last) {
    if (a.devices >= kMaxResources) return bad("more than 128 devices", r.pos());
    // Memory domain: index and the empty-device flag.
    uint8_t md_byte = 0;
    if (!r.peek(&md_byte)) return bad("truncated at a device", r.pos());
    bool empty_dev = md_byte & kMdEmptyDev;
    size_t md = 0;
    if (!r.extended(a.version == kV1 ? kMdMaskV1 : kMdMaskV2, a.version, &md))
        return bad("truncated in a memory domain index", r.pos());
    if (md >= kMaxMds) return bad("memory domain index " + std::to_string(md), r.pos());
    // Device address: flags and length.
    uint8_t dev_byte = 0;
    if (!r.peek(&dev_byte)) return bad("truncated at a device address", r.pos());
    *last = dev_byte & kLast;
    size_t dev_len = 0;
    if (!r.extended(kDevLenMask, a.version, &dev_len))
        return bad("truncated in a device address length", r.pos());
    if (dev_byte & kDevNumPaths) {
        uint8_t paths = 0;
        if (!r.u8(&paths)) return bad("truncated in a number of paths", r.pos());
        if (paths == 0) return bad("a device with 0 paths", r.pos() - 1);
    }
    if ((dev_byte & kDevSysDevice) && !r.bytes(1))
        return bad("truncated in a system device", r.pos());
    if (!r.bytes(dev_len)) return bad("truncated in a device address", r.pos());
    // The device's transports.
    bool last_tl = empty_dev;
    while (!last_tl) {
        Status s = read_transport(r, a, md, dev_len, &last_tl);
        if (!s) return s;
    }
    ++a.devices;
    return Status::ok();
}

}  // namespace

Result<UcxAddressInfo> parse_ucx_worker_address(const std::string& blob) {
    UcxAddressInfo a;
    Reader r(blob);
    Status s = read_header(r, a);
    if (!s) return s;
    uint8_t b = 0;
    if (!r.peek(&b)) return bad("truncated before the first device", r.pos());
    if (b == kNullResource) return bad("no transports at all", r.pos());
    bool last_dev = false;
    while (!last_dev) {
        s = read_device(r, a, &last_dev);
        if (!s) return s;
    }
    if (r.left() != 0)
        return bad(std::to_string(r.left()) + " bytes after the last device", r.pos());
    if (a.entries.empty()) return bad("no transports at all", r.pos());
    return a;
}

Status ucx_address_fits(const UcxAddressInfo& peer, const UcxAddressInfo& own) {
    if (peer.has_uuid && own.has_uuid && peer.uuid == own.uuid)
        return Status(DYAD_RC_UCXEP_FAIL,
                      "the UCX worker address is this service's own: a consumer sends its own",
                      EINVAL);
    bool common = false;
    for (const auto& e : peer.entries) {
        std::set<size_t> dev_lens, iface_lens;
        for (const auto& o : own.entries) {
            if (o.tl_csum != e.tl_csum) continue;
            dev_lens.insert(o.dev_addr_len);
            iface_lens.insert(o.iface_addr_len);
        }
        if (dev_lens.empty()) continue;  // a transport we lack: UCX skips it
        common = true;
        if (!dev_lens.count(e.dev_addr_len) || !iface_lens.count(e.iface_addr_len))
            return Status(DYAD_RC_UCXEP_FAIL,
                          "UCX worker address with a transport (name checksum " +
                              std::to_string(e.tl_csum) + ") whose device or interface address (" +
                              std::to_string(e.dev_addr_len) + " and " +
                              std::to_string(e.iface_addr_len) +
                              " bytes) has a length this service's UCX never uses for it; the "
                              "consumer must use the same UCX release and transports (UCX_TLS)",
                          EINVAL);
    }
    if (!common)
        return Status(DYAD_RC_UCXEP_FAIL,
                      "the consumer's UCX worker address shares no transport with this service: "
                      "set UCX_TLS alike on both sides, or use another DYAD_DTL_MODE",
                      EHOSTUNREACH);
    return Status::ok();
}

void add_ucx_tcp_layouts(UcxAddressInfo* own) {
    std::vector<UcxAddressEntry> more;
    std::set<size_t> seen_iface;
    for (const auto& e : own->entries) {
        if (e.tl_csum != kUcxTcpNameCsum || !seen_iface.insert(e.iface_addr_len).second) continue;
        for (size_t len : {6u, 18u, 14u, 26u}) {
            UcxAddressEntry x = e;
            x.dev_addr_len = len;
            more.push_back(x);
        }
    }
    own->entries.insert(own->entries.end(), more.begin(), more.end());
}

Status check_ofi_peer_address(const std::string& peer, const std::string& own, bool sockaddr) {
    // Names of other formats (shm's "fi_shm://PID" strings) vary in length:
    // bounded, never empty.
    if (!sockaddr) {
        if (peer.empty() || peer.size() > 4096)
            return Status(DYAD_RC_BADRPC,
                          "the service's libfabric address has " + std::to_string(peer.size()) +
                              " bytes: service and consumer must use the same provider "
                              "(DYAD_MARGO_PROTO; the service uses the one the consumer asks for)",
                          EPROTO);
        return Status::ok();
    }
    if (peer.size() != own.size())
        return Status(DYAD_RC_BADRPC,
                      "the service's libfabric address has " + std::to_string(peer.size()) +
                          " bytes where this provider's have " + std::to_string(own.size()) +
                          ": service and consumer must use the same provider (DYAD_MARGO_PROTO; "
                          "the service uses the one the consumer asks for)",
                      EPROTO);
    if (sockaddr && own.size() >= 2 && std::memcmp(peer.data(), own.data(), 2) != 0)
        return Status(DYAD_RC_BADRPC,
                      "the service's libfabric address is of another address family than this "
                      "provider's: service and consumer must use the same provider",
                      EPROTO);
    return Status::ok();
}

Result<UcxRkeyInfo> parse_ucx_rkey(const std::string& blob) {
    auto bad_key = [](const std::string& what, size_t at) {
        return Status(DYAD_RC_UCXRKEY_UNPACK_FAILED,
                      "malformed UCX window key: " + what + " (at byte " + std::to_string(at) +
                          "); the consumer must send what ucp_rkey_pack of UCX 1.13 gives for "
                          "its host-memory window",
                      EINVAL);
    };
    constexpr size_t kMaxKey = 8 + 1 + kMaxMds * 256 + 1 + 255 * 3;
    if (blob.size() > kMaxKey)
        return bad_key("longer than any packed key (" + std::to_string(blob.size()) + " bytes)",
                       kMaxKey);
    Reader r(blob);
    const uint8_t* p = nullptr;
    if (!r.bytes(8, &p)) return bad_key("shorter than its MD map", 0);
    UcxRkeyInfo info;
    std::memcpy(&info.md_map, p, 8);  // host order, as UCX packs it
    if (info.md_map == 0) return bad_key("no memory domain in the MD map", 0);
    uint8_t mem_type = 0;
    if (!r.u8(&mem_type)) return bad_key("no memory type", 8);
    if (mem_type != 0)  // UCS_MEMORY_TYPE_HOST
        return bad_key("memory type " + std::to_string(mem_type) + " is not host memory", 8);
    for (unsigned bit = 0; bit < 64; ++bit) {
        if (!(info.md_map >> bit & 1)) continue;
        size_t at = r.pos();
        uint8_t n = 0;
        if (!r.u8(&n) || !r.bytes(n))
            return bad_key("the key of MD " + std::to_string(bit) + " ends past the blob", at);
        ++info.keys;
    }
    info.key_bytes = r.pos();
    if (r.left() > 0) {  // a system device and its distances
        size_t at = r.pos();
        uint8_t dev = 0;
        r.u8(&dev);
        if (r.left() % 3 != 0)
            return bad_key("system device distances of " + std::to_string(r.left()) +
                               " bytes, not a multiple of 3",
                           at + 1);
    }
    return info;
}

bool ucx_tls_may_use_tcp(const std::string& tls) {
    if (tls.empty()) return true;
    const bool exclude = tls[0] == '^';
    bool named = false;
    for (size_t i = exclude ? 1 : 0; i <= tls.size();) {
        size_t j = std::min(tls.find(',', i), tls.size());
        std::string t = tls.substr(i, j - i);
        t = t.substr(0, t.find(':'));
        if (t == "tcp" || (!exclude && t == "all")) named = true;
        i = j + 1;
    }
    return exclude ? !named : named;
}

Result<std::string> ucx_service_tls(const char* env) {
    static const std::set<std::string> shm = {"sm", "shm", "posix", "sysv", "cma", "knem", "xpmem"};
    std::string v = env ? env : "";
    if (v.empty() || v == "all") return std::string("^sm");
    bool exclude = v[0] == '^';
    std::string kept;
    bool network = false;  // a transport that reaches another process
    size_t pos = exclude ? 1 : 0;
    while (pos <= v.size()) {
        size_t end = v.find(',', pos);
        if (end == std::string::npos) end = v.size();
        std::string t = v.substr(pos, end - pos);
        pos = end + 1;
        if (t.empty()) continue;
        // "tcp:aux" and the like: the name is before the colon.
        if (!exclude && shm.count(t.substr(0, t.find(':')))) continue;
        network = network || t.substr(0, t.find(':')) != "self";
        kept += (kept.empty() ? "" : ",") + t;
    }
    if (exclude) return "^" + kept + (kept.empty() ? "" : ",") + "sm";
    if (!network)
        return Status(
            DYAD_RC_UCXINIT_FAIL,
            "UCX_TLS=" + v +
                " names only shared-memory transports (or self), which dyadd never uses toward "
                "consumers (their addresses would name processes of this host): add a "
                "network transport (tcp, rc, ud, dc), leave UCX_TLS unset, or set "
                "DYAD_UCX_SHARED_MEMORY=1 for dyadd where every key holder may write "
                "into every process of dyadd's user",
            EINVAL);
    return kept;
}

}  // namespace dyad::dtl
