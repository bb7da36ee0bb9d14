// SPDX-License-Identifier: Apache-2.0
// Checks of transport addresses that peers send, before any transport
// library sees them (docs/security.md, "Transport addresses").
//
// UCX: ucp_ep_create takes a packed worker address without its length and
// unpacks it trusting every byte; garbage makes it read past the buffer or
// abort the process (an always-on assertion on the version nibble). The
// service therefore parses the whole address here first, with the grammar
// of UCX 1.13 (src/ucp/wireup/address.c: header, uuid, client id, worker
// name, devices, transports), bounds-checked and to the last byte, and
// compares it with its own worker's address: a transport both sides have
// must come with address lengths this side produces for it. Only an address
// that passes both reaches UCX. Pure functions: no UCX needed (fuzzed by
// fuzz/fuzz_address.cpp).
//
// libfabric: fi_av_insert reads as many bytes as the address format of the
// endpoint says, whatever the blob's length; a peer's address must have
// exactly the length (and, for socket addresses, the family) of our own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace dyad::dtl {

// One transport of a UCX worker address.
struct UcxAddressEntry {
    uint16_t tl_csum = 0;  // checksum of the transport's name
    unsigned md_index = 0;
    unsigned dev_index = 0;
    size_t dev_addr_len = 0;
    size_t iface_addr_len = 0;
};

struct UcxAddressInfo {
    unsigned version = 0;  // 0: v1, 1: v2 (UCX's UCP_OBJECT_VERSION_*)
    unsigned flags = 0;    // header flags
    bool has_uuid = false;
    uint64_t uuid = 0;
    size_t devices = 0;
    std::vector<UcxAddressEntry> entries;
};

// Parses a packed UCX worker address (what ucp_worker_get_address gives)
// the way UCX 1.13 unpacks it in ucp_ep_create, without trusting a byte:
// DYAD_RC_UCXEP_FAIL with what is wrong and where, or the address's parts.
Result<UcxAddressInfo> parse_ucx_worker_address(const std::string& blob);

// Whether a peer's parsed address fits this worker's own: not our own
// worker, at least one transport in common, and for each transport in
// common, device and interface address lengths that our own address uses
// for that transport.
Status ucx_address_fits(const UcxAddressInfo& peer, const UcxAddressInfo& own);

// UCX 1.13's checksum of the transport name "tcp" (ucs_crc16_string).
constexpr uint16_t kUcxTcpNameCsum = 6607;

// A service whose UCX worker uses only some network interfaces (its listen
// policy: loopback only without a key) has TCP entries in its own address
// for those alone, while a consumer's address has one per interface. UCX
// 1.13's TCP device address is a flags and a family byte, then the IPv4 or
// IPv6 address (6 or 18 bytes), plus the host's 8-byte system id for a
// loopback one (14 or 26): every one of these lengths is UCX's own for TCP,
// whichever interfaces this side has. Adds them to `own` where it has TCP.
void add_ucx_tcp_layouts(UcxAddressInfo* own);

// A consumer's packed window key (what ucp_rkey_pack gives for host
// memory), parsed the way UCX 1.13 reads it in ucp_ep_rkey_unpack
// (src/ucp/core/ucp_rkey.c): an MD map (8 bytes), a memory type (1 byte),
// then for each bit of the map a size byte and that many bytes of the MD's
// key; then either nothing (host memory of no known device) or a system
// device byte and 3-byte distances. ucp_ep_rkey_unpack takes no length and
// trusts every size: a key that passes here ends inside the blob. Windows
// are host memory, so any other memory type is refused. DYAD_RC_UCXRKEY_
// UNPACK_FAILED with what is wrong and where, or the number of MD keys.
struct UcxRkeyInfo {
    uint64_t md_map = 0;
    size_t keys = 0;       // bits in md_map
    size_t key_bytes = 0;  // where the MD keys end
};
Result<UcxRkeyInfo> parse_ucx_rkey(const std::string& blob);

// Bytes of zeros kept after a checked key before UCX unpacks it: an MD's
// unpacker reads its own fixed size (at most 255, a size byte's range)
// whatever size the key declares, so it never reads past the copy.
constexpr size_t kUcxRkeyPadding = 256;

// A libfabric peer address next to our own endpoint's (fi_getname): for
// socket address formats (`sockaddr` true) the same length and address
// family (first two bytes); other formats (shm's names) 1 to 4096 bytes.
Status check_ofi_peer_address(const std::string& peer, const std::string& own, bool sockaddr);

// The UCX_TLS value for dyadd's own worker (the one that connects to
// consumers' addresses), from the user's UCX_TLS (`env`, null if unset):
// the same list without shared-memory transports (sm, shm, posix, sysv,
// cma, knem, xpmem). Over those, a peer's address names a process or a
// segment of this host and a window key an address in it, and dyadd would
// write there with its own privileges; without them it reaches consumers
// only over the network transports, where the address names the peer's own
// worker. DYAD_RC_UCXINIT_FAIL if nothing but shared memory is left.
Result<std::string> ucx_service_tls(const char* env);

// Whether a UCX_TLS value leaves UCX's TCP transport in: empty or `all`, a
// list naming `tcp` (or `tcp:aux`), or an exclusion (`^...`) that does not.
bool ucx_tls_may_use_tcp(const std::string& tls);

}  // namespace dyad::dtl
