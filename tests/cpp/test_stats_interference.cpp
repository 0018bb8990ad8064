// The prefill-interference figures on synthetic token arrivals with known truth.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "speedmatrix/stats_interference.hpp"

using namespace speedmatrix;

namespace {

constexpr ns_t kMs = 1'000'000;

// A decoder that emits a token every `tbt_ns`, or every `stalled_ns` while a
// prefill window intersects the next gap (a chunked-prefill engine's stall).
std::vector<ns_t> decoder(ns_t start_ns, ns_t end_ns, ns_t tbt_ns, ns_t stalled_ns,
                          const std::vector<PrefillWindow>& windows) {
  std::vector<ns_t> t{start_ns};
  while (t.back() < end_ns) {
    const ns_t a = t.back();
    bool hit = false;
    for (const PrefillWindow& w : windows) hit = hit || (a < w.end_ns && w.start_ns < a + tbt_ns);
    t.push_back(a + (hit ? stalled_ns : tbt_ns));
  }
  return t;
}

}  // namespace

TEST(Interference, InflationIsTheStallOverTheSteadyGap) {
  const std::vector<PrefillWindow> windows = {{1'000 * kMs, 1'150 * kMs}, {300 * kMs, 420 * kMs}};
  std::vector<std::vector<ns_t>> streams;
  for (ns_t s = 0; s < 4; ++s)
    streams.push_back(decoder(s * 3 * kMs, 2'000 * kMs, 20 * kMs, 60 * kMs, windows));
  const InterferenceFigures f = interference_figures(streams, windows);
  EXPECT_GT(f.overlap_gaps, 0);
  EXPECT_GT(f.clear_gaps, f.overlap_gaps);
  EXPECT_DOUBLE_EQ(f.p99_tbt_overlap_ms, 60.0);
  EXPECT_DOUBLE_EQ(f.p99_tbt_clear_ms, 20.0);
  EXPECT_DOUBLE_EQ(f.tbt_inflation, 3.0);
  EXPECT_EQ(f.gaps_over_long, 0);
}

TEST(Interference, LongGapsAreCountedWhereverTheyFall) {
  const std::vector<std::vector<ns_t>> streams = {{0, 10 * kMs, 150 * kMs, 160 * kMs, 400 * kMs}};
  const std::vector<PrefillWindow> windows = {{20 * kMs, 30 * kMs}};
  const InterferenceFigures f = interference_figures(streams, windows);
  EXPECT_EQ(f.gaps_over_long, 2);
  EXPECT_EQ(f.overlap_gaps, 1);  // (10, 150] holds the window
  EXPECT_EQ(f.clear_gaps, 3);
  EXPECT_EQ(interference_figures(streams, windows, 200 * kMs).gaps_over_long, 1);
}

TEST(Interference, AGapThatOnlyTouchesAWindowIsClear) {
  // (0, 10] ends where the window starts; (20, 30] starts where it ends.
  const std::vector<std::vector<ns_t>> streams = {{0, 10 * kMs}, {20 * kMs, 30 * kMs}};
  const std::vector<PrefillWindow> windows = {{10 * kMs, 20 * kMs}};
  const InterferenceFigures f = interference_figures(streams, windows);
  EXPECT_EQ(f.overlap_gaps, 0);
  EXPECT_EQ(f.clear_gaps, 2);
  EXPECT_TRUE(std::isnan(f.p99_tbt_overlap_ms));
  EXPECT_TRUE(std::isnan(f.tbt_inflation));
}

TEST(Interference, OverlappingAndUnorderedWindowsAreMerged) {
  const std::vector<std::vector<ns_t>> streams = {{0, 35 * kMs, 36 * kMs, 100 * kMs}};
  const std::vector<PrefillWindow> windows = {
      {30 * kMs, 50 * kMs}, {5 * kMs, 32 * kMs}, {90 * kMs, 80 * kMs} /* empty */};
  const InterferenceFigures f = interference_figures(streams, windows);
  EXPECT_EQ(f.overlap_gaps, 3);  // (0,35], (35,36], (36,100] all meet [5, 50]
  EXPECT_EQ(f.clear_gaps, 0);
}

TEST(Interference, NoStreamsNoFigures) {
  const InterferenceFigures f = interference_figures({}, {});
  EXPECT_EQ(f.overlap_gaps + f.clear_gaps + f.gaps_over_long, 0);
  EXPECT_TRUE(std::isnan(f.p99_tbt_clear_ms));
}
