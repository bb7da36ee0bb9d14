// LOCAL: the consumer is on the producer's node but uses another directory.
// Nothing crosses a network: the owner service (which owns the path) opens
// the file beneath its producer directory and holds its shared lock, as for
// any fetch, and answers with the file's path and identity (device, inode);
// the consumer opens that path, checks it is the same file, and copies it
// in the kernel: a reflink (FICLONE) where the filesystem shares extents,
// else copy_file_range, else read/write. Then it tells the service how many
// bytes it copied, and the service ends the fetch (releasing the lock).
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
#include <climits>
#include <cstring>

#include <asio/steady_timer.hpp>

#include "common/fd.hpp"
#include "common/log.hpp"
#include "dtl.hpp"

namespace dyad::dtl {
namespace {

constexpr const char* kSub = "local";

Attributes local_attributes() {
    Attributes a;
    a.name = "LOCAL";
    // Two round trips (answer, then copied/end) and an open: measured
    // 1,000 files of 64 KiB at 780/s against the stream's 972/s on the
    // same node, so small files go by the stream.
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
        r.name = "LOCAL";
        r.reach = "node";
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
        char link[64];
        std::snprintf(link, sizeof link, "/proc/self/fd/%d", job->fd.get());
        char path[PATH_MAX];
        ssize_t n = ::readlink(link, path, sizeof path - 1);
        struct stat sb;
        if (n <= 0 || ::fstat(job->fd.get(), &sb) != 0) {
            done(Status(DYAD_RC_BADFIO, "cannot name the open file '" + job->upath + "'", errno), 0,
                 "");
            return;
        }
        path[n] = '\0';
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
            auto c = meta_u64(m, "copied");
            if (!c)
                return finish(Status(DYAD_RC_BADRPC, "LOCAL update without 'copied'", EPROTO), 0);
            finish(Status::ok(), *c);
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
        job->ch->send({{"size", job->size},
                       {"transport", "LOCAL"},
                       {"path", std::string(path)},
                       {"dev", static_cast<uint64_t>(sb.st_dev)},
                       {"ino", static_cast<uint64_t>(sb.st_ino)}});
    }

  private:
    Attributes attrs_;
    uint64_t handed_ = 0, copied_ = 0;
};

// Copies `size` bytes of `in` to the sink: reflink, copy_file_range, or
// read/write, whichever the filesystems allow first.
Status copy_into(int in, uint64_t size, Sink& sink, const std::string& what, std::string* how) {
    // The owner reads nothing, so there is no checksum to compare with:
    // the sink checks the size (and the owner held the file's lock).
    sink.copied(0);
    int out = sink.fd();
    if (out >= 0 && size > 0 && ::ioctl(out, FICLONE, in) == 0) {
        sink.copied(size);
        *how = "reflink";
        return Status::ok();
    }
    uint64_t done = 0;
    bool kernel = out >= 0;
    while (kernel && done < size) {
        ssize_t r =
            ::copy_file_range(in, nullptr, out, nullptr,
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
                            static_cast<off_t>(done));
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
        auto f = ch.first("LOCAL");
        if (!f) return f.status();
        auto path = meta_str(f->meta, "path");
        auto size = meta_u64(f->meta, "size");
        if (!path || !size || f->data_len != 0)
            return Status(DYAD_RC_BADRPC, "LOCAL answer without the file's path and size", EPROTO);
        UniqueFd in(::open(path->c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY));
        if (!in.valid())
            return Status(DYAD_RC_BADFIO,
                          "LOCAL: cannot open the producer's file '" + *path +
                              "' (the consumer needs read access to the producer's directory; "
                              "or use another DYAD_DTL_MODE)",
                          errno);
        struct stat sb;
        if (::fstat(in.get(), &sb) != 0 ||
            static_cast<uint64_t>(sb.st_dev) != meta_u64(f->meta, "dev").value_or(0) ||
            static_cast<uint64_t>(sb.st_ino) != meta_u64(f->meta, "ino").value_or(0))
            return Status(DYAD_RC_BADFIO,
                          "LOCAL: '" + *path +
                              "' is not the file the owner service opened (another machine or "
                              "a file system view this consumer does not share)",
                          ESTALE);
        std::string how;
        Status s = copy_into(in.get(), *size, sink, "'" + *path + "'", &how);
        if (!s) return s;
        DYAD_DEBUG(kSub, "copied %s (%llu bytes) by %s", path->c_str(),
                   static_cast<unsigned long long>(*size), how.c_str());
        s = ch.update({{"copied", *size}});
        if (!s) return s;
        auto t = ch.end("LOCAL");
        if (!t) return t;
        t.value()["copy"] = how;
        return t;
    }

  private:
    Attributes attrs_;
};

}  // namespace

Backend local_backend() {
    return {"LOCAL",
            {},
            local_attributes,
            []() -> Result<std::unique_ptr<Receiver>> {
                return std::unique_ptr<Receiver>(new LocalReceiver());
            },
            [](asio::io_context&) -> Result<std::unique_ptr<Sender>> {
                return std::unique_ptr<Sender>(new LocalSender());
            }};
}

}  // namespace dyad::dtl
