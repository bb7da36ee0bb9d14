// SPDX-License-Identifier: Apache-2.0
// LOCAL: the consumer is on the producer's node but uses another directory.
// Nothing crosses a network: the owner service opens the file beneath its
// producer directory and holds its shared lock, as for any fetch, and hands
// the consumer that open file itself: its first answer (proto::FetchStart) carries
// the descriptor as SCM_RIGHTS over the service's Unix socket. No path or
// file identity is disclosed, and the consumer opens nothing by name (so it
// needs no access to the producer's directory, and a forged answer cannot
// point it at another file). Over TCP no descriptor can pass: the service
// refuses at once (EOPNOTSUPP) and the consumer takes the next transport.
//
// The consumer checks the descriptor (a regular file, open read-only, at
// least the announced size) and copies it in the kernel: a reflink (FICLONE)
// where the filesystem shares extents, else copy_file_range, else
// read/write. It closes the descriptor (the service's open file and lock are
// shared with it), tells the service how many bytes it copied, and the
// service ends the fetch (releasing the lock).
//
// Not a hard link: the consumer's copy would be the producer's file, and a
// producer rewriting it in place would change a file DYAD already handed
// over as whole.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <asio/steady_timer.hpp>

#include "common/fd.hpp"
#include "common/log.hpp"
#include "dtl/dtl.hpp"
#include "proto/fields.hpp"
#include "proto/transfer.hpp"

namespace dyad::dtl {
namespace {

constexpr const char* kSub = "local";

Attributes local_attributes() {
    Attributes a;
    a.name = name_of(Kind::local);
    // Two round trips (answer with the open file, then copied/end):
    // measured 1,000 files of 64 KiB at 780/s against the stream's 972/s
    // on the same node (when the consumer still opened a path), so small
    // files go by the stream.
    a.latency_us = 320;
    a.bandwidth_gbps = 3.0;
    a.rma_native = false;
    a.max_message = 0;
    a.info = "same node: reflink, copy_file_range or read/write from the producer's file";
    return a;
}

class LocalSender : public Sender {
  public:
    LocalSender() : attrs_(local_attributes()) {}
    const Attributes& attributes() const override { return attrs_; }
    std::vector<TransportRecord> records() const override {
        TransportRecord r;
        r.name = name_of(Kind::local);
        r.reach = proto::kReachNode;
        r.latency_us = attrs_.latency_us;
        r.bandwidth_gbps = attrs_.bandwidth_gbps;
        r.detail = "kernel copy";
        r.source = "configuration (measured: cp on the reference machine)";
        return {r};
    }
    nlohmann::json stats() const override {
        return {{"handed_over", handed_}, {"bytes_copied_by_consumers", copied_}};
    }

    void send(std::shared_ptr<FetchJob> job, SendDone done) override {
        if (!job->ch->can_send_fd()) {
            done(Status(DYAD_RC_BADDTLMODE,
                        "LOCAL needs the service's Unix socket: this consumer reached it over "
                        "TCP, where the open file cannot be passed. LOCAL serves only consumers "
                        "on the owner's node: from another node, use a transport that crosses "
                        "nodes (DYAD_DTL_MODE=AUTO chooses one); on the owner's node, its "
                        "service needs a socket (dyadd --socket; the Slurm plugin gives it one) "
                        "this process may use (dyadd --allow-uid)",
                        EOPNOTSUPP),
                 0, "");
            return;
        }
        ++handed_;
        struct State {
            SendDone done;
            asio::steady_timer timer;
            explicit State(asio::io_context& io) : timer(io) {}
        };
        auto st = std::make_shared<State>(job->ch->io());
        st->done = std::move(done);
        auto finish = [this, st, job](Status s, uint64_t bytes) {
            if (!st->done) return;
            st->timer.cancel();
            auto d = std::move(st->done);
            st->done = nullptr;
            copied_ += bytes;
            d(std::move(s), bytes, "");
        };
        job->ch->on_update([finish, job](const nlohmann::json& m) {
            auto c = proto::LocalCopied::parse(m);
            if (!c) return finish(c.status(), 0);
            finish(Status::ok(), c->copied);
        });
        job->ch->on_cancel(
            [finish] { finish(Status(DYAD_RC_BADFETCH, "consumer went away", ECONNRESET), 0); });
        // The consumer copies while we hold the lock; it must not hold it
        // forever.
        st->timer.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(std::min(job->idle_timeout_s, 1e9))));
        st->timer.async_wait([finish, job](asio::error_code ec) {
            if (ec) return;
            finish(Status(DYAD_RC_TIMEOUT, "consumer did not finish its local copy in time",
                          ETIMEDOUT),
                   0);
            job->ch->close();
        });
        job->ch->send_fd(
            proto::FetchStart{job->size, name_of(Kind::local)}.build(
                job->offset ? nlohmann::json{{"offset", job->offset}} : nlohmann::json::object()),
            job->fd.get(), [finish](bool ok) {
                if (!ok)
                    finish(Status(DYAD_RC_BADFETCH, "could not pass the open file to the consumer",
                                  ECONNRESET),
                           0);
            });
    }

  private:
    Attributes attrs_;
    uint64_t handed_ = 0, copied_ = 0;
};

// Copies `size` bytes of `in` from offset `from` to the sink: reflink,
// copy_file_range, or read/write, whichever the filesystems allow first.
Status copy_into(int in, uint64_t from, uint64_t size, Sink& sink, const std::string& what,
                 std::string* how) {
    // The owner reads nothing, so there is no checksum to compare with:
    // the sink checks the size (and the owner held the file's lock).
    sink.copied(0);
    int out = sink.fd();
    // A reflink takes the whole file: only when that is the announced size.
    struct stat sb;
    bool whole = from == 0 && ::fstat(in, &sb) == 0 && static_cast<uint64_t>(sb.st_size) == size;
    if (out >= 0 && size > 0 && whole && ::ioctl(out, FICLONE, in) == 0) {
        sink.copied(size);
        *how = "reflink";
        return Status::ok();
    }
    uint64_t done = 0;
    bool kernel = out >= 0;
    while (kernel && done < size) {
        // From an explicit offset: the passed descriptor's file offset is
        // the service's too.
        loff_t at = static_cast<loff_t>(from + done);
        ssize_t r =
            ::copy_file_range(in, &at, out, nullptr,
                              static_cast<size_t>(std::min<uint64_t>(size - done, 1u << 30)), 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (done == 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
                              errno == EOPNOTSUPP || errno == EBADF)) {
                kernel = false;  // this pair of filesystems cannot: plain copy
                break;
            }
            return Status(DYAD_RC_BADFIO, "copy_file_range from " + what + " failed", errno);
        }
        if (r == 0) return Status(DYAD_RC_BADFIO, what + " shrank while being copied", EIO);
        done += static_cast<uint64_t>(r);
        sink.copied(static_cast<uint64_t>(r));
    }
    if (kernel) {
        *how = "copy_file_range";
        return Status::ok();
    }
    *how = "read/write";
    std::vector<char> buf(1u << 20);
    while (done < size) {
        ssize_t r = ::pread(in, buf.data(),
                            static_cast<size_t>(std::min<uint64_t>(size - done, buf.size())),
                            static_cast<off_t>(from + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return Status(DYAD_RC_BADFIO, "read of " + what + " failed", errno);
        if (r == 0) return Status(DYAD_RC_BADFIO, what + " shrank while being copied", EIO);
        Status s = sink.write(buf.data(), static_cast<size_t>(r));
        if (!s) return s;
        done += static_cast<uint64_t>(r);
    }
    return Status::ok();
}

class LocalReceiver : public Receiver {
  public:
    LocalReceiver() : attrs_(local_attributes()) {}
    const Attributes& attributes() const override { return attrs_; }
    nlohmann::json describe() override { return nlohmann::json::object(); }

    Result<nlohmann::json> receive(FetchChannel& ch, Sink& sink) override {
        auto f = ch.first(name_of(Kind::local));
        if (!f) return f.status();
        UniqueFd in = ch.take_fd();
        auto size = proto::start_size(f->meta);
        if (!size || f->data_len != 0)
            return Status(DYAD_RC_BADRPC, "LOCAL answer without the file's size", EPROTO);
        if (!in.valid())
            return Status(DYAD_RC_BADRPC,
                          "LOCAL answer without the file descriptor (the service passes the "
                          "open file over its Unix socket; a dyadd of an older version sends a "
                          "path instead, which is no longer accepted)",
                          EPROTO);
        struct stat sb;
        if (::fstat(in.get(), &sb) != 0)
            return Status(DYAD_RC_BADFIO, "LOCAL: cannot stat the file the service passed", errno);
        if (!S_ISREG(sb.st_mode))
            return Status(DYAD_RC_BADRPC, "LOCAL: the service passed something not a regular file",
                          EPROTO);
        int fl = ::fcntl(in.get(), F_GETFL);
        if (fl < 0 || (fl & O_ACCMODE) != O_RDONLY)
            return Status(DYAD_RC_BADRPC, "LOCAL: the service passed a file not opened read-only",
                          EPROTO);
        // A byte range starts at `offset` (0: the whole file).
        const uint64_t offset = proto::lenient_u64(f->meta, "offset").value_or(0);
        if (offset + *size < offset || static_cast<uint64_t>(sb.st_size) < offset + *size)
            return Status(DYAD_RC_BADFIO,
                          "LOCAL: the producer's file has " + std::to_string(sb.st_size) +
                              " bytes, fewer than the " + std::to_string(*size) +
                              " announced from byte " + std::to_string(offset),
                          EIO);
        std::string how;
        Status s = copy_into(in.get(), offset, *size, sink, "the producer's file", &how);
        // The descriptor shares the service's open file (and its lock):
        // closed before the service is told it may end the fetch.
        in.reset();
        if (!s) return s;
        DYAD_DEBUG(kSub, "copied %llu bytes by %s", static_cast<unsigned long long>(*size),
                   how.c_str());
        s = ch.update(proto::LocalCopied{*size}.build());
        if (!s) return s;
        auto t = ch.end(name_of(Kind::local));
        if (!t) return t;
        t.value()["copy"] = how;
        return t;
    }

  private:
    Attributes attrs_;
};

}  // namespace

Backend local_backend() {
    return {name_of(Kind::local), aliases_of(Kind::local), local_attributes,
            []() -> Result<std::unique_ptr<Receiver>> {
                return std::unique_ptr<Receiver>(new LocalReceiver());
            },
            [](asio::io_context&, const ServiceBind&) -> Result<std::unique_ptr<Sender>> {
                return std::unique_ptr<Sender>(new LocalSender());
            }};
}

}  // namespace dyad::dtl
