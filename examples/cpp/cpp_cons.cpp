// SPDX-License-Identifier: Apache-2.0
// DYAD's C++ demo, consumer side, with dyad::ifstream_dyad: opening each
// data<i>.txt waits for it and brings it here; checks the 10 int32 values.
// Exit 1 on a wrong value, 2 on a DYAD error. Usage: cpp_cons N DIR
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
        dyad::ifstream_dyad in(path, std::ios::binary);
        if (!in) {
            std::cerr << "cpp_cons: "
                      << (in.dyad_error().empty() ? path + ": cannot open" : in.dyad_error())
                      << " [rc " << in.dyad_rc() << "]\n";
            return 2;
        }
        for (int k = 0; k < 10; ++k) {
            int v = -1;
            in.read(reinterpret_cast<char*>(&v), sizeof v);
            if (!in || v != i * 10 + k) {
                std::cerr << "File " << i << " validation: BAD (value " << k << " is " << v
                          << ")\n";
                return 1;
            }
        }
        std::cout << "File " << i << " validation: OK\n";
    }
    return 0;
}
