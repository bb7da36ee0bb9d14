// SPDX-License-Identifier: Apache-2.0
// Raw fi_read bandwidth on one libfabric protocol: the yardstick for the
// MARGO/OFI rows of `make bench`. Endpoint setup is DYAD's own (same
// provider, same hints); the measured loop is plain fi_read of `size` bytes,
// `depth` reads in flight, memory to memory.
//
//   ofi_read_bw server PROTO            prints "ADDR_HEX KEY BASE", then serves
//   ofi_read_bw client PROTO ADDR_HEX KEY BASE SIZE COUNT DEPTH
//                                       prints the bandwidth in GB/s
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dtl/ofi/ofi.hpp"

using dyad::dtl::ofi::Endpoint;

static int die(const dyad::Status& st) {
    std::fprintf(stderr, "ofi_read_bw: %s\n", st.to_string().c_str());
    return 1;
}

static int serve(const char* proto_name) {
    auto proto = dyad::dtl::ofi::validate_protocol(proto_name);
    if (!proto) return die(proto.status());
    auto ep = Endpoint::open(*proto.value(), "127.0.0.1");
    if (!ep) return die(ep.status());
    std::vector<char> buf(64u << 20, 'x');
    auto r = ep.value()->register_memory(buf.data(), buf.size(), FI_REMOTE_READ);
    if (!r) return die(r.status());
    std::string hex;
    char b[3];
    for (unsigned char c : ep.value()->address()) {
        std::snprintf(b, sizeof b, "%02x", c);
        hex += b;
    }
    std::printf("%s %llu %llu\n", hex.c_str(), static_cast<unsigned long long>(r.value().key),
                static_cast<unsigned long long>(r.value().base));
    std::fflush(stdout);
    fi_cq_entry e[8];
    for (;;) {  // progress for the readers until killed
        if (ep.value()->can_wait())
            fi_cq_sread(ep.value()->cq(), e, 8, nullptr, 1000);
        else
            fi_cq_read(ep.value()->cq(), e, 8);
    }
}

static int client(char** argv) {
    auto proto = dyad::dtl::ofi::validate_protocol(argv[2]);
    if (!proto) return die(proto.status());
    std::string hex = argv[3], addr;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
        addr.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    uint64_t key = std::strtoull(argv[4], nullptr, 10), base = std::strtoull(argv[5], nullptr, 10);
    size_t size = std::strtoull(argv[6], nullptr, 10);
    long count = std::atol(argv[7]);
    int depth = std::atoi(argv[8]);
    if (size == 0 || size > (64u << 20) || count <= 0 || depth <= 0) {
        std::fprintf(stderr, "ofi_read_bw: bad size/count/depth\n");
        return 2;
    }
    auto ep = Endpoint::open(*proto.value(), nullptr);
    if (!ep) return die(ep.status());
    Endpoint& e = *ep.value();
    std::vector<char> local(size * static_cast<size_t>(depth));
    auto r = e.register_memory(local.data(), local.size(), FI_READ);
    if (!r) return die(r.status());
    fi_addr_t peer = FI_ADDR_UNSPEC;
    if (fi_av_insert(e.av(), addr.data(), 1, &peer, 0, nullptr) != 1) {
        std::fprintf(stderr, "ofi_read_bw: fi_av_insert failed\n");
        return 1;
    }
    std::vector<fi_context2> ctx(static_cast<size_t>(depth));
    long posted = 0, done = 0;
    auto t0 = std::chrono::steady_clock::now();
    auto post = [&](int slot) {
        ssize_t ret;
        while ((ret = fi_read(e.ep(), local.data() + static_cast<size_t>(slot) * size, size,
                              r.value().desc, peer, base, key, &ctx[slot])) == -FI_EAGAIN)
            fi_cq_read(e.cq(), nullptr, 0);
        return ret;
    };
    for (int i = 0; i < depth && posted < count; ++i, ++posted)
        if (post(i) != 0) return die(dyad::Status(DYAD_RC_BADFETCH, "fi_read failed", EIO));
    while (done < count) {
        fi_cq_entry ce[8];
        ssize_t n =
            e.can_wait() ? fi_cq_sread(e.cq(), ce, 8, nullptr, 5000) : fi_cq_read(e.cq(), ce, 8);
        if (n == -FI_EAGAIN) continue;
        if (n < 0) {
            std::fprintf(stderr, "ofi_read_bw: completion error %s\n",
                         fi_strerror(static_cast<int>(-n)));
            return 1;
        }
        for (ssize_t i = 0; i < n; ++i) {
            ++done;
            int slot = static_cast<int>(static_cast<fi_context2*>(ce[i].op_context) - ctx.data());
            if (posted < count) {
                if (post(slot) != 0)
                    return die(dyad::Status(DYAD_RC_BADFETCH, "fi_read failed", EIO));
                ++posted;
            }
        }
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%.3f\n", static_cast<double>(size) * static_cast<double>(count) / s / 1e9);
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 3 && std::strcmp(argv[1], "server") == 0) return serve(argv[2]);
    if (argc == 9 && std::strcmp(argv[1], "client") == 0) return client(argv);
    std::fprintf(
        stderr,
        "usage: ofi_read_bw server PROTO | client PROTO ADDR_HEX KEY BASE SIZE COUNT DEPTH\n");
    return 2;
}
