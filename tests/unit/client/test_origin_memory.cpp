// SPDX-License-Identifier: Apache-2.0
// OriginMemory (DYAD_ORIGIN_RECHECK): an origin lookup's answer is used for
// the recheck time after the lookup, never after; 0 keeps nothing; at most
// kMaxPaths paths.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "client/origin_memory.hpp"

using dyad::client::OriginMemory;
using dyad::client::Record;
using namespace std::chrono_literals;

namespace {
Record origin_record(const std::string& upath, uint64_t generation) {
    Record r;
    r.upath = upath;
    r.owner = "@origin";
    r.generation = generation;
    return r;
}
}  // namespace

TEST(OriginMemory, AnAnswerLastsTheRecheckTimeFromItsLookup) {
    OriginMemory m(10);
    const auto now = OriginMemory::Clock::now();
    m.remember("a", origin_record("a", 7), now);
    auto got = m.recall("a");
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->generation, 7u);
    EXPECT_FALSE(m.recall("b").has_value());
    // Looked up longer ago than the recheck time: not kept.
    m.remember("old", origin_record("old", 1), now - 11s);
    EXPECT_FALSE(m.recall("old").has_value());
    m.forget("a");
    EXPECT_FALSE(m.recall("a").has_value());
}

TEST(OriginMemory, ExpiresAfterTheRecheckTime) {
    OriginMemory m(0.05);
    m.remember("a", origin_record("a", 1), OriginMemory::Clock::now());
    EXPECT_TRUE(m.recall("a").has_value());
    std::this_thread::sleep_for(80ms);
    EXPECT_FALSE(m.recall("a").has_value());
}

TEST(OriginMemory, ZeroKeepsNothing) {
    OriginMemory m(0);
    EXPECT_FALSE(m.enabled());
    m.remember("a", origin_record("a", 1), OriginMemory::Clock::now());
    EXPECT_FALSE(m.recall("a").has_value());
}

TEST(OriginMemory, HoldsAtMostItsBound) {
    OriginMemory m(100);
    const auto now = OriginMemory::Clock::now();
    for (size_t i = 0; i < OriginMemory::kMaxPaths + 10; ++i)
        m.remember("p" + std::to_string(i), origin_record("p", i), now);
    size_t kept = 0;
    for (size_t i = 0; i < OriginMemory::kMaxPaths + 10; ++i)
        kept += m.recall("p" + std::to_string(i)).has_value();
    EXPECT_EQ(kept, OriginMemory::kMaxPaths);
    // The newest is always kept.
    EXPECT_TRUE(m.recall("p" + std::to_string(OriginMemory::kMaxPaths + 9)).has_value());
}
