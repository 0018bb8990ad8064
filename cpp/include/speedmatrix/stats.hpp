// Cell figures, derived from raw records exactly as shared/DESIGN.md defines
// them. Pure functions: no I/O; Python calls them on live and saved records.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
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
  // per request, optional (empty = not given): the concurrency slot; the first
  // window request of each slot is the first wave (ttft_first_wave_ms).
  std::span<const std::int32_t> slot;
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
  // median first_token - sent over window requests sent in [ttft_from, t1] (the
  // first wave and every refill); NaN if none
  double ttft_ms = 0;
  // median TTFT of the first window request of each slot (needs RecordView::slot;
  // NaN otherwise): the seed's "TTFT after warming the prompt cache"
  double ttft_first_wave_ms = 0;
  // Median over good window requests of (tokens after their first arrival in
  // the window) / (last - first arrival in the window): one request's decode
  // speed whatever the chunking. Needs two arrivals in the window; NaN if none.
  double decode_tok_s_per_request = 0;
  std::int64_t decode_requests = 0;  // requests that decode_tok_s_per_request is the median of
  double avg_active = 0;       // time-weighted mean of window requests in flight over [t0, t1]
  std::int64_t completed = 0;  // window requests that finished OK inside [t0, t1]
  std::int64_t started = 0;    // window requests sent inside [t0, t1]
  std::int64_t errors = 0;     // window requests that failed
  // Slot time lost to failed window requests: from each one's last token (or
  // its send) to its end, inside [t0, t1], in seconds (a stall's silence).
  double error_slot_s = 0;
  // 95% confidence intervals. total_tok_s, tbt_ms: over per-second bins, a
  // t-interval widened for the bins' lag-1 autocorrelation (effective sample
  // size n (1 - r) / (1 + r), r clamped to [0, 0.9]); per_request_tok_s is
  // 1000 / the tbt interval. ttft_ms and decode_tok_s_per_request: the
  // distribution-free interval of a median (order statistics; needs 6 values).
  Interval total_tok_s_ci, tbt_ms_ci, per_request_tok_s_ci, ttft_ms_ci;
  Interval decode_tok_s_per_request_ci;
  // Relative precision reached: the larger of the total_tok_s and tbt_ms
  // intervals' half-widths over their values (precision_of); NaN without both.
  double precision = 0;
  // Drift: relative change of throughput across the steady part of the window
  // from a least-squares line through its per-bin throughput (slope * span /
  // mean), and whether it is
  // significant (|drift| > 5% and the slope's 95% CI excludes 0).
  double drift = 0;
  bool drifting = false;
  // Percentiles, for the report's extra columns.
  double ttft_p90_ms = 0, ttft_p99_ms = 0, tbt_p90_ms = 0, tbt_p99_ms = 0;
  // The TBT sample set whose median is tbt_ms (each arrival's gap once per token it
  // brought): its size in tokens, its mean (a compensated sum: exact to the last bit or
  // two however many samples) and its quantiles at summarize_cell's tbt_qs, in their order
  // (linear interpolation in the multiset, as percentile()). NaN when the set is empty.
  // The latency distribution of run.json reads these; Python holds no per-token array.
  std::int64_t tbt_count = 0;
  double tbt_mean_ms = 0;
  std::vector<double> tbt_quantiles_ms;
  std::vector<double> bin_tok_s;  // per-bin throughput, for plots
};

// Window accounting follows DESIGN.md; the choices it leaves open:
// - Only phase == kWindow requests and their events count; [t0, t1] is closed.
// - Events of one request in one delivery (one socket read, or reads within
//   kDeliveryNs of its first) are one arrival: the gap since the previous
//   arrival is spread over all their tokens.
// - Bins are bin_s wide from t0; a remainder shorter than a bin widens the last.
// - tbt CI: t-interval over per-bin weighted medians (bin of the later arrival);
//   per_request_tok_s CI is 1000 / that interval (hi = +Inf when its lo <= 0);
//   ttft CI: t-interval over per-bin medians, binned by send time.
//   CIs need two non-empty bins; drift significance needs three bins.
// REQUIRES: t1 > t0 (else an empty figure with measured_s = 0); spans of one
// group have equal lengths.
// steady_from_ns: drift is judged on the bins that start at or after it (the
// end of the first wave's ramp); kNever = all bins.
// ttft_from_ns: TTFT counts window requests sent in [ttft_from_ns, t1]; kNever
// = t0. A steady-state window passes the ramp's start, so the first wave
// (sent before t0) counts.
// Memory: when the events' t_ns never goes back (the loop's order) they are read in place,
// in five passes, holding O(requests + bins) plus one bin's gaps and a few MB of histograms
// (the exact gap quantiles by radix selection); in any other order, from a sorted copy
// (~90 bytes an event). The figures are the same either way.
// Only requests that did not fail count for tbt, TTFT and per-request speed
// (a stalled stream's silence is not a gap of the server's decode); every
// token that arrived in the window counts for total_tok_s.
// tbt_qs: the quantiles (each in [0, 1]) of the TBT sample set to give in tbt_quantiles_ms.
CellFigures summarize_cell(const RecordView& r, ns_t t0, ns_t t1, double bin_s = 1.0,
                           ns_t steady_from_ns = kNever, ns_t ttft_from_ns = kNever,
                           std::span<const double> tbt_qs = {});

// The figures the precision stop reads (measured_s, output_tokens, total_tok_s, bin_tok_s,
// tbt_ms and both intervals, precision), from the events visited once, in record order, so
// a cell's check needs no copy of its event columns (they may be spilled to disk,
// records.hpp). For those fields it equals summarize_cell(r, t0, t1, bin_s) when r has no
// usage scaling (output_tokens / token_source empty), as the cell's check calls it; the
// other fields are left as summarize_cell's empty figure (NaN). Costs O(requests + bins)
// plus 16 bytes per window arrival until finish() (the exact medians need every gap).
// REQUIRES: each request's events come in non-decreasing t_ns (the transport's order);
// otherwise ordered() turns false and the caller must use summarize_cell.
class PrecisionScan {
 public:
  // `r`: the per-request columns (its event spans are not read); its arrays must outlive
  // the scan.
  PrecisionScan(const RecordView& r, ns_t t0, ns_t t1, double bin_s = 1.0);
  void add(std::int32_t request, ns_t t_ns, std::int32_t tokens);
  bool ordered() const noexcept { return ordered_; }
  CellFigures finish();

 private:
  void close_arrival(std::size_t q);
  struct Open {
    ns_t prev = kNever;  // the request's previous arrival
    ns_t cur = kNever;   // the arrival being merged (events with this t_ns)
    std::int64_t tokens = 0;
  };
  RecordView r_;  // views: the arrays must outlive the scan
  ns_t t0_, t1_, bin_ns_ = 0;
  std::int64_t n_bins_ = 1;
  bool ordered_ = true;
  std::vector<Open> open_;
  std::vector<std::int64_t> bin_tokens_;
  // per bin: (gap ms per token, tokens) of its arrivals; sorted per bin at finish(), and the
  // overall median read by merging the bins (no second copy)
  std::vector<std::vector<std::pair<double, std::int64_t>>> bin_gaps_;
  std::int64_t output_tokens_ = 0;
};

// The precision a cell's figures reached: max over total_tok_s and tbt_ms of
// (CI half-width / value). NaN when either interval or value is missing.
double precision_of(const CellFigures& f);

// The precision stop (pure): whether a window of `elapsed_s` whose figures are
// `f` may end now for a target relative precision `target` (0.02 = 2%): it has
// lasted min_duration_s and precision_of(f) <= target. target <= 0: never.
bool precision_stop(const CellFigures& f, double target, double elapsed_s, double min_duration_s);

// The confidence level of every interval speedmatrix reports, its two-sided normal
// quantile, and Student's t two-sided quantile at that level (df >= 1; NaN below): the
// one definition Python reads too (_core.CONFIDENCE, Z, t_quantile).
inline constexpr double kConfidence = 0.95;
inline constexpr double kZ975 = 1.959963984540054;
double t975(std::int64_t df);

// 95% interval of a mean of autocorrelated values (see CellFigures).
Interval mean_interval_autocorrelated(const std::vector<double>& v);
// 95% distribution-free interval of the median of `v` (order statistics).
Interval median_interval(std::vector<double> v);

// A delivery: the reads of one stream that come less than kDeliveryNs after the
// delivery's first read. A server or proxy that flushes a burst of events writes it
// in pieces the client may read microseconds apart; counted as separate arrivals,
// the burst's ~0 gaps would make the median time between tokens a figure the stream
// never received (a 50 tok/s stream in bursts read as 0.064 ms, 15,571 tok/s). The
// gap since the previous delivery is spread over the delivery's tokens, so a
// stream's pace is kept whatever its speed (a 2,000 tok/s stream, one token a read
// 0.5 ms apart, reads as pairs 1 ms apart: 0.5 ms a token).
inline constexpr ns_t kDeliveryNs = 1'000'000;

// One arrival of tokens: the events of one delivery of one request (one socket
// read, or reads less than kDeliveryNs after its first) merged.
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
// delivery (request, reads within kDeliveryNs of the first; t_ns is the first
// read's), ordered by request then time. Window membership is left to
// the caller (summarize_cell counts arrivals with t0 <= t_ns <= t1).
// REQUIRES: spans of one group have equal lengths.
std::vector<Arrival> token_arrivals(const RecordView& r, int phase = 1);

// Coalesced delivery: the share of the window's token events (events with tokens of
// window requests, t0 <= t_ns <= t1) that came together with another event in one
// delivery of their stream (one read, or reads within kDeliveryNs). Streams never share a
// read (one connection each, one clock stamp per read), so no rule spans streams. A
// delivery is one arrival (token_arrivals), so a burst reads as the gap between deliveries
// spread over its tokens, never as ~0 gaps; this figure says how much of the window came
// that way (a buffering proxy, a server that flushes per batch). NaN without token events.
// Memory: when the events' t_ns never goes back (the loop's order) they are read in place in
// three passes, holding O(requests) plus the paces (8 bytes a delivery) of the streams that
// still have window events to come; in any other order, from a sorted copy (16 bytes an
// event). The figure is the same either way (stats_coalesced.cpp).
double coalesced_share(const RecordView& r, ns_t t0, ns_t t1);

// Per request, what its token arrivals (token_arrivals of every phase) add up to, streamed
// from the event columns when they are in the transport's order (O(requests) memory), else
// from token_arrivals' copy: the per-request figures' one source (run.json's tbt_max_ms,
// tpot_so_far_ms, the SLO's window tokens), so no caller holds per-token arrays.
struct RequestTokens {
  std::int64_t tokens = 0;         // every arrival's tokens (usage-scaled)
  std::int64_t window_tokens = 0;  // those of arrivals with t0 <= t_ns <= t1
  ns_t first_ns = kNever;          // its first and last arrival; kNever without one
  ns_t last_ns = kNever;
  // the longest silence before an arrival (its gap_ms times its tokens); NaN without a gap
  double max_gap_ms = 0;
};
std::vector<RequestTokens> request_tokens(const RecordView& r, ns_t t0, ns_t t1);

// Quantiles of `v` (NaN dropped) at each q in [0, 1], by linear interpolation (as
// percentile()), each with its distribution-free kConfidence interval from order
// statistics (ranks n q -+ z sqrt(n q (1 - q)), the rule of median_interval); a side whose
// rank falls outside the sample is NaN; all NaN for an empty sample. The one owner of the
// latency distributions' percentiles and their intervals (_core.quantiles).
struct QuantileEstimate {
  double value, lo, hi;
};
std::vector<QuantileEstimate> quantiles(std::vector<double> v, std::span<const double> qs);

// Weighted median / percentile (q in [0,1]) of values with integer weights.
double weighted_percentile(std::span<const double> values, std::span<const std::int64_t> weights,
                           double q);
double percentile(std::vector<double> values, double q);  // linear interpolation; NaN if empty

}  // namespace speedmatrix
