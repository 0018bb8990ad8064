// Cell figures against hand-computed values (DESIGN.md "Measurement
// definitions"), plus percentile helpers, confidence intervals and drift.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "speedmatrix/records.hpp"
#include "speedmatrix/stats.hpp"

namespace speedmatrix {
namespace {

constexpr ns_t kMs = 1'000'000;
constexpr ns_t kS = 1'000'000'000;

// Owned columns with a RecordView over them.
struct Records {
  std::vector<ns_t> sent, first, done;
  std::vector<std::uint8_t> outcome, phase;
  std::vector<std::int64_t> prompt;
  std::vector<std::int32_t> ev_req;
  std::vector<ns_t> ev_t;
  std::vector<std::int32_t> ev_tok;

  int add_request(Phase ph, ns_t s, ns_t ft, ns_t d, Outcome o) {
    sent.push_back(s);
    first.push_back(ft);
    done.push_back(d);
    outcome.push_back(static_cast<std::uint8_t>(o));
    phase.push_back(static_cast<std::uint8_t>(ph));
    prompt.push_back(100);
    return static_cast<int>(sent.size()) - 1;
  }
  void add_event(int req, ns_t t, int tokens) {
    ev_req.push_back(req);
    ev_t.push_back(t);
    ev_tok.push_back(tokens);
  }
  RecordView view() const {
    return RecordView{sent, first, done, outcome, phase, prompt, ev_req, ev_t, ev_tok};
  }
};

// Half-width of a 95% t-interval for two values (df = 1): t = 12.7062.
double half_width_2(double a, double b) {
  const double sd = std::abs(a - b) / std::sqrt(2.0);
  return 12.7062 * sd / std::sqrt(2.0);
}

// Two window requests, one warm-up request and one failed request over a
// 2 s window; every figure below is computed by hand in the comments.
Records two_requests() {
  Records r;
  // Request 0: sent at 0, tokens at 0.1 (first), 0.3, 0.7 (2 tokens), 1.5; done
  // OK at 1.5.
  int a = r.add_request(Phase::kWindow, 0, 100 * kMs, 1500 * kMs, Outcome::kOk);
  // Request 1: sent at 0.5, tokens at 0.7 (first), 0.75, 0.85, 2.5 (after t1);
  // still running.
  int b = r.add_request(Phase::kWindow, 500 * kMs, 700 * kMs, kNever, Outcome::kCancelled);
  // Warm-up request: its events (even inside the window) never count.
  int w = r.add_request(Phase::kWarmup, -1 * kS, -900 * kMs, 200 * kMs, Outcome::kOk);
  // Failed request: sent at 1.9, error at 1.95, no tokens.
  r.add_request(Phase::kWindow, 1900 * kMs, kNever, 1950 * kMs, Outcome::kError);
  r.add_event(w, -900 * kMs, 3);
  r.add_event(a, 100 * kMs, 1);
  r.add_event(w, 150 * kMs, 5);
  r.add_event(a, 300 * kMs, 1);
  r.add_event(a, 700 * kMs, 2);
  r.add_event(b, 700 * kMs, 1);
  r.add_event(b, 750 * kMs, 1);
  r.add_event(b, 850 * kMs, 1);
  r.add_event(a, 1500 * kMs, 1);
  r.add_event(b, 2500 * kMs, 1);
  return r;
}

TEST(SummarizeCell, HandComputedTwoRequests) {
  const Records r = two_requests();
  const CellFigures f = summarize_cell(r.view(), 0, 2 * kS, 1.0);
  EXPECT_DOUBLE_EQ(f.measured_s, 2.0);
  // Tokens in [0, 2]: request 0: 1+1+2+1, request 1: 1+1+1 (2.5 is outside).
  EXPECT_EQ(f.output_tokens, 8);
  EXPECT_DOUBLE_EQ(f.total_tok_s, 4.0);
  // Gaps (ms per token, weight): a: 200 (1), 400/2=200 (2), 800 (1); b: 50 (1),
  // 100 (1). Expanded: 50 100 200 200 200 800 -> median (200+200)/2.
  EXPECT_DOUBLE_EQ(f.tbt_ms, 200.0);
  EXPECT_DOUBLE_EQ(f.per_request_tok_s, 5.0);
  // p90: rank 0.9*5 = 4.5 -> 200 + 0.5*(800-200).
  EXPECT_DOUBLE_EQ(f.tbt_p90_ms, 500.0);
  // TTFT: a 100 ms, b 200 ms (the failed one has no first token).
  EXPECT_DOUBLE_EQ(f.ttft_ms, 150.0);
  EXPECT_DOUBLE_EQ(f.ttft_p90_ms, 190.0);
  // In flight: a [0, 1.5], b [0.5, 2.0] (running at t1), failed [1.9, 1.95]
  // -> 3.05 s / 2 s.
  EXPECT_DOUBLE_EQ(f.avg_active, 1.525);
  EXPECT_EQ(f.completed, 1);
  EXPECT_EQ(f.started, 3);
  EXPECT_EQ(f.errors, 1);
  // Bins: [0,1): 4 + 3 tokens; [1,2]: 1 token.
  ASSERT_EQ(f.bin_tok_s.size(), 2u);
  EXPECT_DOUBLE_EQ(f.bin_tok_s[0], 7.0);
  EXPECT_DOUBLE_EQ(f.bin_tok_s[1], 1.0);
  EXPECT_NEAR(f.total_tok_s_ci.lo, 4.0 - half_width_2(7, 1), 1e-9);
  EXPECT_NEAR(f.total_tok_s_ci.hi, 4.0 + half_width_2(7, 1), 1e-9);
  // Per-bin tbt medians: bin 0 {50,100,200,200,200} -> 200; bin 1 {800}.
  EXPECT_NEAR(f.tbt_ms_ci.lo, 500.0 - half_width_2(200, 800), 1e-9);
  EXPECT_NEAR(f.tbt_ms_ci.hi, 500.0 + half_width_2(200, 800), 1e-9);
  EXPECT_NEAR(f.per_request_tok_s_ci.lo, 1000.0 / f.tbt_ms_ci.hi, 1e-12);
  EXPECT_TRUE(std::isinf(f.per_request_tok_s_ci.hi));  // lower tbt bound <= 0
  // Both TTFTs fall in bin 0: one bin, no interval.
  EXPECT_TRUE(std::isnan(f.ttft_ms_ci.lo));
  // Two bins: drift from the line through (0.5, 7), (1.5, 1): slope -6 tok/s/s
  // * 2 s / 4 tok/s.
  EXPECT_DOUBLE_EQ(f.drift, -3.0);
  EXPECT_FALSE(f.drifting);  // two bins cannot show significance
}

TEST(SummarizeCell, EventOrderWithinColumnsDoesNotMatter) {
  Records r = two_requests();
  const CellFigures ref = summarize_cell(r.view(), 0, 2 * kS);
  std::mt19937 rng(7);
  std::vector<std::size_t> idx(r.ev_t.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::shuffle(idx.begin(), idx.end(), rng);
  Records s = r;
  for (std::size_t i = 0; i < idx.size(); ++i) {
    s.ev_req[i] = r.ev_req[idx[i]];
    s.ev_t[i] = r.ev_t[idx[i]];
    s.ev_tok[i] = r.ev_tok[idx[i]];
  }
  const CellFigures f = summarize_cell(s.view(), 0, 2 * kS);
  EXPECT_DOUBLE_EQ(f.tbt_ms, ref.tbt_ms);
  EXPECT_DOUBLE_EQ(f.tbt_p90_ms, ref.tbt_p90_ms);
  EXPECT_EQ(f.output_tokens, ref.output_tokens);
}

TEST(SummarizeCell, EventsOfOneReadAreOneArrival) {
  Records r;
  int a = r.add_request(Phase::kWindow, 0, 0, kNever, Outcome::kCancelled);
  r.add_event(a, 0, 1);
  r.add_event(a, 100 * kMs, 1);  // two chunks read together at 100 ms
  r.add_event(a, 100 * kMs, 1);
  r.add_event(a, 200 * kMs, 1);
  // Arrivals: 0 (1), 100 (2), 200 (1) -> gaps 50 ms x2, 100 ms x1 -> median 50.
  // (Counting the second chunk as a 0 ms gap would give a median of 100.)
  const CellFigures f = summarize_cell(r.view(), 0, kS);
  EXPECT_DOUBLE_EQ(f.tbt_ms, 50.0);
  EXPECT_EQ(f.output_tokens, 4);
}

TEST(TokenArrivals, OneReadIsOneArrivalAndPhasesAreChosen) {
  Records r;
  const int w = r.add_request(Phase::kWarmup, 0, 10 * kMs, 11 * kMs, Outcome::kOk);
  const int a = r.add_request(Phase::kWindow, 0, 100 * kMs, 400 * kMs, Outcome::kOk);
  r.add_event(w, 10 * kMs, 1);
  r.add_event(a, 100 * kMs, 1);
  r.add_event(a, 300 * kMs, 1);  // one socket read: two events, one stamp
  r.add_event(a, 300 * kMs, 3);
  r.add_event(a, 400 * kMs, 0);  // no tokens: not an arrival
  const std::vector<Arrival> win = token_arrivals(r.view());
  ASSERT_EQ(win.size(), 2u);
  EXPECT_EQ(win[0].request, a);
  EXPECT_TRUE(std::isnan(win[0].gap_ms));
  EXPECT_EQ(win[1].t_ns, 300 * kMs);
  EXPECT_EQ(win[1].tokens, 4);
  EXPECT_DOUBLE_EQ(win[1].gap_ms, 200.0 / 4);  // the 200 ms gap spread over 4 tokens
  EXPECT_EQ(token_arrivals(r.view(), static_cast<int>(Phase::kWarmup)).size(), 1u);
  EXPECT_EQ(token_arrivals(r.view(), -1).size(), 3u);
}

// Coalesced delivery: a server that flushes each stream's tokens in bursts of 4 every
// 80 ms (20 ms a token), four events in one read per burst, beside a stream of single
// events, one of them stamped as one of the burst's (it is not coalesced). Time between tokens is
// the gap between reads spread over the read's events (20 ms), per-request speed 50 tok/s, never
// the ~0 gaps inside a read; the share counts every event of a read that carried more than one.
TEST(CoalescedDelivery, BurstsReadAsTheGapBetweenReadsSpreadOverTheirEvents) {
  Records r;
  const int a = r.add_request(Phase::kWindow, 0, 10 * kMs, 2 * kS, Outcome::kOk);
  const int b = r.add_request(Phase::kWindow, 0, 10 * kMs, 2 * kS, Outcome::kOk);
  for (int k = 0; k < 10; ++k) {
    const ns_t t = 10 * kMs + k * 80 * kMs;
    for (int e = 0; e < 4; ++e) r.add_event(a, t, 1);
  }
  // b: single events 20 ms apart, one of them at the very stamp of a's burst at 170 ms
  for (int k = 0; k < 40; ++k) r.add_event(b, 10 * kMs + 20 * kMs * k + (k == 8 ? 0 : 1), 1);
  const CellFigures f = summarize_cell(r.view(), 0, 1 * kS);
  EXPECT_NEAR(f.tbt_ms, 20.0, 1e-3);
  EXPECT_NEAR(f.per_request_tok_s, 50.0, 1e-2);
  EXPECT_NEAR(f.tbt_p90_ms, 20.0, 1e-3);
  // a's 40 events in bursts; b's are one a read, its 170 ms one included
  EXPECT_DOUBLE_EQ(coalesced_share(r.view(), 0, 1 * kS), 40.0 / 80.0);
  // a stream whose events never share a read: no coalescing
  Records one;
  const int c = one.add_request(Phase::kWindow, 0, 10 * kMs, 2 * kS, Outcome::kOk);
  for (int k = 0; k < 10; ++k) one.add_event(c, 10 * kMs + 20 * kMs * k, 1);
  EXPECT_DOUBLE_EQ(coalesced_share(one.view(), 0, 1 * kS), 0.0);
  EXPECT_TRUE(std::isnan(coalesced_share(Records{}.view(), 0, 1 * kS)));
}

// Issue 21's case: a 50 tok/s stream whose server flushes 4 tokens every 80 ms, each
// burst read in 4 pieces 64 us apart. Each piece its own arrival, the median TBT would
// read 0.064 ms (15,625 tok/s); one delivery, it reads 20 ms and 50 tok/s, as
// decode_tok_s_per_request does, and the precision scan agrees.
TEST(CoalescedDelivery, ABurstReadInPiecesIsOneDelivery) {
  Records r;
  const int a = r.add_request(Phase::kWindow, 0, 10 * kMs, 3 * kS, Outcome::kOk);
  for (int k = 0; k < 30; ++k)
    for (int e = 0; e < 4; ++e) r.add_event(a, 10 * kMs + k * 80 * kMs + e * 64'000, 1);
  const CellFigures f = summarize_cell(r.view(), 0, 2 * kS);
  EXPECT_NEAR(f.tbt_ms, 20.0, 1e-3);
  EXPECT_NEAR(f.per_request_tok_s, 50.0, 1e-2);
  EXPECT_NEAR(f.decode_tok_s_per_request, 50.0, 1.0);
  EXPECT_DOUBLE_EQ(coalesced_share(r.view(), 0, 2 * kS), 1.0);
  PrecisionScan scan(r.view(), 0, 2 * kS);
  for (std::size_t e = 0; e < r.ev_t.size(); ++e) scan.add(r.ev_req[e], r.ev_t[e], r.ev_tok[e]);
  EXPECT_DOUBLE_EQ(scan.finish().tbt_ms, f.tbt_ms);
}

// A stream faster than one read per kDeliveryNs keeps its pace: 2,000 tok/s, one token a
// read 0.5 ms apart, reads as 1 ms deliveries of 2 tokens: 0.5 ms a token.
TEST(CoalescedDelivery, AStreamFasterThanTheDeliveryBoundKeepsItsPace) {
  Records r;
  const int a = r.add_request(Phase::kWindow, 0, 1 * kMs, 3 * kS, Outcome::kOk);
  for (int k = 0; k < 1000; ++k) r.add_event(a, 1 * kMs + k * 500'000, 1);
  const CellFigures f = summarize_cell(r.view(), 0, 1 * kS);
  EXPECT_NEAR(f.tbt_ms, 0.5, 1e-9);
  EXPECT_NEAR(f.per_request_tok_s, 2000.0, 1e-6);
  // a fast stream is not a bursty one: each read is as far from the last as its pace
  EXPECT_DOUBLE_EQ(coalesced_share(r.view(), 0, 1 * kS), 0.0);
}

TEST(SummarizeCell, MultiTokenChunkSpreadsItsGap) {
  Records r;
  int a = r.add_request(Phase::kWindow, 0, 10 * kMs, kNever, Outcome::kCancelled);
  r.add_event(a, 10 * kMs, 1);
  r.add_event(a, 110 * kMs, 4);  // 100 ms over 4 tokens: 25 ms each
  r.add_event(a, 150 * kMs, 1);  // 40 ms
  // Expanded: 25 25 25 25 40 -> median 25; unweighted per-chunk gaps would
  // give 70.
  const CellFigures f = summarize_cell(r.view(), 0, kS);
  EXPECT_DOUBLE_EQ(f.tbt_ms, 25.0);
  EXPECT_DOUBLE_EQ(f.per_request_tok_s, 40.0);
  EXPECT_DOUBLE_EQ(f.ttft_ms, 10.0);
}

TEST(SummarizeCell, GapIntoWindowCountsGapOutOfWindowDoesNot) {
  Records r;
  int a = r.add_request(Phase::kWindow, 0, 0, kNever, Outcome::kCancelled);
  r.add_event(a, 900 * kMs, 1);  // before t0 = 1 s
  r.add_event(a, 1100 * kMs,
              1);                 // gap 200 ms, later event in the window: counts
  r.add_event(a, 1150 * kMs, 1);  // 50 ms
  r.add_event(a, 2300 * kMs, 1);  // after t1 = 2 s: not counted
  const CellFigures f = summarize_cell(r.view(), 1 * kS, 2 * kS);
  EXPECT_EQ(f.output_tokens, 2);
  EXPECT_DOUBLE_EQ(f.tbt_ms, 125.0);  // median of {200, 50}
  EXPECT_EQ(f.started, 0);            // sent before t0
  EXPECT_TRUE(std::isnan(f.ttft_ms));
  EXPECT_DOUBLE_EQ(f.avg_active, 1.0);  // in flight over the whole window
}

TEST(SummarizeCell, EmptyWindowGivesZerosAndNaNs) {
  Records r;
  r.add_request(Phase::kWarmup, 0, 10 * kMs, 20 * kMs, Outcome::kOk);
  r.add_event(0, 10 * kMs, 3);
  const CellFigures f = summarize_cell(r.view(), 0, 3 * kS);
  EXPECT_EQ(f.output_tokens, 0);
  EXPECT_DOUBLE_EQ(f.total_tok_s, 0.0);
  EXPECT_TRUE(std::isnan(f.tbt_ms));
  EXPECT_TRUE(std::isnan(f.per_request_tok_s));
  EXPECT_TRUE(std::isnan(f.ttft_ms));
  EXPECT_TRUE(std::isnan(f.tbt_ms_ci.lo));
  EXPECT_DOUBLE_EQ(f.avg_active, 0.0);
  EXPECT_EQ(f.completed, 0);
  EXPECT_DOUBLE_EQ(f.drift, 0.0);
  EXPECT_FALSE(f.drifting);
  // t1 <= t0 is refused without crashing.
  EXPECT_DOUBLE_EQ(summarize_cell(r.view(), 5, 5).measured_s, 0.0);
}

TEST(SummarizeCell, PartialLastBinIsMergedIntoTheLastBin) {
  Records r;
  int a = r.add_request(Phase::kWindow, 0, 0, kNever, Outcome::kCancelled);
  for (int i = 0; i < 25; ++i) r.add_event(a, i * 100 * kMs, 1);  // 10 tok/s over 2.5 s
  const CellFigures f = summarize_cell(r.view(), 0, 2500 * kMs);
  ASSERT_EQ(f.bin_tok_s.size(), 2u);  // [0,1) and [1,2.5]
  EXPECT_DOUBLE_EQ(f.bin_tok_s[0], 10.0);
  EXPECT_DOUBLE_EQ(f.bin_tok_s[1], 10.0);
  EXPECT_DOUBLE_EQ(f.total_tok_s, 10.0);
}

TEST(SummarizeCell, FlatThroughputHasTightIntervalAndNoDrift) {
  // Alternating 19 and 21 tokens per bin over ten 1-s bins (one request).
  Records r;
  int a = r.add_request(Phase::kWindow, 0, 0, kNever, Outcome::kCancelled);
  for (int k = 0; k < 10; ++k) {
    const int n = k % 2 == 0 ? 19 : 21;
    for (int i = 0; i < n; ++i) r.add_event(a, k * kS + (i * kS) / n + 1, 1);
  }
  const CellFigures f = summarize_cell(r.view(), 0, 10 * kS);
  EXPECT_EQ(f.output_tokens, 200);
  EXPECT_DOUBLE_EQ(f.total_tok_s, 20.0);
  // sd of {19,21,...} = sqrt(10/9); t(9) = 2.2622.
  const double half = 2.2622 * std::sqrt(10.0 / 9.0) / std::sqrt(10.0);
  EXPECT_NEAR(f.total_tok_s_ci.lo, 20.0 - half, 1e-9);
  EXPECT_NEAR(f.total_tok_s_ci.hi, 20.0 + half, 1e-9);
  // Per-bin tbt medians alternate 1000/19 and 1000/21 ms (a bin's one gap that
  // crosses from the previous bin does not move its median): the interval is
  // centred on their mean, which need not contain the pooled median.
  const double mid = (1000.0 / 19 + 1000.0 / 21) / 2;
  EXPECT_NEAR((f.tbt_ms_ci.lo + f.tbt_ms_ci.hi) / 2, mid, 1e-3);
  const double tbt_half = 2.2622 * std::sqrt(10.0 / 9.0) * (1000.0 / 19 - mid) / std::sqrt(10.0);
  EXPECT_NEAR(f.tbt_ms_ci.hi - mid, tbt_half, 1e-3);
  EXPECT_NEAR(f.per_request_tok_s_ci.lo, 1000.0 / f.tbt_ms_ci.hi, 1e-12);
  EXPECT_NEAR(f.per_request_tok_s_ci.hi, 1000.0 / f.tbt_ms_ci.lo, 1e-12);
  // slope = 5 / 82.5 tok/s per s -> drift = slope * 10 / 20 ~ 0.03: under 5%.
  EXPECT_NEAR(f.drift, 5.0 / 82.5 * 10.0 / 20.0, 1e-12);
  EXPECT_FALSE(f.drifting);
}

TEST(SummarizeCell, RampIsDetectedAsDrift) {
  // Tokens per bin 10, 15, ..., 55: slope 5 tok/s per s, mean 32.5 -> drift
  // 50/32.5.
  Records r;
  int a = r.add_request(Phase::kWindow, 0, 0, kNever, Outcome::kCancelled);
  for (int k = 0; k < 10; ++k) {
    const int n = 10 + 5 * k + (k % 3 == 0 ? 1 : 0);  // a little noise
    for (int i = 0; i < n; ++i) r.add_event(a, k * kS + (i * kS) / n + 1, 1);
  }
  const CellFigures f = summarize_cell(r.view(), 0, 10 * kS);
  EXPECT_GT(f.drift, 1.4);
  EXPECT_LT(f.drift, 1.6);
  EXPECT_TRUE(f.drifting);
}

TEST(SummarizeCell, AdmissionRampBeforeSteadyFromIsNotDrift) {
  // Two empty bins while the first wave is admitted, then a flat 20 tok/s (with
  // a little noise): drifting over all bins, not over the steady ones.
  Records r;
  int a = r.add_request(Phase::kWindow, 0, 2 * kS, kNever, Outcome::kCancelled);
  for (int k = 2; k < 10; ++k) {
    const int n = 20 + (k % 2);
    for (int i = 0; i < n; ++i) r.add_event(a, k * kS + (i * kS) / n + 1, 1);
  }
  const CellFigures all = summarize_cell(r.view(), 0, 10 * kS);
  EXPECT_TRUE(all.drifting);
  EXPECT_GT(all.drift, 0.5);
  const CellFigures steady = summarize_cell(r.view(), 0, 10 * kS, 1.0, 2 * kS);
  EXPECT_FALSE(steady.drifting);
  EXPECT_LT(std::abs(steady.drift), 0.05);
  // the figures themselves still cover the whole window
  EXPECT_DOUBLE_EQ(steady.total_tok_s, all.total_tok_s);
}

TEST(SummarizeCell, ChunkCountsAreScaledToTheFinalUsageTotal) {
  // Four chunks counted as one token each, at 0.1, 0.2, 0.3, 0.4 s; the final
  // usage said 8 tokens: each chunk really carried 2.
  Records r;
  int a = r.add_request(Phase::kWindow, 0, 100 * kMs, 400 * kMs, Outcome::kOk);
  for (int k = 1; k <= 4; ++k) r.add_event(a, k * 100 * kMs, 1);
  const std::vector<std::int64_t> out = {8};
  const std::vector<std::uint8_t> source = {static_cast<std::uint8_t>(TokenSource::kUsageFinal)};
  RecordView v = r.view();
  const CellFigures raw = summarize_cell(v, 0, 1 * kS);
  EXPECT_EQ(raw.output_tokens, 4);
  EXPECT_DOUBLE_EQ(raw.tbt_ms, 100.0);
  v.output_tokens = out;
  v.token_source = source;
  const CellFigures f = summarize_cell(v, 0, 1 * kS);
  EXPECT_EQ(f.output_tokens, 8);
  EXPECT_DOUBLE_EQ(f.total_tok_s, 8.0);
  EXPECT_DOUBLE_EQ(f.tbt_ms, 50.0);  // 100 ms gaps spread over 2 tokens
  // exact counts (continuous usage) are never rescaled
  const std::vector<std::uint8_t> exact = {
      static_cast<std::uint8_t>(TokenSource::kUsageContinuous)};
  v.token_source = exact;
  EXPECT_EQ(summarize_cell(v, 0, 1 * kS).output_tokens, 4);
  // a usage far above the text chunks is believed (flagged by the verdict) ...
  const std::vector<std::uint8_t> above = {
      static_cast<std::uint8_t>(TokenSource::kUsageAboveChunks)};
  v.token_source = above;
  EXPECT_EQ(summarize_cell(v, 0, 1 * kS).output_tokens, 8);
  // ... one below them is not: the chunks received are counted (openai.hpp)
  const std::vector<std::uint8_t> below = {
      static_cast<std::uint8_t>(TokenSource::kUsageBelowChunks)};
  v.token_source = below;
  EXPECT_EQ(summarize_cell(v, 0, 1 * kS).output_tokens, 4);
}

TEST(SummarizeCell, NoisyBinsWithApparentSlopeAreNotDrifting) {
  // Bins alternate 30 and 10 tokens: the fitted line gives |drift| = 0.30,
  // but the slope's interval (+-2.79 around -0.61 tok/s per s) includes 0.
  Records r;
  int a = r.add_request(Phase::kWindow, 0, 0, kNever, Outcome::kCancelled);
  for (int k = 0; k < 10; ++k) {
    const int n = k % 2 == 0 ? 30 : 10;
    for (int i = 0; i < n; ++i) r.add_event(a, k * kS + (i * kS) / n + 1, 1);
  }
  const CellFigures f = summarize_cell(r.view(), 0, 10 * kS);
  EXPECT_NEAR(f.drift, -50.0 / 82.5 * 10.0 / 20.0, 1e-12);
  EXPECT_FALSE(f.drifting);
}

TEST(SummarizeCell, TtftIntervalIsTheMediansOrderStatisticInterval) {
  // Requests sent every 0.5 s over 4 s with TTFT 100 or 120 ms.
  Records r;
  for (int i = 0; i < 8; ++i) {
    const ns_t s = i * 500 * kMs;
    const ns_t ttft = (i % 2 == 0 ? 100 : 120) * kMs;
    int id = r.add_request(Phase::kWindow, s, s + ttft, s + 400 * kMs, Outcome::kOk);
    r.add_event(id, s + ttft, 1);
    r.add_event(id, s + ttft + 20 * kMs, 1);
  }
  const CellFigures f = summarize_cell(r.view(), 0, 4 * kS);
  EXPECT_DOUBLE_EQ(f.ttft_ms, 110.0);
  // n = 8: ranks floor(4 - 1.96 sqrt(8) / 2) = 1 and ceil(5 + 2.77) = 8 of
  // {100 x4, 120 x4}.
  EXPECT_DOUBLE_EQ(f.ttft_ms_ci.lo, 100.0);
  EXPECT_DOUBLE_EQ(f.ttft_ms_ci.hi, 120.0);
  EXPECT_EQ(f.completed, 8);
  EXPECT_EQ(f.started, 8);
  EXPECT_DOUBLE_EQ(f.tbt_ms, 20.0);
  EXPECT_NEAR(f.avg_active, 8 * 0.4 / 4.0, 1e-12);
}

// A ramp then a steady state: t0 after the ramp, TTFT from the ramp's start,
// the first wave apart, per-request decode speed whatever the chunking.
struct SlotRecords : Records {
  std::vector<std::int32_t> slot;
  int add(std::int32_t s, Phase ph, ns_t sent, ns_t ft, ns_t d, Outcome o) {
    slot.push_back(s);
    return add_request(ph, sent, ft, d, o);
  }
  RecordView view() const {
    RecordView v = Records::view();
    v.slot = slot;
    return v;
  }
};

TEST(SummarizeCell, FirstWaveRefillsAndDecodeSpeedPerRequest) {
  SlotRecords r;
  // Slot 0: sent at 0, first token at 1 s, then chunks of 4 tokens every 100 ms
  // (40 tok/s) until 3 s; refill sent at 3 s, first token 3.2 s, 4-token chunks
  // every 100 ms to 4 s.
  int a = r.add(0, Phase::kWindow, 0, 1 * kS, 3 * kS, Outcome::kOk);
  for (ns_t t = 1 * kS; t <= 3 * kS; t += 100 * kMs) r.add_event(a, t, 4);
  int a2 = r.add(0, Phase::kWindow, 3 * kS, 3200 * kMs, kNever, Outcome::kCancelled);
  for (ns_t t = 3200 * kMs; t <= 4 * kS; t += 100 * kMs) r.add_event(a2, t, 4);
  // Slot 1: sent at 0, first token at 2 s, one token every 50 ms (20 tok/s) to 4 s.
  int b = r.add(1, Phase::kWindow, 0, 2 * kS, kNever, Outcome::kCancelled);
  for (ns_t t = 2 * kS; t <= 4 * kS; t += 50 * kMs) r.add_event(b, t, 1);
  // Window [2 s, 4 s] (the ramp ended when slot 1 streamed), TTFT from 0.
  const CellFigures f = summarize_cell(r.view(), 2 * kS, 4 * kS, 1.0, kNever, 0);
  // TTFTs: 1000, 200 (refill), 2000 -> median 1000; first wave {1000, 2000}.
  EXPECT_DOUBLE_EQ(f.ttft_ms, 1000.0);
  EXPECT_DOUBLE_EQ(f.ttft_first_wave_ms, 1500.0);
  // Without ttft_from only the refill (sent in the window) counts.
  EXPECT_DOUBLE_EQ(summarize_cell(r.view(), 2 * kS, 4 * kS).ttft_ms, 200.0);
  // Decode per request in the window: a: arrivals 2.0..3.0 -> 10 chunks x 4 = 40
  // tokens after the first over 1 s = 40 tok/s; a2: 3.2..4.0 -> 32 / 0.8 = 40;
  // b: 2.0..4.0 -> 40 / 2 = 20. Median 40.
  EXPECT_EQ(f.decode_requests, 3);
  EXPECT_NEAR(f.decode_tok_s_per_request, 40.0, 1e-9);
  EXPECT_TRUE(std::isnan(f.decode_tok_s_per_request_ci.lo));  // 3 values: no interval
  // Tokens before t0 count in no figure: a's events at 1.0..1.9 are outside.
  EXPECT_EQ(f.output_tokens, 11 * 4 + 9 * 4 + 41);
}

TEST(SummarizeCell, FailedStreamsCountTokensButNotSpeedAndTheirSilenceIsLost) {
  Records r;
  // A good stream at 10 ms per token, and a stream that stalls at 0.5 s and is
  // cancelled as a stall at 1.5 s.
  int a = r.add_request(Phase::kWindow, 0, 10 * kMs, kNever, Outcome::kCancelled);
  for (ns_t t = 10 * kMs; t <= 2 * kS; t += 10 * kMs) r.add_event(a, t, 1);
  int b = r.add_request(Phase::kWindow, 0, 10 * kMs, 1500 * kMs, Outcome::kError);
  for (ns_t t = 10 * kMs; t <= 500 * kMs; t += 20 * kMs) r.add_event(b, t, 1);
  const CellFigures f = summarize_cell(r.view(), 0, 2 * kS);
  EXPECT_DOUBLE_EQ(f.tbt_ms, 10.0);  // only the good stream's gaps
  EXPECT_NEAR(f.decode_tok_s_per_request, 100.0, 1e-6);
  EXPECT_EQ(f.decode_requests, 1);
  EXPECT_EQ(f.output_tokens, 200 + 25);  // every token that arrived
  EXPECT_EQ(f.errors, 1);
  EXPECT_NEAR(f.error_slot_s, 1.5 - 0.49, 1e-9);  // last token at 0.49 s to 1.5 s
}

TEST(SummarizeCell, AutocorrelatedBinsWidenTheInterval) {
  // Ten bins 10,10,10,10,10,30,30,30,30,30: lag-1 autocorrelation 0.7.
  std::vector<double> v = {10, 10, 10, 10, 10, 30, 30, 30, 30, 30};
  const Interval i = mean_interval_autocorrelated(v);
  // mean 20, ss = 1000, sd = sqrt(1000 / 9); lag products: 8 x 100 - 100 = 700
  // -> r = 0.7, n_eff = 10 x 0.3 / 1.7.
  const double n_eff = 10 * 0.3 / 1.7, sd = std::sqrt(1000.0 / 9);
  const double half = 12.7062 * sd / std::sqrt(n_eff);  // df = round(1.76) - 1 = 1
  EXPECT_NEAR(i.hi - 20, half, 1e-9);
  EXPECT_NEAR(20 - i.lo, half, 1e-9);
  // Alternating bins (negative correlation) get the plain t-interval.
  const Interval j = mean_interval_autocorrelated({19, 21, 19, 21});
  EXPECT_NEAR(j.hi - 20, 3.1824 * std::sqrt(4.0 / 3) / 2, 1e-9);
}

TEST(MedianInterval, OrderStatistics) {
  EXPECT_TRUE(std::isnan(median_interval({1, 2, 3, 4, 5}).lo));
  // n = 6: ranks max(1, floor(3 - 2.40)) = 1 and min(6, ceil(4 + 2.40)) = 6.
  Interval i = median_interval({6, 5, 4, 3, 2, 1});
  EXPECT_DOUBLE_EQ(i.lo, 1);
  EXPECT_DOUBLE_EQ(i.hi, 6);
  // n = 100: ranks floor(50 - 9.8) = 40 and ceil(51 + 9.8) = 61.
  std::vector<double> v;
  for (int k = 1; k <= 100; ++k) v.push_back(k);
  i = median_interval(v);
  EXPECT_DOUBLE_EQ(i.lo, 40);
  EXPECT_DOUBLE_EQ(i.hi, 61);
}

// The precision stop as a table: (figures, target, elapsed, minimum) -> stop.
TEST(PrecisionStop, Table) {
  auto figs = [](double tok, double tok_half, double tbt, double tbt_half) {
    CellFigures f;
    f.total_tok_s = tok;
    f.total_tok_s_ci = {tok - tok_half, tok + tok_half};
    f.tbt_ms = tbt;
    f.tbt_ms_ci = {tbt - tbt_half, tbt + tbt_half};
    return f;
  };
  const double nan = std::nan("");
  struct Row {
    CellFigures f;
    double target, elapsed, min;
    bool stop;
    double precision;
  } rows[] = {
      {figs(1000, 10, 20, 0.2), 0.02, 6, 5, true, 0.01},    // both within 1%
      {figs(1000, 10, 20, 0.2), 0.02, 4, 5, false, 0.01},   // before the minimum
      {figs(1000, 30, 20, 0.2), 0.02, 6, 5, false, 0.03},   // total too wide
      {figs(1000, 10, 20, 0.6), 0.02, 6, 5, false, 0.03},   // tbt too wide
      {figs(1000, 20, 20, 0.4), 0.02, 6, 5, true, 0.02},    // exactly at the target
      {figs(1000, 10, 20, 0.2), 0.0, 60, 5, false, 0.01},   // no target: never
      {figs(1000, nan, 20, 0.2), 0.02, 60, 5, false, nan},  // no interval yet
      {figs(0, 0, 20, 0.2), 0.02, 60, 5, false, nan},       // no tokens
  };
  for (const Row& row : rows) {
    EXPECT_EQ(precision_stop(row.f, row.target, row.elapsed, row.min), row.stop)
        << row.f.total_tok_s_ci.hi << " " << row.f.tbt_ms_ci.hi << " " << row.elapsed;
    const double p = precision_of(row.f);
    if (std::isnan(row.precision))
      EXPECT_TRUE(std::isnan(p));
    else
      EXPECT_NEAR(p, row.precision, 1e-12);
  }
}

TEST(SummarizeCell, PrecisionIsReportedWithTheFigures) {
  const Records r = two_requests();
  const CellFigures f = summarize_cell(r.view(), 0, 2 * kS, 1.0);
  EXPECT_DOUBLE_EQ(f.precision, precision_of(f));
}

// The latency distributions' percentiles and intervals (_core.quantiles): 1..1000.
TEST(Quantiles, ValuesAndOrderStatisticIntervals) {
  std::vector<double> v;
  for (int i = 1000; i >= 1; --i) v.push_back(i);
  v.push_back(std::nan(""));
  const std::vector<double> qs = {0.5, 0.99, 0.999};
  const auto e = quantiles(v, qs);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_DOUBLE_EQ(e[0].value, 500.5);
  EXPECT_DOUBLE_EQ(e[0].lo, 469.0);  // ranks 500 -+ 1.96 * sqrt(250): the median's rule
  EXPECT_DOUBLE_EQ(e[0].hi, 532.0);
  const Interval m = median_interval(v);
  EXPECT_DOUBLE_EQ(m.lo, e[0].lo);
  EXPECT_DOUBLE_EQ(m.hi, e[0].hi);
  EXPECT_NEAR(e[1].value, 990.01, 1e-9);
  EXPECT_TRUE(e[1].lo < e[1].value && e[1].value < e[1].hi);
  EXPECT_TRUE(std::isnan(e[2].hi));  // the rank falls past the sample
  EXPECT_TRUE(std::isnan(quantiles({}, qs)[0].value));
}

TEST(Percentile, LinearInterpolation) {
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 1.0), 4.0);
  EXPECT_DOUBLE_EQ(percentile({10, 20}, 0.9), 19.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 0.99), 7.0);
  EXPECT_TRUE(std::isnan(percentile({}, 0.5)));
}

TEST(Percentile, WeightedIsPercentileOfExpandedValues) {
  const std::vector<double> v = {10, 1, 5};
  const std::vector<std::int64_t> w = {1, 3, 2};          // 1 1 1 5 5 10
  EXPECT_DOUBLE_EQ(weighted_percentile(v, w, 0.5), 3.0);  // (1 + 5) / 2
  EXPECT_DOUBLE_EQ(weighted_percentile(v, w, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(weighted_percentile(v, w, 1.0), 10.0);
  EXPECT_DOUBLE_EQ(weighted_percentile(v, w, 0.9), percentile({1, 1, 1, 5, 5, 10}, 0.9));
  const std::vector<double> u = {3, 9, 1, 7};
  const std::vector<std::int64_t> ones = {1, 1, 1, 1};
  for (double q : {0.1, 0.5, 0.77, 0.99}) {
    EXPECT_DOUBLE_EQ(weighted_percentile(u, ones, q), percentile({3, 9, 1, 7}, q)) << q;
  }
  const std::vector<std::int64_t> zeros = {0, 0, 0, 0};
  EXPECT_TRUE(std::isnan(weighted_percentile(u, zeros, 0.5)));
  EXPECT_TRUE(std::isnan(weighted_percentile({}, {}, 0.5)));
}

// The cell's precision check reads the events once, in record order (PrecisionScan), instead
// of unpacking them for summarize_cell: on synthetic cells (two phases, failed streams,
// events outside the window, one read split over several events, multi-token chunks, bad
// request indices, empty chunks, partial last bins, empty windows) every figure it gives
// and the stop decision are exactly summarize_cell's.
TEST(PrecisionScan, SameFiguresAndStopAsSummarizeCell) {
  auto same = [](double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; };
  std::mt19937_64 rng(11);
  int stops = 0, checks = 0;
  for (int cell = 0; cell < 300; ++cell) {
    SCOPED_TRACE(cell);
    Records r;
    struct Ev {
      ns_t t;
      int req, tokens;
    };
    std::vector<Ev> evs;
    const int n_req = 1 + static_cast<int>(rng() % 40);
    const ns_t itl = static_cast<ns_t>(5 + rng() % 40) * kMs;
    for (int q = 0; q < n_req; ++q) {
      const Phase ph = rng() % 6 == 0 ? Phase::kWarmup : Phase::kWindow;
      const Outcome o = rng() % 9 == 0 ? Outcome::kError : Outcome::kOk;
      const ns_t sent = static_cast<ns_t>(rng() % (8 * kS));
      ns_t t = sent + static_cast<ns_t>(rng() % (300 * kMs));
      const int n_ev = static_cast<int>(rng() % 400);
      r.add_request(ph, sent, t, t + n_ev * itl, o);
      for (int k = 0; k < n_ev; ++k) {
        const std::uint64_t x = rng() % 100;
        const int tokens = x == 0 ? 0 : x < 10 ? 2 + static_cast<int>(rng() % 5) : 1;
        evs.push_back({t, q, tokens});
        if (x >= 10 && x < 20) continue;  // the next event of this read: the same t
        t += itl / 2 + static_cast<ns_t>(rng() % static_cast<std::uint64_t>(itl));
      }
    }
    if (cell % 10 == 0) evs.push_back({3 * kS, n_req + 5, 1});  // an index outside
    // Record order: by time across requests (ties in any order), as the transport writes.
    std::shuffle(evs.begin(), evs.end(), rng);
    std::stable_sort(evs.begin(), evs.end(), [](const Ev& a, const Ev& b) { return a.t < b.t; });
    for (const Ev& e : evs) r.add_event(e.req, e.t, e.tokens);
    const RecordView v = r.view();
    const ns_t t0 = static_cast<ns_t>(rng() % (2 * kS));
    const ns_t t1 = cell % 25 == 0 ? t0 : t0 + static_cast<ns_t>(rng() % (12 * kS));
    const double bin_s = cell % 3 == 0 ? 0.25 : 1.0;
    const CellFigures want = summarize_cell(v, t0, t1, bin_s);
    PrecisionScan scan(v, t0, t1, bin_s);
    for (const Ev& e : evs) scan.add(e.req, e.t, e.tokens);
    ASSERT_TRUE(scan.ordered());
    const CellFigures got = scan.finish();
    EXPECT_EQ(got.measured_s, want.measured_s);
    EXPECT_EQ(got.output_tokens, want.output_tokens);
    EXPECT_EQ(got.total_tok_s, want.total_tok_s);
    EXPECT_EQ(got.bin_tok_s, want.bin_tok_s);
    EXPECT_TRUE(same(got.tbt_ms, want.tbt_ms)) << got.tbt_ms << " " << want.tbt_ms;
    EXPECT_TRUE(same(got.per_request_tok_s, want.per_request_tok_s));
    for (auto [g, w] : {std::pair{got.total_tok_s_ci, want.total_tok_s_ci},
                        std::pair{got.tbt_ms_ci, want.tbt_ms_ci},
                        std::pair{got.per_request_tok_s_ci, want.per_request_tok_s_ci}}) {
      EXPECT_TRUE(same(g.lo, w.lo)) << g.lo << " " << w.lo;
      EXPECT_TRUE(same(g.hi, w.hi)) << g.hi << " " << w.hi;
    }
    EXPECT_TRUE(same(got.precision, want.precision)) << got.precision << " " << want.precision;
    const double elapsed = static_cast<double>(t1 - t0) / 1e9;
    for (double target : {0.01, 0.02, 0.05, 0.1, 0.2, 0.5}) {
      const bool stop = precision_stop(want, target, elapsed, 1.0);
      EXPECT_EQ(precision_stop(got, target, elapsed, 1.0), stop) << target;
      stops += stop;
      ++checks;
    }
  }
  // the table holds both decisions
  EXPECT_GT(stops, 50);
  EXPECT_LT(stops, checks - 50);
}

TEST(PrecisionScan, ARequestWhoseEventsGoBackInTimeIsFlagged) {
  Records r;
  r.add_request(Phase::kWindow, 0, 10 * kMs, kNever, Outcome::kPending);
  PrecisionScan scan(r.view(), 0, kS);
  scan.add(0, 20 * kMs, 1);
  scan.add(0, 30 * kMs, 1);
  EXPECT_TRUE(scan.ordered());
  scan.add(0, 25 * kMs, 1);
  EXPECT_FALSE(scan.ordered());
}

}  // namespace
}  // namespace speedmatrix
