// SPDX-License-Identifier: Apache-2.0
// The Prometheus text writer and histograms of dyadd's metrics
// (src/service/metrics.hpp); the endpoint itself: integration/test_metrics.py.
#include <gtest/gtest.h>

#include "service/metrics.hpp"

using dyad::service::Histogram;
using dyad::service::PromText;

TEST(Metrics, HistogramBucketsAreCumulativeAndInclusive) {
    Histogram h({0.1, 1, 10});
    for (double v : {0.05, 0.1, 0.5, 1.0, 20.0}) h.observe(v);
    auto d = h.data();
    ASSERT_EQ(d.cumulative.size(), 4u);
    EXPECT_EQ(d.cumulative[0], 2u);  // le 0.1 includes 0.1
    EXPECT_EQ(d.cumulative[1], 4u);
    EXPECT_EQ(d.cumulative[2], 4u);
    EXPECT_EQ(d.cumulative[3], 5u);  // +Inf
    EXPECT_EQ(d.count, 5u);
    EXPECT_DOUBLE_EQ(d.sum, 21.65);
}

TEST(Metrics, TextFormat) {
    PromText t;
    t.family("dyad_x_total", "counter", "a help\nwith a \\ newline");
    t.sample("dyad_x_total", {{"kind", "a\"b\\c\nd"}}, uint64_t{3});
    t.gauge("dyad_g", "g", 0.25);
    Histogram h({0.5});
    h.observe(0.1);
    t.family("dyad_h_seconds", "histogram", "h");
    t.histogram("dyad_h_seconds", {{"op", "put"}}, h.data());
    EXPECT_EQ(t.str(),
              "# HELP dyad_x_total a help\\nwith a \\\\ newline\n"
              "# TYPE dyad_x_total counter\n"
              "dyad_x_total{kind=\"a\\\"b\\\\c\\nd\"} 3\n"
              "# HELP dyad_g g\n# TYPE dyad_g gauge\ndyad_g 0.25\n"
              "# HELP dyad_h_seconds h\n# TYPE dyad_h_seconds histogram\n"
              "dyad_h_seconds_bucket{op=\"put\",le=\"0.5\"} 1\n"
              "dyad_h_seconds_bucket{op=\"put\",le=\"+Inf\"} 1\n"
              "dyad_h_seconds_sum{op=\"put\"} 0.1\n"
              "dyad_h_seconds_count{op=\"put\"} 1\n");
}
