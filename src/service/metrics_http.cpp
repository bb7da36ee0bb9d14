// SPDX-License-Identifier: Apache-2.0
// dyadd's metrics endpoint over Boost.Beast (see metrics_http.hpp).
#include "metrics_http.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/log.hpp"
#include "rpc/principal.hpp"

namespace dyad::service {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

constexpr const char* kSub = "metrics";
constexpr size_t kBodyLimit = 4096;     // a GET has none; a small one is read and ignored
constexpr size_t kBufferLimit = 16384;  // bytes read ahead of the parser, at most
constexpr int kWriteTimeoutS = 10;      // for a client to take the answer
constexpr std::array<unsigned, 8> kCodes = {200, 400, 404, 405, 413, 431, 503, 500};
constexpr const char* kMetricsType = "text/plain; version=0.0.4; charset=utf-8";
constexpr const char* kText = "text/plain; charset=utf-8";
constexpr auto kRenderInterval = std::chrono::milliseconds(200);

}  // namespace

struct MetricsHttp::Impl {
    class Conn;

    // The slot a connection holds: a regular one, one of the /healthz-only
    // reserve, or one kept for the service's own uid and root.
    enum class Slot { regular, health, trusted };
    struct Stats {
        std::atomic<uint64_t> active{0}, accepted{0}, rejected{0}, timeouts{0};
        std::atomic<uint64_t> reserve_active{0}, trusted_active{0}, renders{0};
        std::atomic<uint64_t> refused{0}, principal_capped{0}, trusted_admitted{0};
        std::array<std::atomic<uint64_t>, kCodes.size()> responses{};
        void count(unsigned code) {
            for (size_t i = 0; i < kCodes.size(); ++i)
                if (kCodes[i] == code) responses[i]++;
        }
    };
    // Lets the service's threads post answers here while the server runs,
    // and never after: stop() clears io under mu.
    struct Gate {
        std::mutex mu;
        net::io_context* io = nullptr;
        template <class F>
        void post(F&& f) {
            std::lock_guard<std::mutex> lk(mu);
            if (io) net::post(*io, std::forward<F>(f));
        }
    };

    explicit Impl(MetricsSource s) : src(std::move(s)) { gate->io = &io; }

    // Slots held per principal (the io thread's alone), by Slot.
    std::unordered_map<std::string, std::array<size_t, 3>> held;
    std::optional<Slot> admit(const rpc::Principal& p);
    void release(const std::string& who, Slot slot);
    std::atomic<uint64_t>& gauge(Slot slot) {
        return slot == Slot::regular  ? stats.active
               : slot == Slot::health ? stats.reserve_active
                                      : stats.trusted_active;
    }

    void accept();
    std::string own_metrics() const;
    // Every /metrics answer is rendered by the service's loop after its
    // request arrived, but requests that arrive together share one
    // rendering, and the loop renders at most once per kRenderInterval:
    // however many scrapers, the service's loop spends little on them.
    void want_metrics(std::weak_ptr<Conn> c);
    void schedule_render();
    void render();
    std::vector<std::weak_ptr<Conn>> next_batch;  // wait for the next rendering
    bool rendering = false;
    bool render_scheduled = false;
    std::chrono::steady_clock::time_point last_render{};

    MetricsSource src;
    Stats stats;  // before io: connections still queued in io count themselves out
    net::io_context io{1};
    std::shared_ptr<Gate> gate = std::make_shared<Gate>();
    tcp::acceptor acceptor{io};
    net::steady_timer retry{io};
    net::steady_timer render_timer{io};
    std::thread thread;
};

// One client connection: reads requests one at a time (keep-alive), asks
// the service, answers.
class MetricsHttp::Impl::Conn : public std::enable_shared_from_this<Conn> {
  public:
    // A connection in `slot` of principal `who`; beyond the regular slots
    // (reserve_) it is answered /healthz only.
    Conn(Impl& impl, tcp::socket s, std::string who, Slot slot)
        : impl_(impl),
          stream_(std::move(s)),
          buf_(kBufferLimit),
          timer_(impl.io),
          who_(std::move(who)),
          slot_(slot),
          reserve_(slot != Slot::regular) {
        beast::error_code ec;
        auto ep = stream_.socket().remote_endpoint(ec);
        if (!ec) peer_ = ep.address().to_string() + ":" + std::to_string(ep.port());
    }
    ~Conn() { impl_.release(who_, slot_); }

    void start() { read(); }

  private:
    void read() {
        parser_.emplace();
        parser_->header_limit(MetricsHttp::kHeaderLimit);
        parser_->body_limit(kBodyLimit);
        version_ = 11;
        keep_ = false;
        // The whole request within the deadline (a client holding half a
        // request is dropped; it never delays another connection).
        stream_.expires_after(std::chrono::seconds(reserve_ ? MetricsHttp::kHealthTimeoutS
                                                            : MetricsHttp::kReadTimeoutS));
        http::async_read(
            stream_, buf_, *parser_,
            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
    }

    void on_read(beast::error_code ec) {
        if (ec == http::error::end_of_stream || ec == http::error::partial_message)
            return close();  // the client closed (between or within requests)
        if (ec == beast::error::timeout) {
            impl_.stats.timeouts++;
            return close();
        }
        if (ec) {
            if (&ec.category() != &http::make_error_code(http::error::bad_method).category())
                return close();  // reset and the like
            // Not an HTTP/1.x request we take: binary bytes, a TLS hello,
            // bad framing, too large. An answer, then the close.
            unsigned code = 400;
            std::string why = "bad request: " + ec.message();
            if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
                code = 431;
                why = "request header fields too large (at most " +
                      std::to_string(MetricsHttp::kHeaderLimit) + " bytes)";
            } else if (ec == http::error::body_limit) {
                code = 413;
                why = "request body too large";
            }
            DYAD_DEBUG(kSub, "%s: %u (%s)", peer_.c_str(), code, ec.message().c_str());
            return respond(code, why + "\n", kText, true);
        }
        auto& req = parser_->get();
        version_ = req.version() == 10 ? 10 : 11;
        keep_ = req.keep_alive();
        std::string_view target(req.target().data(), req.target().size());
        target = target.substr(0, target.find('?'));
        method_ = std::string(req.method_string());
        target_ = std::string(target.substr(0, 100));
        if (target != "/metrics" && target != "/healthz")
            return respond(404, "not found: this endpoint serves GET /metrics and GET /healthz\n",
                           kText, false);
        if (req.method() != http::verb::get)
            return respond(405, "method not allowed: GET only\n", kText, false, true);
        if (reserve_ && target != "/healthz")
            return respond(503,
                           "busy: " + std::to_string(MetricsHttp::kMaxConnections) +
                               " connections are open, or " +
                               std::to_string(MetricsHttp::kMaxPerPrincipal) +
                               " of yours; beyond them only GET /healthz is answered\n",
                           kText, true);
        if (reserve_) keep_ = false;  // one answer, then the slot is free again
        ask(target == "/metrics");
    }

    // Asks the service; answers 503 if its loop does not answer in time.
    void ask(bool metrics) {
        waiting_ = true;
        timer_.expires_after(std::chrono::seconds(MetricsHttp::kServiceTimeoutS));
        timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
            if (ec || !self->waiting_) return;
            self->respond(503,
                          "the service did not answer within " +
                              std::to_string(MetricsHttp::kServiceTimeoutS) + " s\n",
                          kText, false);
        });
        // The answer comes on a thread of the service: it is posted here,
        // and dropped if this connection or the server is gone by then.
        std::weak_ptr<Conn> weak = shared_from_this();
        auto gate = impl_.gate;
        if (metrics) {
            impl_.want_metrics(weak);
        } else {
            impl_.src.health([gate, weak](bool ok, std::string why) {
                gate->post([weak, ok, why = std::move(why)]() mutable {
                    if (auto self = weak.lock()) self->health_ready(ok, std::move(why));
                });
            });
        }
    }

  public:
    void metrics_ready(std::string text) {
        if (!waiting_) return;
        impl_.stats.count(200);
        text += impl_.own_metrics();
        respond(200, std::move(text), kMetricsType, false, false, false);
    }

  private:
    void health_ready(bool ok, std::string why) {
        if (!waiting_) return;
        if (ok) return respond(200, "ok\n", kText, false);
        respond(503, (why.empty() ? std::string("unhealthy") : why) + "\n", kText, false);
    }

    void respond(unsigned code, std::string body, const char* type, bool close, bool allow = false,
                 bool count = true) {
        waiting_ = false;
        timer_.cancel();
        if (count) impl_.stats.count(code);
        DYAD_DEBUG(kSub, "%s %s %s: %u", peer_.c_str(), method_.empty() ? "-" : method_.c_str(),
                   target_.empty() ? "-" : target_.c_str(), code);
        auto res = std::make_shared<http::response<http::string_body>>(
            static_cast<http::status>(code), version_);
        res->set(http::field::server, "dyadd");
        res->set(http::field::content_type, type);
        res->set(http::field::cache_control, "no-store");
        if (allow) res->set(http::field::allow, "GET");
        res->keep_alive(!close && keep_);
        res->body() = std::move(body);
        res->prepare_payload();
        stream_.expires_after(std::chrono::seconds(kWriteTimeoutS));
        http::async_write(stream_, *res,
                          [self = shared_from_this(), res](beast::error_code ec, size_t) {
                              if (ec || !res->keep_alive()) return self->close();
                              self->read();
                          });
    }

    void close() {
        waiting_ = false;
        timer_.cancel();
        beast::error_code ec;
        stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
        stream_.socket().close(ec);
    }

    Impl& impl_;
    beast::tcp_stream stream_;
    beast::flat_buffer buf_;
    std::optional<http::request_parser<http::string_body>> parser_;
    net::steady_timer timer_;
    std::string peer_ = "?";
    const std::string who_;  // its principal
    const Slot slot_;
    std::string method_, target_;
    unsigned version_ = 11;
    bool keep_ = false;
    bool waiting_ = false;  // for the service's answer
    const bool reserve_;
};

void MetricsHttp::Impl::want_metrics(std::weak_ptr<Conn> c) {
    next_batch.push_back(std::move(c));
    if (!rendering && !render_scheduled) schedule_render();  // else the next rendering takes it
}

void MetricsHttp::Impl::schedule_render() {
    render_scheduled = true;
    render_timer.expires_at(last_render + kRenderInterval);
    render_timer.async_wait([this](beast::error_code ec) {
        if (!ec) render();
    });
}

void MetricsHttp::Impl::render() {
    render_scheduled = false;
    rendering = true;
    last_render = std::chrono::steady_clock::now();
    stats.renders++;
    auto batch = std::make_shared<std::vector<std::weak_ptr<Conn>>>(std::move(next_batch));
    next_batch.clear();
    auto g = gate;
    src.metrics([this, g, batch](std::string text) {
        g->post([this, batch, text = std::move(text)] {
            rendering = false;
            for (auto& w : *batch)
                if (auto c = w.lock()) c->metrics_ready(text);
            if (!next_batch.empty() && !render_scheduled) schedule_render();
        });
    });
}

void MetricsHttp::Impl::accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket s) {
        if (ec == net::error::operation_aborted) return;
        if (ec) {
            // Out of descriptors (EMFILE) and the like: back off, do not spin.
            DYAD_WARN(kSub, "accept failed: %s; retrying in 100 ms", ec.message().c_str());
            retry.expires_after(std::chrono::milliseconds(100));
            retry.async_wait([this](beast::error_code e) {
                if (!e) accept();
            });
            return;
        }
        // Who it is, as the kernel says (a local uid, a remote host): one
        // principal's connections cannot take every slot, and /healthz is
        // answered beyond them (an orchestrator that sees no answer
        // restarts the service).
        const rpc::Principal who = rpc::principal_of(s.native_handle());
        if (auto slot = admit(who)) {
            (*slot == Slot::regular ? stats.accepted : stats.rejected)++;
            if (*slot == Slot::trusted) stats.trusted_admitted++;
            std::make_shared<Conn>(*this, std::move(s), who.key, *slot)->start();
        } else {
            stats.rejected++;
            stats.refused++;  // counted, not logged: a flood would flood the log
            beast::error_code ignored;
            s.close(ignored);
        }
        accept();
    });
}

// The slot for a new connection of `p`, counted as held; none: close it.
std::optional<MetricsHttp::Impl::Slot> MetricsHttp::Impl::admit(const rpc::Principal& p) {
    auto& mine = held[p.key];
    std::optional<Slot> slot;
    const bool capped = mine[0] >= MetricsHttp::kMaxPerPrincipal;
    if (capped) stats.principal_capped++;
    if (!capped && stats.active.load() < MetricsHttp::kMaxConnections)
        slot = Slot::regular;
    else if (stats.reserve_active.load() < MetricsHttp::kHealthReserve &&
             mine[1] < MetricsHttp::kHealthPerPrincipal)
        slot = Slot::health;
    else if (p.trusted && stats.trusted_active.load() < MetricsHttp::kTrustedReserve)
        slot = Slot::trusted;
    if (!slot) {
        if (mine[0] + mine[1] + mine[2] == 0) held.erase(p.key);
        return slot;
    }
    ++mine[static_cast<size_t>(*slot)];
    gauge(*slot)++;
    return slot;
}

void MetricsHttp::Impl::release(const std::string& who, Slot slot) {
    gauge(slot)--;
    auto it = held.find(who);
    if (it == held.end()) return;
    auto& n = it->second[static_cast<size_t>(slot)];
    if (n > 0) --n;
    if (it->second[0] + it->second[1] + it->second[2] == 0) held.erase(it);
}

std::string MetricsHttp::Impl::own_metrics() const {
    std::string t;
    auto one = [&t](const char* name, const char* type, const std::string& help, uint64_t v) {
        t += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
             name + " " + std::to_string(v) + "\n";
    };
    one("dyad_metrics_http_connections", "gauge", "open connections of this metrics endpoint",
        stats.active.load());
    one("dyad_metrics_http_connections_total", "counter",
        "connections this metrics endpoint accepted", stats.accepted.load());
    one("dyad_metrics_http_connections_rejected_total", "counter",
        "connections beyond the " + std::to_string(MetricsHttp::kMaxConnections) +
            " this endpoint serves, or the " + std::to_string(MetricsHttp::kMaxPerPrincipal) +
            " of one principal (answered GET /healthz only, or closed at once)",
        stats.rejected.load());
    one("dyad_metrics_http_connections_refused_total", "counter",
        "connections closed at once: no slot left for their principal, not even a /healthz one",
        stats.refused.load());
    one("dyad_metrics_http_principal_capped_total", "counter",
        "connections whose principal (a local uid, a remote host) already held " +
            std::to_string(MetricsHttp::kMaxPerPrincipal) + " regular slots",
        stats.principal_capped.load());
    one("dyad_metrics_http_trusted_reserve_total", "counter",
        "connections of the service's own uid or root let in to the slots kept for them",
        stats.trusted_admitted.load());
    one("dyad_metrics_http_renders_total", "counter",
        "metrics texts the service's loop rendered (requests arriving together share one, at "
        "most one every 200 ms)",
        stats.renders.load());
    one("dyad_metrics_http_timeouts_total", "counter",
        "connections closed because a whole request did not arrive within " +
            std::to_string(MetricsHttp::kReadTimeoutS) + " s",
        stats.timeouts.load());
    t += "# HELP dyad_metrics_http_responses_total responses of this metrics endpoint, by status "
         "code\n# TYPE dyad_metrics_http_responses_total counter\n";
    for (size_t i = 0; i < kCodes.size(); ++i)
        t += "dyad_metrics_http_responses_total{code=\"" + std::to_string(kCodes[i]) + "\"} " +
             std::to_string(stats.responses[i].load()) + "\n";
    return t;
}

MetricsHttp::MetricsHttp(MetricsSource src) : impl_(std::make_unique<Impl>(std::move(src))) {}

MetricsHttp::~MetricsHttp() {
    stop();
}

Result<std::string> MetricsHttp::listen(const std::string& host, uint16_t port) {
    beast::error_code ec;
    auto addr = net::ip::make_address(host, ec);
    if (ec) {
        tcp::resolver res(impl_->io);
        auto eps = res.resolve(host, std::to_string(port), ec);
        if (ec || eps.empty())
            return Status(DYAD_RC_CONNFAIL,
                          "--metrics-listen: cannot resolve '" + host + "': " + ec.message(),
                          EINVAL);
        addr = eps.begin()->endpoint().address();
    }
    tcp::endpoint ep(addr, port);
    auto& acc = impl_->acceptor;
    acc.open(ep.protocol(), ec);
    if (!ec) acc.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acc.bind(ep, ec);
    if (!ec) acc.listen(net::socket_base::max_listen_connections, ec);
    if (ec)
        return Status(DYAD_RC_CONNFAIL,
                      "--metrics-listen: cannot listen on " + host + ":" + std::to_string(port) +
                          ": " + ec.message(),
                      ec.value());
    auto local = acc.local_endpoint(ec);
    std::string h = local.address().is_v6() ? "[" + local.address().to_string() + "]"
                                            : local.address().to_string();
    return h + ":" + std::to_string(local.port());
}

void MetricsHttp::start() {
    Impl* impl = impl_.get();
    impl->accept();
    impl->thread = std::thread([impl] {
        for (;;) {
            try {
                impl->io.run();
                return;
            } catch (const std::exception& e) {
                DYAD_ERROR(kSub, "unexpected exception on the metrics thread: %s", e.what());
            }
        }
    });
}

void MetricsHttp::stop() {
    if (!impl_) return;
    {
        std::lock_guard<std::mutex> lk(impl_->gate->mu);
        impl_->gate->io = nullptr;
    }
    impl_->io.stop();
    if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace dyad::service
