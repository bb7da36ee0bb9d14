// SPDX-License-Identifier: Apache-2.0
// WorkQueue: N workers, first in first out, bounded, cancel, first error,
// and idle work taken by at most a limit of workers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "client/work_queue.hpp"

using dyad::Status;
using dyad::client::WorkQueue;
using namespace std::chrono_literals;

namespace {
// A latch the jobs wait on (std::latch is C++20).
class Gate {
  public:
    void open() {
        std::lock_guard<std::mutex> lk(mu_);
        open_ = true;
        cv_.notify_all();
    }
    bool wait(std::chrono::milliseconds limit = 5000ms) {
        std::unique_lock<std::mutex> lk(mu_);
        return cv_.wait_for(lk, limit, [&] { return open_; });
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool open_ = false;
};

bool eventually(const std::function<bool()>& cond) {
    for (int i = 0; i < 500; ++i) {
        if (cond()) return true;
        std::this_thread::sleep_for(10ms);
    }
    return cond();
}
}  // namespace

TEST(WorkQueue, RunsJobsOnEveryWorkerAtOnce) {
    WorkQueue q({4});
    std::atomic<int> running{0}, most{0};
    Gate all_in;
    for (int i = 0; i < 4; ++i)
        ASSERT_TRUE(q.push([&] {
            int now = ++running;
            int m = most.load();
            while (now > m && !most.compare_exchange_weak(m, now)) {
            }
            if (now == 4) all_in.open();
            bool ok = all_in.wait();
            --running;
            return ok ? Status::ok() : Status(DYAD_RC_TIMEOUT, "not all at once");
        }));
    EXPECT_TRUE(q.finish().is_ok());
    EXPECT_EQ(most.load(), 4);
}

TEST(WorkQueue, FinishRunsWhatIsQueuedAndGivesTheFirstError) {
    WorkQueue q({1});
    std::vector<int> order;
    for (int i = 0; i < 5; ++i)
        q.push([&, i] {
            order.push_back(i);
            if (i == 2) return Status(DYAD_RC_BADFIO, "two");
            if (i == 4) return Status(DYAD_RC_BADFIO, "four");
            return Status::ok();
        });
    Status s = q.finish();
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));  // first in, first out
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.message(), "two");
    EXPECT_EQ(q.first_error().message(), "two");
}

TEST(WorkQueue, PushWaitsForRoomInABoundedQueue) {
    WorkQueue q({1, 2});
    Gate release;
    std::atomic<int> done{0};
    auto job = [&] {
        release.wait();
        ++done;
        return Status::ok();
    };
    Gate taken;
    ASSERT_TRUE(q.push([&] {  // taken by the worker, which waits in it
        taken.open();
        return job();
    }));
    ASSERT_TRUE(taken.wait());
    ASSERT_TRUE(q.push(job));
    ASSERT_TRUE(q.push(job));  // the queue is full now
    std::atomic<bool> pushed{false};
    std::thread t([&] {
        q.push(job);
        pushed = true;
    });
    std::this_thread::sleep_for(100ms);
    EXPECT_FALSE(pushed.load());
    release.open();
    t.join();
    EXPECT_TRUE(pushed.load());
    EXPECT_TRUE(q.finish().is_ok());
    EXPECT_EQ(done.load(), 4);
}

TEST(WorkQueue, CancelDropsQueuedJobsAndRefusesNewOnes) {
    WorkQueue q({1});
    Gate started, release;
    std::atomic<int> ran{0};
    q.push([&] {
        started.open();
        release.wait();
        ++ran;
        return Status::ok();
    });
    ASSERT_TRUE(started.wait());
    for (int i = 0; i < 3; ++i)
        q.push([&] {
            ++ran;
            return Status::ok();
        });
    q.cancel();
    EXPECT_TRUE(q.cancelled());
    EXPECT_FALSE(q.push([] { return Status::ok(); }));
    release.open();
    EXPECT_TRUE(q.finish().is_ok());
    EXPECT_EQ(ran.load(), 1);  // the running job ended on its own; the queued ones never ran
}

TEST(WorkQueue, AJobThatThrowsIsAnError) {
    WorkQueue q({2});
    q.push([]() -> Status { throw std::runtime_error("boom"); });
    Status s = q.finish();
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("boom"), std::string::npos);
}

TEST(WorkQueue, IdleWorkIsTakenByAtMostTheLimitWhileJobsStillRun) {
    std::mutex mu;
    int idle_left = 6;
    std::atomic<int> idle_running{0}, idle_most{0}, jobs_done{0};
    Gate release;
    WorkQueue::Options o;
    o.workers = 4;
    o.idle_limit = [] { return 2u; };
    o.idle = [&]() -> WorkQueue::Job {
        std::lock_guard<std::mutex> lk(mu);
        if (idle_left == 0) return nullptr;
        --idle_left;
        return [&] {
            int now = ++idle_running;
            int m = idle_most.load();
            while (now > m && !idle_most.compare_exchange_weak(m, now)) {
            }
            release.wait(200ms);
            --idle_running;
            return Status::ok();
        };
    };
    WorkQueue q(o);
    // Two workers wait in idle work; the other two still run the jobs.
    ASSERT_TRUE(eventually([&] { return idle_running.load() == 2; }));
    for (int i = 0; i < 10; ++i)
        q.push([&] {
            ++jobs_done;
            return Status::ok();
        });
    EXPECT_TRUE(eventually([&] { return jobs_done.load() == 10; }));
    release.open();
    EXPECT_TRUE(q.finish().is_ok());
    EXPECT_EQ(idle_most.load(), 2);
    EXPECT_EQ(idle_left, 0);
}

TEST(WorkQueue, WakeMakesIdleWorkersLookAgain) {
    std::mutex mu;
    bool have = false;
    std::atomic<int> ran{0};
    WorkQueue::Options o;
    o.workers = 2;
    o.idle = [&]() -> WorkQueue::Job {
        std::lock_guard<std::mutex> lk(mu);
        if (!have) return nullptr;
        have = false;
        return [&] {
            ++ran;
            return Status::ok();
        };
    };
    WorkQueue q(o);
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(ran.load(), 0);
    {
        std::lock_guard<std::mutex> lk(mu);
        have = true;
    }
    q.wake();
    EXPECT_TRUE(eventually([&] { return ran.load() == 1; }));
    EXPECT_TRUE(q.finish().is_ok());
}
