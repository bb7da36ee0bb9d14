// SPDX-License-Identifier: Apache-2.0
#include "fetch_channel.hpp"

#include <cerrno>

#include "common/checksum.hpp"
#include "common/json_text.hpp"

namespace dyad::client {

Status RpcFetchChannel::open(const nlohmann::json& args, Deadline deadline, const char* topic) {
    if (opened_) return Status(DYAD_RC_SYSFAIL, "a fetch channel carries one fetch", EINVAL);
    auto tag = conn_.send_request(topic, args, deadline, false);
    if (!tag) return tag.status();
    tag_ = tag.value();
    opened_ = true;
    return Status::ok();
}

Result<dtl::FetchChannel::Message> RpcFetchChannel::next() {
    if (!opened_) return Status(DYAD_RC_SYSFAIL, "fetch channel not opened", EINVAL);
    if (ended_) return Status(DYAD_RC_BADRPC, "read past the end of a fetch", EPROTO);
    for (;;) {
        Deadline deadline = Deadline::after(idle_s_);
        if (unread_ > 0) {
            Status s = conn_.skip_data(unread_, deadline);
            if (!s) return s;
            unread_ = 0;
        }
        auto f = conn_.read_frame(deadline);
        if (!f) return f.status();
        // A descriptor passed with this frame: kept only if the frame is this
        // fetch's first answer, closed otherwise.
        UniqueFd passed = conn_.take_fd();
        const rpc::Header& h = f->header;
        // A connection-wide error (tag 0) ends this fetch too.
        if (h.type == rpc::Type::error && (h.tag == 0 || h.tag == tag_))
            return rpc::Connection::error_status(f.value(), "fetch");
        if (h.tag != tag_) {  // another request's frame: not ours to read
            Status s = conn_.skip_data(h.data_len, deadline);
            if (!s) return s;
            continue;
        }
        Message m;
        if (f->meta.is_object())
            m.meta = std::move(f->meta);
        else if (!f->meta.is_null())
            return Status(DYAD_RC_BADRPC, "fetch frame whose meta is not an object", EPROTO);
        m.data_len = h.data_len;
        switch (h.type) {
            case rpc::Type::response:
                m.kind = answered_ ? Kind::data : Kind::answer;
                if (!answered_) answer_fd_ = std::move(passed);
                answered_ = true;
                unread_ = h.data_len;
                return m;
            case rpc::Type::end:
                if (h.data_len != 0)
                    return Status(DYAD_RC_BADRPC, "END frame of a fetch with data", EPROTO);
                m.kind = Kind::end;
                ended_ = true;
                return m;
            default:
                return Status(
                    DYAD_RC_BADRPC,
                    std::string("unexpected ") + rpc::type_name(h.type) + " frame in a fetch",
                    EPROTO);
        }
    }
}

Status RpcFetchChannel::read(void* p, size_t n) {
    if (n > unread_)
        return Status(DYAD_RC_SYSFAIL,
                      "read of " + std::to_string(n) + " bytes from a message with " +
                          std::to_string(unread_) + " left",
                      EINVAL);
    Status s = conn_.read_data(p, n, Deadline::after(idle_s_));
    if (s) unread_ -= n;
    return s;
}

Status RpcFetchChannel::update(const nlohmann::json& meta) {
    return conn_.send_update(tag_, meta, Deadline::after(idle_s_));
}

Status verify_trailer(const nlohmann::json& trailer, const Received& got,
                      const std::string& upath) {
    auto want = proto::FetchEnd::parse(trailer, upath);
    if (!want) return want.status();
    // In-kernel copies (LOCAL) never pass through this process: their size
    // is checked, and the owner held the file's lock while they ran.
    if (got.bytes != want->size || (!got.kernel_copied && got.xxh3 != want->xxh3))
        return Status(DYAD_RC_BADCHECKSUM,
                      "'" + upath + "' arrived corrupted: " + std::to_string(got.bytes) +
                          " bytes, xxh3 " + got.xxh3 + "; the service sent " +
                          std::to_string(want->size) + " bytes, xxh3 " + want->xxh3,
                      EIO);
    return Status::ok();
}

Result<Sent> sent_of(const nlohmann::json& trailer, const std::string& upath) {
    auto end = proto::FetchEnd::parse(trailer, upath);
    if (!end) return end.status();
    auto digest = end->digest();
    if (!digest)
        return Status(DYAD_RC_BADRPC,
                      "the end of the fetch of '" + upath + "' lacks its size or checksum: " +
                          trailer.dump(-1, ' ', false, kBadUtf8Replaced),
                      EPROTO);
    return Sent{end->size, *digest};
}

Status verify_sent(const Sent& sent, const void* p, size_t n, const std::string& upath) {
    const uint64_t got = Xxh3::of(p, n);
    if (n == sent.size && got == sent.xxh3) return Status::ok();
    return Status(DYAD_RC_BADCHECKSUM,
                  "'" + upath + "' arrived corrupted: " + std::to_string(n) + " bytes, xxh3 " +
                      Xxh3::to_hex(got) + "; the service sent " + std::to_string(sent.size) +
                      " bytes, xxh3 " + Xxh3::to_hex(sent.xxh3),
                  EIO);
}

}  // namespace dyad::client
