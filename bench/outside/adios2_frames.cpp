// SPDX-License-Identifier: Apache-2.0
// The MD frame stream through ADIOS2 (bench/outside, issue 49): one step
// per frame, written by one process and read by another.
//
//   adios2_frames write NAME --engine SST|BP5 --frames N --size BYTES [--out JSON]
//   adios2_frames read NAME --engine SST|BP5 --frames N --size BYTES --out JSON
//
// Frame i: a 16-byte header (pair 0, frame i, little-endian) and the same
// body for every frame of a size (bench/workflow/md_pair.py's layout, other
// bytes), one uint8 array variable "frame" per step. SST: the TCP ("WAN")
// data plane, NAME's contact file in a directory both processes see; start
// the reader first. BP5: NAME is a directory on the shared file system; the
// reader waits for it (OpenTimeoutSecs) and reads each step as it lands.
// The reader checks every byte and writes per-frame wall-clock times (one
// machine, one clock: "frame_done", each frame read and checked), the time
// it called Open ("t_open") and frames per second from its first BeginStep;
// the writer (with --out) the time it started, before ADIOS2 was set up.
//
// Built only by bench/outside/run.py when ADIOS2_DIR is given (ADIOS2 is not
// in Debian 12), never by the project's CMake.
#include <adios2.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

struct Args {
    std::string side, name, engine = "SST", out;
    size_t frames = 0, size = 0;
};

double now() {
    using namespace std::chrono;
    return duration<double>(system_clock::now().time_since_epoch()).count();
}

// xorshift bytes: the body depends on the size only.
std::vector<uint8_t> body_of(size_t size) {
    std::vector<uint8_t> b(size > 16 ? size - 16 : 0);
    uint64_t x = 0x9e3779b97f4a7c15ULL ^ size;
    for (auto& c : b) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c = static_cast<uint8_t>(x);
    }
    return b;
}

void put_header(std::vector<uint8_t>& f, uint64_t i) {
    std::memset(f.data(), 0, 16);
    for (int k = 0; k < 8; ++k) f[8 + k] = static_cast<uint8_t>(i >> (8 * k));
}

bool parse(int argc, char** argv, Args& a) {
    if (argc < 3) return false;
    a.side = argv[1];
    a.name = argv[2];
    for (int i = 3; i + 1 < argc; i += 2) {
        std::string k = argv[i], v = argv[i + 1];
        if (k == "--engine")
            a.engine = v;
        else if (k == "--frames")
            a.frames = std::stoul(v);
        else if (k == "--size")
            a.size = std::stoul(v);
        else if (k == "--out")
            a.out = v;
        else
            return false;
    }
    return (a.side == "write" || (a.side == "read" && !a.out.empty())) && a.frames > 0 &&
           a.size >= 16 && (a.engine == "SST" || a.engine == "BP5");
}

void set_engine(adios2::IO& io, const Args& a) {
    io.SetEngine(a.engine);
    if (a.engine == "SST") {
        io.SetParameters({{"DataTransport", "WAN"},
                          {"RendezvousReaderCount", "1"},
                          {"QueueLimit", "4"},
                          {"OpenTimeoutSecs", "120"}});
    } else {
        io.SetParameters({{"OpenTimeoutSecs", "120"}});
    }
}

int write_side(const Args& a) {
    double t_start = now();
    adios2::ADIOS adios;
    adios2::IO io = adios.DeclareIO("frames");
    set_engine(io, a);
    auto var = io.DefineVariable<uint8_t>("frame", {a.size}, {0}, {a.size});
    std::vector<uint8_t> frame(a.size);
    auto body = body_of(a.size);
    std::memcpy(frame.data() + 16, body.data(), body.size());
    adios2::Engine w = io.Open(a.name, adios2::Mode::Write);
    for (size_t i = 0; i < a.frames; ++i) {
        put_header(frame, i);
        w.BeginStep();
        w.Put(var, frame.data(), adios2::Mode::Sync);
        w.EndStep();
    }
    w.Close();
    if (a.out.empty()) return 0;
    std::ofstream o(a.out);
    o.precision(17);
    o << "{\"side\": \"write\", \"t_start\": " << t_start << ", \"t_end\": " << now() << "}\n";
    return o ? 0 : 1;
}

int read_side(const Args& a) {
    adios2::ADIOS adios;
    adios2::IO io = adios.DeclareIO("frames");
    set_engine(io, a);
    std::vector<uint8_t> frame(a.size), want(a.size);
    auto body = body_of(a.size);
    std::memcpy(want.data() + 16, body.data(), body.size());
    double t_open = now();
    adios2::Engine r = io.Open(a.name, adios2::Mode::Read);
    std::vector<double> times;
    double t0 = 0;
    for (size_t i = 0; i < a.frames; ++i) {
        double tb = now();
        adios2::StepStatus st = r.BeginStep(adios2::StepMode::Read, 120.0f);
        if (st != adios2::StepStatus::OK) {
            std::cerr << "adios2_frames: step " << i << " of " << a.name << " did not come (status "
                      << static_cast<int>(st) << ")\n";
            return 1;
        }
        if (i == 0) t0 = tb;
        auto var = io.InquireVariable<uint8_t>("frame");
        if (!var) {
            std::cerr << "adios2_frames: step " << i << " has no variable 'frame'\n";
            return 1;
        }
        r.Get(var, frame.data(), adios2::Mode::Sync);
        r.EndStep();
        put_header(want, i);
        if (frame != want) {
            std::cerr << "adios2_frames: frame " << i << " arrived with other bytes\n";
            return 1;
        }
        times.push_back(now());
    }
    r.Close();
    double wall = times.back() - t0;
    std::ofstream o(a.out);
    o.precision(17);
    o << "{\"method\": \"adios2-" << a.engine << "\", \"frames\": " << a.frames
      << ", \"size\": " << a.size << ", \"rendezvous\": " << (t0 - t_open) << ", \"wall\": " << wall
      << ", \"frames_per_s\": " << (a.frames / wall)
      << ", \"MiB_per_s\": " << (static_cast<double>(a.frames) * a.size / wall / 1048576.0)
      << ", \"t_open\": " << t_open << ", \"t_first_begin\": " << t0 << ", \"frame_done\": [";
    for (size_t i = 0; i < times.size(); ++i) o << (i ? ", " : "") << times[i];
    o << "], \"adios2\": \"" << ADIOS2_VERSION_STR << "\"}\n";
    return o ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    Args a;
    if (!parse(argc, argv, a)) {
        std::cerr
            << "usage: adios2_frames write|read NAME --engine SST|BP5 --frames N --size BYTES "
               "[--out JSON (read)]\n";
        return 2;
    }
    try {
        return a.side == "write" ? write_side(a) : read_side(a);
    } catch (const std::exception& e) {
        std::cerr << "adios2_frames " << a.side << ": " << e.what() << "\n";
        return 1;
    }
}
