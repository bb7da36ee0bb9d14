// SPDX-License-Identifier: Apache-2.0
// The frame parser: arbitrary bytes as a connection's stream, decoded
// frame by frame (header, then meta_len bytes of JSON, then data_len bytes),
// once from the whole buffer and once fed in pieces whose sizes come from
// the input, as a socket delivers them. Properties: no crash; both ways see
// the same frames; a header that decodes re-encodes to the same 24 bytes.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "rpc/wire.hpp"

using namespace dyad;
using namespace dyad::rpc;

namespace {
struct Seen {
    bool ok;
    Header h;
    bool meta_ok;
};

// Incremental reader: bytes arrive in pieces; complete frames come out.
class Reader {
  public:
    // Returns false once the stream is bad (the service closes it).
    bool feed(const uint8_t* p, size_t n, std::vector<Seen>* out) {
        buf_.insert(buf_.end(), p, p + n);
        for (;;) {
            if (!have_header_) {
                if (buf_.size() - pos_ < kHeaderSize) return true;
                Status s = decode_header(buf_.data() + pos_, &h_);
                if (!s) {
                    out->push_back({false, h_, false});
                    return false;
                }
                pos_ += kHeaderSize;
                have_header_ = true;
            }
            size_t body = size_t(h_.meta_len) + h_.data_len;
            if (buf_.size() - pos_ < body) return true;
            std::string meta(reinterpret_cast<const char*>(buf_.data() + pos_), h_.meta_len);
            auto j = meta.empty() ? nlohmann::json(nullptr) : parse_meta(meta);
            out->push_back({true, h_, !j.is_discarded()});
            if (!j.is_discarded()) (void)j.dump();  // what the service logs or answers with
            pos_ += body;
            have_header_ = false;
        }
    }

  private:
    std::vector<uint8_t> buf_;
    size_t pos_ = 0;
    bool have_header_ = false;
    Header h_;
};

void check_header(const uint8_t* raw) {
    Header h;
    if (!decode_header(raw, &h)) return;
    uint8_t again[kHeaderSize];
    encode_header(h, again);
    FUZZ_CHECK(std::memcmp(raw, again, kHeaderSize) == 0);
    FUZZ_CHECK(h.meta_len <= kMaxMeta && h.data_len <= kMaxData);
    FUZZ_CHECK(std::string(type_name(h.type)) != "?");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size >= kHeaderSize) check_header(data);

    // The whole stream at once.
    std::vector<Seen> whole;
    Reader a;
    a.feed(data, size, &whole);

    // The same stream in pieces: piece sizes 1..64 taken from the bytes
    // themselves (cycling), so the fuzzer explores split points.
    std::vector<Seen> pieces;
    Reader b;
    size_t off = 0, k = 0;
    while (off < size) {
        size_t n = 1 + (data[k++ % size] & 63);
        if (n > size - off) n = size - off;
        if (!b.feed(data + off, n, &pieces)) break;
        off += n;
    }
    FUZZ_CHECK(whole.size() == pieces.size());
    for (size_t i = 0; i < whole.size(); ++i) {
        FUZZ_CHECK(whole[i].ok == pieces[i].ok && whole[i].meta_ok == pieces[i].meta_ok);
        if (whole[i].ok)
            FUZZ_CHECK(whole[i].h.tag == pieces[i].h.tag && whole[i].h.type == pieces[i].h.type &&
                       whole[i].h.meta_len == pieces[i].h.meta_len);
    }

    // Meta text without a frame around it (parse_meta's depth guard).
    std::string text(reinterpret_cast<const char*>(data), size);
    auto j = parse_meta(text);
    if (!j.is_discarded()) (void)j.dump();
    return 0;
}
