// SPDX-License-Identifier: Apache-2.0
// The server side of one request: its answer frames, cancellation and
// deadline, forwarded to the loop and its session.
#include <algorithm>
#include <cerrno>

#include "session.hpp"
#include "common/json_text.hpp"

namespace dyad::rpc {

namespace {
// The header of one of this request's frames.
Header frame_header(Type type, uint32_t tag, int32_t errnum = 0) {
    Header h;
    h.type = type;
    h.tag = tag;
    h.errnum = errnum;
    return h;
}
// A frame's meta as sent: nothing for null (meta_len 0).
std::string meta_text(const nlohmann::json& meta) {
    return meta.is_null() ? std::string() : meta.dump(-1, ' ', false, kBadUtf8Replaced);
}
}  // namespace

Request::Request(std::weak_ptr<Session> s, asio::io_context& io, uint32_t tag, nlohmann::json args)
    : session_(std::move(s)),
      arrived_(std::chrono::steady_clock::now()),
      io_(io),
      tag_(tag),
      args_(std::move(args)) {
    topic_ = args_.value("topic", "");
    if (auto p = session_.lock()) connection_ = p->id();
}

Request::~Request() = default;

std::string Request::local_host() const {
    auto s = session_.lock();
    return s ? s->local_host() : std::string();
}

bool Request::over_unix() const {
    auto s = session_.lock();
    return s && s->over_unix();
}

uint64_t Request::session_id() const {
    auto s = session_.lock();
    return s ? s->id() : 0;
}

const Peer& Request::peer() const {
    return peer_;
}

std::string Request::peer_service() const {
    return peer_.role == "service" ? peer_.service_id : std::string();
}

void Request::respond(nlohmann::json meta, asio::const_buffer data, WriteDone done,
                      uint8_t tag_flags) {
    auto self = shared_from_this();
    asio::dispatch(
        io_, [self, meta = std::move(meta), data, done = std::move(done), tag_flags]() mutable {
            auto s = self->session_.lock();
            if (self->finished_ || !s) {
                if (done) done(false);
                return;
            }
            Header h = frame_header(Type::response, self->tag_);
            h.flags = tag_flags & kTagFlags;
            s->send(h, meta_text(meta), data, std::move(done));
        });
}

void Request::respond_file(nlohmann::json meta, int fd, uint64_t off, size_t len, WriteDone done) {
    auto self = shared_from_this();
    // The fd is duplicated now, on the caller's thread, so it may be closed
    // as soon as this returns.
    auto dup = std::make_shared<UniqueFd>(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    asio::dispatch(io_,
                   [self, meta = std::move(meta), dup, off, len, done = std::move(done)]() mutable {
                       auto s = self->session_.lock();
                       if (self->finished_ || !s || !dup->valid()) {
                           if (done) done(false);
                           return;
                       }
                       s->send_file(frame_header(Type::response, self->tag_), meta_text(meta),
                                    dup->get(), off, len, std::move(done));
                   });
}

void Request::respond_with_fd(nlohmann::json meta, int fd, WriteDone done) {
    auto self = shared_from_this();
    // Duplicated now, on the caller's thread, so it may be closed as soon as
    // this returns; the session closes its copy once sent (or dropped).
    auto dup = std::make_shared<UniqueFd>(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    asio::dispatch(io_, [self, meta = std::move(meta), dup, done = std::move(done)]() mutable {
        auto s = self->session_.lock();
        if (self->finished_ || !s || !dup->valid() || !s->over_unix()) {
            if (done) done(false);
            return;
        }
        s->send_with_fd(frame_header(Type::response, self->tag_), meta_text(meta), std::move(*dup),
                        std::move(done));
    });
}

void Request::end(nlohmann::json meta) {
    end(std::move(meta), std::string());
}

void Request::end(nlohmann::json meta, std::string data) {
    if (closing_.exchange(true)) return;
    end_on_loop(std::move(meta), std::make_shared<std::string>(std::move(data)));
}

void Request::end_now(nlohmann::json meta) {
    if (io_.get_executor().running_in_this_thread()) return end(std::move(meta));
    auto s = session_.lock();
    if (closing_.exchange(true)) return;
    if (!s || !s->send_now(frame_header(Type::end, tag_), meta_text(meta)))
        return end_on_loop(std::move(meta), std::make_shared<std::string>());
    // Written: the rest of end() on the loop (the connection's count of
    // requests in flight, the deadline's timer, the observer).
    auto self = shared_from_this();
    asio::post(io_, [self] {
        self->finish();
        self->notify(Outcome::How::ended, 0, {}, DYAD_RC_OK);
        if (auto s = self->session_.lock()) s->request_finished(self->tag_);
    });
}

void Request::end_on_loop(nlohmann::json meta, std::shared_ptr<std::string> bytes) {
    auto self = shared_from_this();
    asio::dispatch(io_, [self, meta = std::move(meta), bytes] {
        self->finish();
        self->notify(Outcome::How::ended, 0, {}, DYAD_RC_OK);
        if (auto s = self->session_.lock()) {
            Header h = frame_header(Type::end, self->tag_);
            if (!bytes->empty()) h.flags = kFlagTagData;  // a compact answer's data
            if (bytes->empty())
                s->send(h, meta_text(meta), {}, {});
            else
                s->send(h, meta_text(meta), asio::buffer(*bytes), [bytes](bool) {});
            s->request_finished(self->tag_);
        }
    });
}

void Request::error(int errnum, const std::string& msg, dyad_rc_t rc) {
    if (closing_.exchange(true)) return;
    auto self = shared_from_this();
    asio::dispatch(io_, [self, errnum, msg, rc] {
        self->finish();
        self->notify(Outcome::How::error, errnum, msg, rc);
        if (auto s = self->session_.lock()) {
            s->send(frame_header(Type::error, self->tag_, errnum),
                    meta_text({{"msg", msg}, {"rc", static_cast<int>(rc)}}), {}, {});
            s->request_finished(self->tag_);
        }
    });
}

void Request::fail(const Status& s) {
    error(s.err() ? s.err() : EIO, s.message(), s.rc());
}

void Request::finish() {
    finished_ = true;
    charge_.reset();
    if (timer_) timer_->cancel();
    on_cancel_ = nullptr;
    on_update_ = nullptr;
}

void Request::notify(Outcome::How how, int errnum, std::string msg, dyad_rc_t rc) {
    if (!observer_) return;
    Outcome o;
    o.how = how;
    o.errnum = errnum;
    o.msg = std::move(msg);
    o.rc = rc;
    try {
        observer_->finished(*this, o);
    } catch (const std::exception&) {
        // an observer never stops the answer
    }
}

void Request::on_cancel(std::function<void()> fn) {
    if (cancelled_) {
        asio::post(io_, std::move(fn));
        return;
    }
    on_cancel_ = std::move(fn);
}

void Request::cancel(int why) {
    if (closing_.exchange(true)) return;
    finished_ = true;
    cancelled_ = true;
    charge_.reset();
    if (timer_) timer_->cancel();
    auto fn = std::move(on_cancel_);
    on_cancel_ = nullptr;
    on_update_ = nullptr;
    if (fn) fn();
    if (why == ETIMEDOUT)
        notify(Outcome::How::expired, why, "request deadline passed on the service",
               DYAD_RC_TIMEOUT);
    else
        notify(Outcome::How::cancelled, why,
               why == ECANCELED ? "cancelled by the client" : "the client went away", DYAD_RC_OK);
    if (auto s = session_.lock()) {
        if (why == ETIMEDOUT) {
            s->send(frame_header(Type::error, tag_, ETIMEDOUT),
                    meta_text({{"msg", "request deadline passed on the service"},
                               {"rc", static_cast<int>(DYAD_RC_TIMEOUT)}}),
                    {}, {});
        }
        s->request_finished(tag_);
    }
}

void Request::arm_deadline() {
    int64_t ms = 0;
    auto it = args_.find("timeout_ms");
    if (it != args_.end() && it->is_number_integer()) ms = it->get<int64_t>();
    if (ms <= 0) return;
    ms = std::min<int64_t>(ms, int64_t{1000} * 1000 * 1000 * 1000);  // ~30 years
    timer_ = std::make_unique<asio::steady_timer>(io_, std::chrono::milliseconds(ms));
    std::weak_ptr<Request> weak = shared_from_this();
    timer_->async_wait([weak](asio::error_code ec) {
        if (ec) return;
        if (auto r = weak.lock()) r->cancel(ETIMEDOUT);
    });
}

void Request::cap_deadline(std::chrono::milliseconds most) {
    const auto at = arrived_ + most;
    if (finished_ || (timer_ && timer_->expiry() <= at)) return;
    if (!timer_) timer_ = std::make_unique<asio::steady_timer>(io_);
    timer_->expires_at(at);  // (the earlier wait, if any, ends aborted)
    std::weak_ptr<Request> weak = shared_from_this();
    timer_->async_wait([weak](asio::error_code ec) {
        if (ec) return;
        if (auto r = weak.lock()) r->cancel(ETIMEDOUT);
    });
}

void Request::keep_only(const std::vector<std::string>& names) {
    if (!args_.is_object()) return;
    for (auto it = args_.begin(); it != args_.end();) {
        const std::string& k = it.key();
        if (k == "topic" || k == "timeout_ms" ||
            std::find(names.begin(), names.end(), k) != names.end())
            ++it;
        else
            it = args_.erase(it);
    }
}

void Request::close_connection() {
    auto self = shared_from_this();
    asio::dispatch(io_, [self] {
        if (auto s = self->session_.lock()) s->close();
    });
}

}  // namespace dyad::rpc
