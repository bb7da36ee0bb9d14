// SPDX-License-Identifier: Apache-2.0
// A connection's answer queue: frames leave in the order they are queued,
// those queued together in one gathered write; a file frame's data goes by
// sendfile, a descriptor with the first byte of its frame (SCM_RIGHTS). On
// a keyed connection every frame is tagged as it is queued.
#include <fcntl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <vector>

#include "session.hpp"

namespace dyad::rpc {

namespace {
// asio's transfer_all offers the socket at most 64 KiB per write (its
// default_max_transfer_size): a 1 MiB chunk took 17 sendmsg calls, each
// with a trip through the event loop. Offer everything; the kernel takes
// what fits in the send buffer.
size_t all_at_once(const asio::error_code& ec, size_t) {
    return ec ? 0 : std::numeric_limits<int32_t>::max();
}
}  // namespace

Session::Out Session::make_out(Header h, std::string meta, asio::const_buffer data) {
    Out o;
    h.meta_len = static_cast<uint32_t>(meta.size());
    h.data_len = static_cast<uint32_t>(data.size());
    // The tag covers what the flags say of the data, on a tagged frame of
    // one that has enough; otherwise no flag.
    if (!tx_mac_.active() || ((h.flags & kFlagTagHead) && h.data_len < kTagHead))
        h.flags &= static_cast<uint8_t>(~kTagFlags);
    o.tagged_data = tagged_data_len(h);
    encode_header(h, o.hdr.data());
    o.meta = std::move(meta);
    o.data = data;
    return o;
}

void Session::send(Header h, std::string meta, asio::const_buffer data, Request::WriteDone cb) {
    if (closed_) {
        if (cb) asio::post(io_, [cb] { cb(false); });
        return;
    }
    Out o = make_out(h, std::move(meta), data);
    o.cb = std::move(cb);
    enqueue(std::move(o));
}

bool Session::send_now(Header h, std::string meta) {
    std::unique_lock<std::mutex> lk(wmu_);
    if (closed_ || writing_ || !q_.empty()) return false;
    Out o = make_out(h, std::move(meta), {});
    seal(o);
    struct iovec iov[3];
    size_t n = 0;
    iov[n++] = {o.hdr.data(), kHeaderSize};
    if (!o.meta.empty()) iov[n++] = {o.meta.data(), o.meta.size()};
    if (o.tagged) iov[n++] = {o.tag.data(), o.tag.size()};
    const size_t total = kHeaderSize + o.meta.size() + tag_of(o).size();
    struct msghdr msg = {};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    ssize_t w;
    do {
        w = ::sendmsg(sock_.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (w < 0 && errno == EINTR);
    if (w >= 0 && static_cast<size_t>(w) == total) return true;
    // What the kernel did not take (a full socket, or an error the loop's
    // write then meets and closes on) goes out from the loop, first.
    o.fd_sent = w > 0 ? static_cast<size_t>(w) : 0;
    queued_bytes_ += o.meta.size() + kHeaderSize;
    q_.push_back(std::move(o));
    writing_ = true;
    lk.unlock();
    auto self = shared_from_this();
    asio::post(io_, [self] { self->write_next(); });
    return true;
}

void Session::send_file(Header h, std::string meta, int fd, uint64_t off, size_t len,
                        Request::WriteDone cb) {
    int dup = closed_ ? -1 : ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) {
        if (cb) asio::post(io_, [cb] { cb(false); });
        return;
    }
    Out o;
    h.meta_len = static_cast<uint32_t>(meta.size());
    h.data_len = static_cast<uint32_t>(len);
    h.flags &= static_cast<uint8_t>(~kTagFlags);  // file bytes: checked by their XXH3
    encode_header(h, o.hdr.data());
    o.meta = std::move(meta);
    o.cb = std::move(cb);
    o.file_fd = dup;
    o.file_off = off;
    o.file_len = len;
    enqueue(std::move(o));
}

void Session::send_with_fd(Header h, std::string meta, UniqueFd fd, Request::WriteDone cb) {
    if (closed_ || !unix_ || !fd.valid()) {
        if (cb) asio::post(io_, [cb] { cb(false); });
        return;
    }
    Out o;
    h.meta_len = static_cast<uint32_t>(meta.size());
    h.data_len = 0;
    h.flags &= static_cast<uint8_t>(~kTagFlags);
    encode_header(h, o.hdr.data());
    o.meta = std::move(meta);
    o.cb = std::move(cb);
    o.pass_fd = std::move(fd);
    enqueue(std::move(o));
}

void Session::enqueue(Out o) {
    std::unique_lock<std::mutex> lk(wmu_);
    seal(o);
    queued_bytes_ += o.meta.size() + kHeaderSize;
    q_.push_back(std::move(o));
    if (writing_) return;
    writing_ = true;
    lk.unlock();
    write_next();
}

// Tags a frame about to be queued, once the peer is admitted on a keyed
// connection: its header, meta and the part of its data its flags name.
// Frames leave in the order they are queued, which is the order of the
// tags' sequence numbers.
void Session::seal(Out& o) {
    if (!tx_mac_.active()) return;
    tx_mac_.sign(o.hdr.data(), kHeaderSize, o.meta, o.tag.data(),
                 std::string_view(static_cast<const char*>(o.data.data()), o.tagged_data));
    o.tagged = true;
}

asio::const_buffer Session::tag_of(const Out& o) {
    return asio::buffer(o.tag.data(), o.tagged ? o.tag.size() : 0);
}

// Called with writing_ set: the queue is the loop's until it is clear.
void Session::write_next() {
    Out& o = q_.front();
    // (A frame send_now began: its rest, as a descriptor's frame goes.)
    if (o.pass_fd.valid() || o.fd_sent > 0) return write_with_fd();
    auto self = shared_from_this();
    if (o.file_fd >= 0) {
        std::array<asio::const_buffer, 3> bufs = {asio::buffer(o.hdr), asio::buffer(o.meta),
                                                  tag_of(o)};
        asio::async_write(sock_, bufs, all_at_once, [self](asio::error_code ec, size_t) {
            if (!ec) return self->write_file_data();
            self->front_written(ec);
        });
        return;
    }
    // Frames queued together leave in one write (a small file's answer
    // and its END; answers of several requests): at most kGatherFrames
    // frames or kGatherBytes bytes, and never past a frame that carries
    // a descriptor or file data.
    constexpr size_t kGatherFrames = 64, kGatherBytes = 4u << 20;
    std::vector<asio::const_buffer> bufs;
    size_t frames = 0, bytes = 0;
    for (const Out& f : q_) {
        if (f.pass_fd.valid() || f.file_fd >= 0) break;
        size_t n = kHeaderSize + f.meta.size() + tag_of(f).size() + f.data.size();
        if (frames > 0 && (frames == kGatherFrames || bytes + n > kGatherBytes)) break;
        bufs.push_back(asio::buffer(f.hdr));
        if (!f.meta.empty()) bufs.push_back(asio::buffer(f.meta));
        if (f.tagged) bufs.push_back(tag_of(f));
        if (f.data.size()) bufs.push_back(f.data);
        ++frames;
        bytes += n;
    }
    asio::async_write(sock_, bufs, all_at_once, [self, frames](asio::error_code ec, size_t) {
        self->frames_written(frames, ec);
    });
}

// Drives one non-blocking write of the front frame: `step` writes once
// (and books what it wrote), returning the syscall's result; `done` says
// when the frame is out. A full socket is waited for on the loop, then
// `resume` carries on; an error or EOF ends the frame (front_written).
template <class Step, class Done>
void Session::write_until_done(Step step, Done done, void (Session::*resume)()) {
    asio::error_code ec;
    if (!sock_.native_non_blocking()) sock_.native_non_blocking(true, ec);
    while (!ec && !done()) {
        ssize_t n = step();
        if (n > 0 || (n < 0 && errno == EINTR)) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            auto self = shared_from_this();
            sock_.async_wait(asio::socket_base::wait_write, [self, resume](asio::error_code e) {
                if (e) return self->front_written(e);
                ((*self).*resume)();
            });
            return;
        }
        ec =
            n == 0 ? asio::error::eof : asio::error_code(errno, asio::error::get_system_category());
    }
    front_written(ec);
}

// The data of a file frame: sendfile until done, waiting for the socket
// to take more when it is full. A short file cannot complete the frame
// it announced: the connection is closed (the consumer sees the error).
void Session::write_file_data() {
    write_until_done(
        [this] {
            Out& o = q_.front();
            if (o.file_len == 0) return ssize_t(0);
            off_t off = static_cast<off_t>(o.file_off);
            ssize_t n = ::sendfile(sock_.native_handle(), o.file_fd, &off,
                                   std::min<size_t>(o.file_len, 1u << 30));
            if (n > 0) {
                o.file_off += static_cast<uint64_t>(n);
                o.file_len -= static_cast<size_t>(n);
            }
            return n;
        },
        [this] { return q_.front().file_len == 0; }, &Session::write_file_data);
}

namespace {
// One sendmsg of the parts `iov` with `fd` (if valid) as SCM_RIGHTS.
ssize_t sendmsg_with_fd(int sock, struct iovec* iov, size_t n, int fd) {
    struct msghdr msg = {};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    if (fd >= 0) {
        std::memset(&ctl, 0, sizeof ctl);
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof ctl.buf;
        struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    return ::sendmsg(sock, &msg, MSG_NOSIGNAL);
}
}  // namespace

void Session::write_with_fd() {
    const size_t total = kHeaderSize + q_.front().meta.size() + tag_of(q_.front()).size();
    write_until_done(
        [this] {
            Out& o = q_.front();
            struct iovec iov[3];
            size_t n = 0;
            // The frame's parts in order (header, meta, tag), from what is
            // already out.
            size_t skip = o.fd_sent;
            auto part = [&](const void* p, size_t len) {
                if (skip >= len) {
                    skip -= len;
                    return;
                }
                iov[n].iov_base = const_cast<char*>(static_cast<const char*>(p)) + skip;
                iov[n++].iov_len = len - skip;
                skip = 0;
            };
            part(o.hdr.data(), kHeaderSize);
            part(o.meta.data(), o.meta.size());
            part(o.tag.data(), tag_of(o).size());
            ssize_t w = sendmsg_with_fd(sock_.native_handle(), iov, n,
                                        o.pass_fd.valid() ? o.pass_fd.get() : -1);
            if (w > 0) {
                o.fd_sent += static_cast<size_t>(w);
                o.pass_fd.reset();  // it went with these bytes
            }
            return w;
        },
        [this, total] { return q_.front().fd_sent >= total; }, &Session::write_with_fd);
}

void Session::frames_written(size_t frames, asio::error_code ec) {
    last_activity_ = std::chrono::steady_clock::now();
    std::vector<Out> done;
    std::unique_lock<std::mutex> lk(wmu_);
    done.reserve(frames);
    for (size_t i = 0; i < frames && !q_.empty(); ++i) {
        done.push_back(std::move(q_.front()));
        q_.pop_front();
    }
    for (Out& d : done) queued_bytes_ -= d.meta.size() + kHeaderSize;
    if (ec) {
        for (auto& o : q_) done.push_back(std::move(o));
        q_.clear();
        queued_bytes_ = 0;
    }
    const bool more = !ec && !q_.empty();
    writing_ = more;
    lk.unlock();
    if (ec) close();
    for (Out& d : done) {
        if (d.file_fd >= 0) ::close(d.file_fd);
        if (d.cb) d.cb(!ec);
    }
    if (ec) return;
    if (more) write_next();
    maybe_resume();
}

}  // namespace dyad::rpc
