// SPDX-License-Identifier: Apache-2.0
// The consumer-side chunk window (dtl/receive_window.hpp) with a scripted
// mover: slots in ring order within the depth, completions in any order
// handed over in order, acknowledgements, cancellation, the deadline, the
// write-behind writer.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "dtl/receive_window.hpp"
#include "dtl/write_behind.hpp"

using namespace dyad;
using namespace dyad::dtl;

namespace {

class MemorySink : public Sink {
  public:
    Status write(const void* p, size_t n) override {
        data.append(static_cast<const char*>(p), n);
        return Status::ok();
    }
    std::string data;
};

// The byte at file offset `off`.
char byte_at(uint64_t off) {
    return static_cast<char>('a' + off % 23);
}

std::string file_of(uint64_t size) {
    std::string s;
    for (uint64_t i = 0; i < size; ++i) s += byte_at(i);
    return s;
}

// A mover whose chunks land when wait() says: the oldest first, or the
// newest first (out of order), one per wait.
class ScriptedMover : public ChunkMover {
  public:
    bool newest_first = false;
    bool refuse_unless_must = false;  // "nothing here yet" unless nothing moves
    int fail_after_waits = -1;        // wait() fails on this call
    bool cancels_complete = true;     // settle() ends cancelled moves
    int rounds = 1000;

    std::vector<uint64_t> started, acks, cancelled_seqs;
    std::vector<size_t> slot_of;  // by seq
    size_t most_moving = 0;
    int waits = 0, settles = 0;
    bool clean = false, cancelled_called = false;

    Result<bool> start(ReceiveWindow& w, ChunkSlot& s, bool must) override {
        if (refuse_unless_must && !must) return false;
        started.push_back(s.seq);
        if (slot_of.size() <= s.seq) slot_of.resize(s.seq + 1);
        slot_of[s.seq] = s.index;
        most_moving = std::max(most_moving, w.moving() + 1);
        EXPECT_EQ(s.offset, s.seq * w.shape().chunk);
        return true;
    }

    Status wait(ReceiveWindow& w) override {
        if (++waits == fail_after_waits)
            return Status(DYAD_RC_BADFETCH, "the service went away", ECONNRESET);
        std::vector<ChunkSlot*> moving;
        for (auto& s : w.slots())
            if (s.state == ChunkSlot::State::moving) moving.push_back(&s);
        if (moving.empty()) return Status::ok();
        auto by_seq = [](ChunkSlot* a, ChunkSlot* b) { return a->seq < b->seq; };
        ChunkSlot* s = newest_first ? *std::max_element(moving.begin(), moving.end(), by_seq)
                                    : *std::min_element(moving.begin(), moving.end(), by_seq);
        for (size_t i = 0; i < s->len; ++i) s->buf[i] = byte_at(s->offset + i);
        w.complete(*s, Status::ok(), s->len);
        return Status::ok();
    }

    Status handed_over(const ReceiveWindow& w, const ChunkSlot& s) override {
        acks.push_back(s.seq);
        EXPECT_EQ(w.received(), s.offset + s.len);
        return Status::ok();
    }

    Result<nlohmann::json> end(ReceiveWindow& w) override {
        return nlohmann::json{{"size", w.received()}};
    }

    void cancel(ChunkSlot& s) override { cancelled_seqs.push_back(s.seq); }
    void settle() override {
        ++settles;
        if (!cancels_complete) return;
        for (auto& s : window->slots())
            if (s.state == ChunkSlot::State::moving)
                window->complete(s, Status(DYAD_RC_BADFETCH, "cancelled", ECANCELED), 0);
    }
    int cancel_rounds() const override { return rounds; }
    void cancelled(ReceiveWindow&, bool c) override {
        cancelled_called = true;
        clean = c;
    }

    ReceiveWindow* window = nullptr;
};

WindowShape shape(uint64_t size, size_t chunk, size_t slots, size_t depth,
                  std::vector<char>* memory) {
    memory->assign(slots * chunk, 0);
    WindowShape s;
    s.size = size;
    s.chunk = chunk;
    s.slots = slots;
    s.depth = depth;
    s.memory = memory->data();
    s.idle_s = 5;
    s.what = "TEST";
    return s;
}

}  // namespace

TEST(ReceiveWindow, HandsChunksOverInOrderAndAcknowledgesEach) {
    std::vector<char> mem;
    ReceiveWindow w(shape(10 * 4 + 3, 4, 3, 3, &mem));
    ScriptedMover m;
    m.window = &w;
    MemorySink sink;
    auto r = w.run(m, sink);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r.value()["size"], 43u);
    EXPECT_EQ(sink.data, file_of(43));
    ASSERT_EQ(m.acks.size(), 11u);
    for (uint64_t i = 0; i < m.acks.size(); ++i) EXPECT_EQ(m.acks[i], i);
    EXPECT_EQ(w.received(), 43u);
    EXPECT_EQ(w.delivered(), 11u);
}

TEST(ReceiveWindow, UsesSlotsInRingOrderWithinTheDepth) {
    std::vector<char> mem;
    ReceiveWindow w(shape(20 * 8, 8, 4, 2, &mem));
    ScriptedMover m;
    m.window = &w;
    MemorySink sink;
    ASSERT_TRUE(w.run(m, sink).is_ok());
    EXPECT_LE(m.most_moving, 2u);
    ASSERT_EQ(m.slot_of.size(), 20u);
    for (uint64_t seq = 0; seq < 20; ++seq) EXPECT_EQ(m.slot_of[seq], seq % 4) << seq;
}

TEST(ReceiveWindow, OutOfOrderCompletionsAreHandedOverInOrder) {
    std::vector<char> mem;
    ReceiveWindow w(shape(9 * 16 + 1, 16, 4, 4, &mem));
    ScriptedMover m;
    m.window = &w;
    m.newest_first = true;
    MemorySink sink;
    ASSERT_TRUE(w.run(m, sink).is_ok());
    EXPECT_EQ(sink.data, file_of(9 * 16 + 1));
    for (uint64_t i = 0; i < m.acks.size(); ++i) EXPECT_EQ(m.acks[i], i);
    EXPECT_EQ(m.acks.size(), 10u);
}

TEST(ReceiveWindow, StartsOnlyWhatIsThereUnlessNothingMoves) {
    std::vector<char> mem;
    ReceiveWindow w(shape(5 * 4, 4, 4, 4, &mem));
    ScriptedMover m;
    m.window = &w;
    m.refuse_unless_must = true;
    MemorySink sink;
    ASSERT_TRUE(w.run(m, sink).is_ok());
    EXPECT_EQ(m.most_moving, 1u);  // each start came with nothing else moving
    EXPECT_EQ(sink.data, file_of(20));
}

TEST(ReceiveWindow, AnEmptyFileMovesNothing) {
    std::vector<char> mem;
    ReceiveWindow w(shape(0, 4, 2, 2, &mem));
    ScriptedMover m;
    m.window = &w;
    MemorySink sink;
    auto r = w.run(m, sink);
    ASSERT_TRUE(r.is_ok());
    EXPECT_TRUE(m.started.empty());
    EXPECT_EQ(r.value()["size"], 0u);
}

TEST(ReceiveWindow, AFailureCancelsEveryMoveInFlight) {
    std::vector<char> mem;
    ReceiveWindow w(shape(10 * 4, 4, 3, 3, &mem));
    ScriptedMover m;
    m.window = &w;
    m.fail_after_waits = 3;  // two chunks landed, three moving
    MemorySink sink;
    auto r = w.run(m, sink);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message(), "the service went away");
    EXPECT_EQ(m.acks.size(), 2u);
    EXPECT_EQ(m.cancelled_seqs, (std::vector<uint64_t>{3, 4, 2}));  // by slot: 3 and 4 in 0, 1
    EXPECT_TRUE(m.cancelled_called);
    EXPECT_TRUE(m.clean);
    EXPECT_EQ(m.settles, 1);
}

TEST(ReceiveWindow, MovesThatWillNotEndAreReportedUnclean) {
    std::vector<char> mem;
    ReceiveWindow w(shape(10 * 4, 4, 2, 2, &mem));
    ScriptedMover m;
    m.window = &w;
    m.fail_after_waits = 1;
    m.cancels_complete = false;
    m.rounds = 7;
    MemorySink sink;
    ASSERT_FALSE(w.run(m, sink).is_ok());
    EXPECT_EQ(m.settles, 7);
    EXPECT_TRUE(m.cancelled_called);
    EXPECT_FALSE(m.clean);
}

TEST(ReceiveWindow, AFailedOrShortChunkEndsTheTransfer) {
    struct Failing : ScriptedMover {
        Status result;
        size_t short_by = 0;
        Status wait(ReceiveWindow& w) override {
            ChunkSlot* s = w.head();
            w.complete(*s, result, s->len - short_by);
            return Status::ok();
        }
    };
    {
        std::vector<char> mem;
        ReceiveWindow w(shape(8, 4, 2, 2, &mem));
        Failing m;
        m.window = &w;
        m.result = Status(DYAD_RC_BADFETCH, "read failed", EIO);
        MemorySink sink;
        auto r = w.run(m, sink);
        ASSERT_FALSE(r.is_ok());
        EXPECT_EQ(r.status().message(), "read failed");
        EXPECT_TRUE(sink.data.empty());
    }
    {
        std::vector<char> mem;
        ReceiveWindow w(shape(8, 4, 2, 2, &mem));
        Failing m;
        m.window = &w;
        m.short_by = 1;
        MemorySink sink;
        auto r = w.run(m, sink);
        ASSERT_FALSE(r.is_ok());
        EXPECT_EQ(r.status().rc(), DYAD_RC_BADFETCH);
        EXPECT_EQ(r.status().message(), "TEST chunk of 3 bytes, expected 4");
    }
}

TEST(ReceiveWindow, TheDeadlineRestartsWithProgress) {
    std::vector<char> mem;
    WindowShape sh = shape(8, 4, 2, 2, &mem);
    sh.idle_s = 0.05;
    ReceiveWindow w(sh);
    EXPECT_FALSE(w.idle().expired());
    std::this_thread::sleep_for(std::chrono::milliseconds(80));
    EXPECT_TRUE(w.idle().expired());
    w.progressed();
    EXPECT_FALSE(w.idle().expired());

    // A mover that waits out the deadline: the transfer times out, and
    // what was moving is cancelled.
    struct Silent : ScriptedMover {
        Status wait(ReceiveWindow& w) override {
            while (!w.idle().expired()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            return Status(DYAD_RC_TIMEOUT, "no data", ETIMEDOUT);
        }
    };
    ReceiveWindow w2(sh);
    Silent m;
    m.window = &w2;
    MemorySink sink;
    auto t0 = std::chrono::steady_clock::now();
    auto r = w2.run(m, sink);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().rc(), DYAD_RC_TIMEOUT);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(40));
    EXPECT_EQ(m.cancelled_seqs.size(), 2u);
}

TEST(ReceiveWindow, AWriterHoldsSlotsUntilWritten) {
    std::vector<char> mem;
    // Depth 2 in a ring of 4: two more slots for the writer.
    ReceiveWindow w(shape(30 * 8 + 5, 8, 4, 2, &mem));
    ScriptedMover m;
    m.window = &w;
    MemorySink sink;
    BackgroundWriter writer(sink);
    auto r = w.run(m, sink, &writer);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(sink.data, file_of(30 * 8 + 5));
    EXPECT_EQ(m.acks.size(), 31u);
    for (uint64_t seq = 0; seq < m.slot_of.size(); ++seq) EXPECT_EQ(m.slot_of[seq], seq % 4);
}

TEST(ReceiveWindow, ACompletionIsTakenOnce) {
    std::vector<char> mem;
    ReceiveWindow w(shape(8, 4, 2, 2, &mem));
    ChunkSlot& s = w.slots()[0];
    w.complete(s, Status::ok(), 4);  // never started: ignored
    EXPECT_EQ(s.state, ChunkSlot::State::free);
    s.state = ChunkSlot::State::moving;
    w.complete(s, Status::ok(), 4);
    w.complete(s, Status(DYAD_RC_BADFETCH, "late", EIO), 0);  // a second report: ignored
    EXPECT_EQ(s.state, ChunkSlot::State::done);
    EXPECT_TRUE(s.result.is_ok());
    EXPECT_EQ(s.got, 4u);
}
