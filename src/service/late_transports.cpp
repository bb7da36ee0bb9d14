// SPDX-License-Identifier: Apache-2.0
// Transports set up after the service is ready (issue 46, item 8). UCX and
// libfabric take 0.1-0.5 s to initialise (ucp_init, fi_getinfo and the
// plugin's loading): a dyadd serves at once over the stream (and LOCAL) and
// sets them up on a thread of its own. Each one's sender is installed on the
// loop when it is made, its records join the service's, and the service
// registers again so that consumers see them (docs/design.md, "Start-up").
//
// Meanwhile: AUTO does not pick a transport whose set-up is not done (the
// registered records do not list it yet; a consumer that already read the
// owner's records keeps them). A fetch asking for it by name (a fixed
// DYAD_DTL_MODE) is held until it is set up, then served, or answered with
// why it is not served; it keeps its own deadline (and waits kMaxHold at
// most). --mode names a
// transport set up before the service is ready (a fixed mode that cannot
// work is still an error at start), and so does --transports-at-start for
// all of them.
#include <signal.h>

#include <cctype>
#include <chrono>

#include "common/json_text.hpp"
#include "common/log.hpp"
#include "proto/hello.hpp"
#include "service.hpp"

namespace dyad::service {
namespace {
constexpr const char* kSub = "dyadd";
// Fetches held for transports being set up, at most (more are refused,
// EBUSY: the consumer tries again or another transport).
constexpr size_t kMaxHeld = 1024;
// A fetch waits at most this long for its transport's set-up.
constexpr std::chrono::seconds kMaxHold{30};

std::string upper(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
}
}  // namespace

Service::KeepSignalHandlers::KeepSignalHandlers() {
    ::sigaction(SIGTERM, nullptr, &before[0]);
    ::sigaction(SIGINT, nullptr, &before[1]);
}

Service::KeepSignalHandlers::~KeepSignalHandlers() {
    ::sigaction(SIGTERM, &before[0], nullptr);
    ::sigaction(SIGINT, &before[1], nullptr);
}

bool Service::starts_late(const dtl::Backend& b, const std::string& mode) const {
    return opts_.late_transports && !b.universal && b.kind != dtl::Kind::local && b.name != mode;
}

Status Service::set_aside_late_figures() {
    if (late_.empty() || opts_.figures.empty()) return Status::ok();
    std::string now, later;
    std::vector<dtl::TransportRecord> placeholders;
    for (const dtl::Backend* b : late_)
        for (const char* reach : {proto::kReachNode, proto::kReachHost, proto::kReachNetwork}) {
            dtl::TransportRecord r;
            r.name = b->name;
            r.reach = reach;
            placeholders.push_back(r);
        }
    const std::string& spec = opts_.figures;
    for (size_t pos = 0; pos < spec.size();) {
        size_t end = spec.find(',', pos);
        if (end == std::string::npos) end = spec.size();
        const std::string item = spec.substr(pos, end - pos);
        pos = end + 1;
        const std::string who = upper(item.substr(0, item.find_first_of("@=")));
        bool is_late = false;
        for (const dtl::Backend* b : late_) is_late = is_late || upper(b->name) == who;
        (is_late ? later : now) += (item.empty() ? "" : item + ",");
    }
    // Their syntax is checked now; whether the transport offers that reach,
    // once it is set up.
    if (Status s = dtl::apply_figures(later, &placeholders); !s) return s;
    late_figures_ = later;
    opts_.figures = now;
    return Status::ok();
}

void Service::start_late_transports() {
    if (late_.empty()) {
        if (opts_.late_started) asio::post(io_, opts_.late_started);
        return;
    }
    std::string names;
    for (const dtl::Backend* b : late_) {
        starting_.insert(b->name);
        names += (names.empty() ? "" : ", ") + b->name;
    }
    DYAD_INFO(kSub, "setting up %s after the start (AUTO picks them once they are ready)",
              names.c_str());
    std::string eps;
    for (const auto& e : endpoints_) eps += (eps.empty() ? "" : " ") + e;
    late_thread_ = std::thread([this, eps] {
        // What transport libraries install for SIGTERM and SIGINT while they
        // initialise is undone (the signals are blocked meanwhile: dyadd's
        // main lets them through once late_started has run).
        auto keep = std::make_unique<KeepSignalHandlers>();
        size_t added = 0;
        for (const dtl::Backend* b : late_) {
            if (late_stop_) break;
            const auto t0 = std::chrono::steady_clock::now();
            auto made = b->make_sender(io_, bind_);
            const double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (made) {
                // Its records, on this thread before the loop has the sender.
                std::vector<dtl::TransportRecord> recs = made.value()->records();
                for (auto& r : recs)
                    if (r.address.empty()) r.address = eps;
                // An item naming a reach it does not offer only warns now.
                std::string spec = late_figures_;
                for (size_t pos = 0; pos < spec.size();) {
                    size_t end = spec.find(',', pos);
                    const std::string item = spec.substr(pos, end - pos);
                    pos = end == std::string::npos ? spec.size() : end + 1;
                    if (upper(item.substr(0, item.find_first_of("@="))) != upper(b->name)) continue;
                    if (Status s = dtl::apply_figures(item, &recs); !s)
                        DYAD_WARN(kSub, "%s", s.message().c_str());
                }
                std::lock_guard<std::mutex> lk(records_mu_);
                added += recs.size();
                for (auto& r : recs) records_.push_back(std::move(r));
            }
            auto box = std::make_shared<Result<std::unique_ptr<dtl::Sender>>>(std::move(made));
            asio::post(io_, [this, name = b->name, box, secs] {
                install_late(name, std::move(*box), secs);
            });
        }
        keep.reset();
        if (opts_.late_started) asio::post(io_, opts_.late_started);
        if (late_stop_ || !added) return;
        // Consumers read the owner's records from the registry.
        auto e = store_->register_service(
            id_, identity().build().dump(-1, ' ', false, kBadUtf8Replaced), Deadline::after(10));
        if (!e)
            DYAD_WARN(kSub,
                      "could not register the transports set up after the start: %s (consumers "
                      "use the others)",
                      e.status().message().c_str());
    });
}

void Service::install_late(const std::string& name, Result<std::unique_ptr<dtl::Sender>> made,
                           double seconds) {
    starting_.erase(name);
    if (made) {
        senders_[name] = std::move(made.value());
        files_.count(name);
        DYAD_INFO(kSub, "transport %s ready (set up in %.3f s after the start)", name.c_str(),
                  seconds);
    } else {
        DYAD_WARN(kSub, "transport %s unavailable: %s", name.c_str(),
                  made.status().to_string().c_str());
        unavailable_[name] = made.status().message();
    }
    server_->set_hello_info(proto::Hello{identity()}.build());
    auto held = std::move(held_[name]);
    held_.erase(name);
    for (auto& r : held)
        if (!r->finished()) files_.on_fetch(std::move(r));
}

bool Service::held_for_late(const std::shared_ptr<rpc::Request>& r) {
    if (starting_.empty()) return false;
    auto asked = proto::FetchRequest::transport_asked(r->args());
    if (!asked) return false;
    auto b = dtl::find_backend(*asked);
    if (!b || !starting_.count(b.value()->name)) return false;
    size_t n = 0;
    for (const auto& [k, v] : held_) n += v.size();
    if (n >= kMaxHeld) {
        r->fail(Status(DYAD_RC_BADDTLMODE,
                       "transport " + b.value()->name + " is still being set up on this service " +
                           "and " + std::to_string(kMaxHeld) + " fetches wait for it already",
                       EBUSY));
        return true;
    }
    held_[b.value()->name].push_back(r);
    // However long the fetch's own deadline: at most kMaxHold.
    auto timer = std::make_shared<asio::steady_timer>(io_, kMaxHold);
    timer->async_wait([this, timer, weak = std::weak_ptr<rpc::Request>(r),
                       name = b.value()->name](asio::error_code ec) {
        auto held = weak.lock();
        if (ec || !held || held->finished() || !starting_.count(name)) return;
        held->fail(Status(DYAD_RC_BADDTLMODE,
                          "transport " + name + " is still being set up on this service after " +
                              std::to_string(kMaxHold.count()) +
                              " s (see its log); use another DYAD_DTL_MODE, or AUTO",
                          ETIMEDOUT));
    });
    return true;
}

void Service::stop_late_transports() {
    late_stop_ = true;
    if (late_thread_.joinable()) late_thread_.join();
}

}  // namespace dyad::service
