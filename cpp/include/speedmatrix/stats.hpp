// Cell figures, derived from raw records exactly as shared/DESIGN.md defines
// them. Pure functions: no I/O; Python calls them on live and saved records.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "speedmatrix/clock.hpp"

namespace speedmatrix {

// The columns of the records that figures need (views; no ownership).
struct RecordView {
  // per request
  std::span<const ns_t> sent_ns;
  std::span<const ns_t> first_token_ns;
  std::span<const ns_t> done_ns;          // kNever = still running at the end
  std::span<const std::uint8_t> outcome;  // Outcome values
  std::span<const std::uint8_t> phase;    // Phase values
  std::span<const std::int64_t> prompt_tokens;
  // per event
  std::span<const std::int32_t> ev_request;
  std::span<const ns_t> ev_t_ns;
  std::span<const std::int32_t> ev_tokens;
  // per request, optional (empty = not given): a request whose tokens were
  // counted per chunk but whose final usage gave the true total
  // (TokenSource::kUsageFinal) has its events' tokens scaled to that total
  // before any figure is computed.
  std::span<const std::int64_t> output_tokens;
  std::span<const std::uint8_t> token_source;  // TokenSource values
};

struct Interval {
  double lo = 0, hi = 0;  // NaN when it cannot be computed (too few bins)
};

struct CellFigures {
  double measured_s = 0;           // D = t1 - t0
  std::int64_t output_tokens = 0;  // tokens whose arrival lies in [t0, t1]
  double total_tok_s = 0;          // output_tokens / D
  double tbt_ms = 0;  // median gap between token arrivals in the window, chunk gaps spread over
                      // their tokens; NaN if none
  double per_request_tok_s = 0;  // 1000 / tbt_ms
  double ttft_ms =
      0;  // median first_token - sent over window requests sent in [t0, t1]; NaN if none
  double avg_active = 0;       // time-weighted mean of window requests in flight over [t0, t1]
  std::int64_t completed = 0;  // window requests that finished OK inside [t0, t1]
  std::int64_t started = 0;    // window requests sent inside [t0, t1]
  std::int64_t errors = 0;     // window requests that failed
  // 95% confidence intervals from per-second bins (t-interval over bins).
  Interval total_tok_s_ci, tbt_ms_ci, per_request_tok_s_ci, ttft_ms_ci;
  // Drift: relative change of throughput across the steady part of the window
  // from a least-squares line through its per-bin throughput (slope * span /
  // mean), and whether it is
  // significant (|drift| > 5% and the slope's 95% CI excludes 0).
  double drift = 0;
  bool drifting = false;
  // Percentiles, for the report's extra columns.
  double ttft_p90_ms = 0, ttft_p99_ms = 0, tbt_p90_ms = 0, tbt_p99_ms = 0;
  std::vector<double> bin_tok_s;  // per-bin throughput, for plots
};

// Window accounting follows DESIGN.md; the choices it leaves open:
// - Only phase == kWindow requests and their events count; [t0, t1] is closed.
// - Events of one request with the same t_ns (one socket read) are one
//   arrival: the gap since the previous arrival is spread over all their tokens.
// - Bins are bin_s wide from t0; a remainder shorter than a bin widens the last.
// - tbt CI: t-interval over per-bin weighted medians (bin of the later arrival);
//   per_request_tok_s CI is 1000 / that interval (hi = +Inf when its lo <= 0);
//   ttft CI: t-interval over per-bin medians, binned by send time.
//   CIs need two non-empty bins; drift significance needs three bins.
// REQUIRES: t1 > t0 (else an empty figure with measured_s = 0); spans of one
// group have equal lengths.
// steady_from_ns: drift is judged on the bins that start at or after it (the
// end of the first wave's ramp); kNever = all bins.
CellFigures summarize_cell(const RecordView& r, ns_t t0, ns_t t1, double bin_s = 1.0,
                           ns_t steady_from_ns = kNever);

// One arrival of tokens: the events of one request with the same t_ns (one
// socket read) merged.
struct Arrival {
  std::int32_t request = 0;
  ns_t t_ns = 0;
  std::int64_t tokens = 0;  // after usage scaling; always > 0
  // Gap since the request's previous arrival spread over these tokens (ms per
  // token); NaN for a request's first arrival.
  double gap_ms = 0;
};

// The one derivation of per-token arrivals that every figure, plot and test
// uses: events with tokens (usage-scaled as in summarize_cell) of the requests
// of `phase` (kWindow by default; a negative value = every request), merged per
// (request, t_ns), ordered by request then time. Window membership is left to
// the caller (summarize_cell counts arrivals with t0 <= t_ns <= t1).
// REQUIRES: spans of one group have equal lengths.
std::vector<Arrival> token_arrivals(const RecordView& r, int phase = 1);

// Weighted median / percentile (q in [0,1]) of values with integer weights.
double weighted_percentile(std::span<const double> values, std::span<const std::int64_t> weights,
                           double q);
double percentile(std::vector<double> values, double q);  // linear interpolation; NaN if empty

}  // namespace speedmatrix
