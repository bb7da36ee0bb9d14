// SPDX-License-Identifier: Apache-2.0
// Producer and consumer written against the original DYAD's C++ stream API
// (as its demo does: open, get_stream(), read/write, close), built with
// -std=c++11 -DDYAD_HAS_CONFIG=1 -ldyad_fstream only.
// Usage: stream prod|cons N DIR. Prints "File <i>: OK" per file consumed.
#include <dyad/stream/dyad_stream_api.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
    if (argc != 4) {
        std::cerr << "usage: stream prod|cons N DIR\n";
        return 2;
    }
    std::string role = argv[1];
    int n = std::atoi(argv[2]);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        std::string path = std::string(argv[3]) + "/data" + std::to_string(i) + ".txt";
        int32_t v[32];
        if (role == "prod") {
            for (int k = 0; k < 32; k++) v[k] = i * 32 + k;
            dyad::ofstream_dyad ofs_dyad;
            ofs_dyad.open(path, std::ofstream::out | std::ios::binary);
            std::ofstream& ofs = ofs_dyad.get_stream();
            ofs.write(reinterpret_cast<const char*>(v), sizeof v);
            ofs_dyad.close();
            if (!ofs) return 1;
        } else {
            std::memset(v, 0, sizeof v);
            dyad::ifstream_dyad ifs_dyad;
            ifs_dyad.open(path, std::ifstream::in | std::ios::binary);
            std::ifstream& ifs = ifs_dyad.get_stream();
            ifs.read(reinterpret_cast<char*>(v), sizeof v);
            bool ok = static_cast<bool>(ifs);
            ifs_dyad.close();
            for (int k = 0; k < 32; k++) ok = ok && v[k] == i * 32 + k;
            std::cout << "File " << i << ": " << (ok ? "OK" : "BAD") << "\n";
            bad += !ok;
        }
    }
    return bad ? 1 : 0;
}
