// SPDX-License-Identifier: Apache-2.0
// DYAD's C++ demo, producer side, with dyad::ofstream_dyad: writes N files
// data<i>.txt of 10 int32 into DIR; closing each stream publishes it.
// Usage: cpp_prod N DIR
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <dyad/stream/dyad_stream_api.hpp>

int main(int argc, char** argv) {
    if (argc != 3) {
        std::cerr << "usage: " << argv[0] << " N DIR\n";
        return 1;
    }
    int n = std::atoi(argv[1]);
    for (int i = 0; i < n; ++i) {
        std::string path = std::string(argv[2]) + "/data" + std::to_string(i) + ".txt";
        dyad::ofstream_dyad out(path, std::ios::binary);
        for (int k = 0; k < 10; ++k) {
            int v = i * 10 + k;
            out.write(reinterpret_cast<const char*>(&v), sizeof v);
        }
        out.close();
        if (!out) {
            std::cerr << "cpp_prod: " << path << ": "
                      << (out.dyad_error().empty() ? "write failed" : out.dyad_error()) << "\n";
            return 2;
        }
        std::cout << "produced " << path << "\n";
    }
    return 0;
}
