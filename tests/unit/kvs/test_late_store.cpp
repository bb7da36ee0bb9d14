// SPDX-License-Identifier: Apache-2.0
// kvs::LateStore (dyadd --store-late): calls wait for the store up to their
// own deadline, waits are held and forwarded once it is attached (TIMEOUT at
// their deadline, nothing after a cancel), a failure reaches every call.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "kvs/embedded_store.hpp"
#include "kvs/late_store.hpp"

using namespace dyad;

namespace {
std::shared_ptr<kvs::LateStore> late() {
    return std::make_shared<kvs::LateStore>("etcd", "10.0.0.1:2379", "etcd://10.0.0.1:2379");
}
std::shared_ptr<kvs::EmbeddedStore> embedded() {
    return std::make_shared<kvs::EmbeddedStore>(std::make_unique<kvs::MemoryStore>());
}
const std::string kRec = R"({"owner":"svc"})";
}  // namespace

TEST(LateStore, StartingCallsWaitUpToTheirDeadlineAndSayStarting) {
    auto s = late();
    const auto t0 = std::chrono::steady_clock::now();
    auto e = s->get("ns", "k", Deadline::after(0.1));
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(e);
    EXPECT_GE(took, 0.09);
    EXPECT_LT(took, 1.0);
    // Read as the store's outage: clients ask again until their deadline.
    EXPECT_TRUE(kvs::Outage::unreachable(e.status())) << e.status().to_string();
    EXPECT_NE(e.status().message().find("starting"), std::string::npos);
    auto st = s->status();
    EXPECT_EQ(st["starting"], true);
    EXPECT_EQ(st["reachable"], false);
    EXPECT_EQ(st["endpoint"], "10.0.0.1:2379");
    EXPECT_FALSE(s->down());  // held, not refused, while the start is young
    ASSERT_TRUE(s->outage());
    EXPECT_FALSE(s->outage()->up);
    bool ok = true;
    s->check([&](bool good, std::string) { ok = good; });
    EXPECT_FALSE(ok);
}

TEST(LateStore, ACallWaitingGoesToTheStoreOnceAttached) {
    auto s = late();
    auto real = embedded();
    ASSERT_TRUE(real->put("ns", "k", kRec, "svc", 0, Deadline::after(1)));
    auto got =
        std::async(std::launch::async, [&] { return s->get("ns", "k", Deadline::after(10)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    s->attach(real);
    auto e = got.get();
    ASSERT_TRUE(e) << e.status().to_string();
    EXPECT_EQ(e->value, kRec);
    EXPECT_FALSE(s->status().contains("starting"));
    EXPECT_GT(s->status()["reached_after_s"].get<double>(), 0.05);
}

TEST(LateStore, HeldWaitsAreForwardedOnAttach) {
    auto s = late();
    auto real = embedded();
    std::promise<Result<kvs::Entry>> answer;
    const uint64_t id = s->wait("ns", "k", Deadline::after(10),
                                [&](Result<kvs::Entry> e) { answer.set_value(std::move(e)); });
    EXPECT_NE(id, 0u);
    s->attach(real);
    ASSERT_TRUE(real->put("ns", "k", kRec, "svc", 0, Deadline::after(1)));
    auto f = answer.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    auto e = f.get();
    ASSERT_TRUE(e) << e.status().to_string();
    EXPECT_EQ(e->value, kRec);
}

TEST(LateStore, AHeldWaitTimesOutAtItsDeadline) {
    auto s = late();
    std::promise<Result<kvs::Entry>> answer;
    s->wait("ns", "k", Deadline::after(0.1),
            [&](Result<kvs::Entry> e) { answer.set_value(std::move(e)); });
    auto f = answer.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    auto e = f.get();
    ASSERT_FALSE(e);
    EXPECT_EQ(e.status().rc(), DYAD_RC_TIMEOUT);
}

TEST(LateStore, ACancelledWaitIsNeverAnswered) {
    auto s = late();
    auto real = embedded();
    std::atomic<int> answers{0};
    const uint64_t id =
        s->wait("ns", "k", Deadline::after(10), [&](Result<kvs::Entry>) { ++answers; });
    s->cancel(id);
    s->attach(real);
    ASSERT_TRUE(real->put("ns", "k", kRec, "svc", 0, Deadline::after(1)));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(answers.load(), 0);
}

TEST(LateStore, AFailureReachesHeldWaitsAndLaterCalls) {
    auto s = late();
    std::promise<Result<kvs::Entry>> answer;
    s->wait("ns", "k", Deadline::after(10),
            [&](Result<kvs::Entry> e) { answer.set_value(std::move(e)); });
    s->fail(Status(DYAD_RC_NOAUTH, "etcd refused user 'root'", EACCES));
    auto f = answer.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    EXPECT_EQ(f.get().status().rc(), DYAD_RC_NOAUTH);
    auto e = s->put("ns", "k", kRec, "svc", 0, Deadline::after(10));
    ASSERT_FALSE(e);
    EXPECT_EQ(e.status().rc(), DYAD_RC_NOAUTH);
    ASSERT_TRUE(s->down());
    EXPECT_EQ(s->down()->rc(), DYAD_RC_NOAUTH);
}
