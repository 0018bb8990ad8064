// Helpers the stats sources share (stats.cpp, stats_arrivals.cpp, stats_quantiles.cpp,
// stats_coalesced.cpp, precision_scan.cpp): not part of the API.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <utility>
#include <vector>

#include "speedmatrix/records.hpp"
#include "speedmatrix/stats.hpp"

namespace speedmatrix::detail {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Whether the events are in the order the transport writes them: t_ns never goes back
// (one loop thread reads one monotonic clock). Then each request's events come in time
// order, and an arrival (a request's delivery) is whole once an event kDeliveryNs after
// its first shows.
bool time_ordered(const RecordView& r);

// summarize_cell's figure before anything is measured: NaN where a figure needs samples.
CellFigures empty_figures();

// The distribution-free kConfidence interval of the median (order statistics); NaN below
// 6 values (NaN values dropped).
Interval order_median_interval(std::vector<double> v);

// Quantile q of the multiset in which each sorted value appears `weight`
// times, interpolating linearly between neighbours (so unit weights give the
// same figure as percentile()). REQUIRES: sorted by value, weights > 0.
double sorted_weighted_quantile(const std::vector<std::pair<double, std::int64_t>>& vw,
                                std::size_t begin, std::size_t end, double q);

// A bin's width in ns for bin_s seconds: at least 1 ms; bin_s <= 0 reads as 1 s.
ns_t bin_ns_of(double bin_s);

// The window's bins: bin_ns wide from t0, a remainder shorter than a bin added to the last
// one, so every bin spans at least bin_ns; one bin when the window is shorter.
struct Bins {
  ns_t t0 = 0, span_ns = 0, bin_ns = 0;
  std::int64_t n = 1;
  Bins(ns_t t0_ns, ns_t t1_ns, ns_t bin_width_ns);
  std::int64_t index(ns_t t) const { return std::min<std::int64_t>(n - 1, (t - t0) / bin_ns); }
  double width_s(std::int64_t k) const;
  // tokens per bin -> tok/s per bin
  std::vector<double> rates(const std::vector<std::int64_t>& tokens) const;
};

// per_request_tok_s = 1000 / tbt_ms is decreasing in tbt: its interval from tbt_ms's, the
// bounds swapped (hi = +Inf when the tbt interval reaches 0); NaN when tbt_ci is.
Interval per_request_interval(const Interval& tbt_ci);

// Event token counts with chunk-counted requests scaled to their usage total
// (scaled_to_usage): cumulative rounding keeps every count an integer and each request's
// sum exactly its total; an event can drop to 0 tokens when chunks over-counted. Reads
// each request's chunk sum once (one pass); then `scaled(e)` gives event e's count, called
// once for every event in record order. Memory: O(requests).
class UsageScale {
 public:
  UsageScale(const RecordView& r, std::size_t n_ev);
  std::int32_t operator()(std::size_t e);

 private:
  const RecordView& r_;
  std::size_t n_req_;
  std::vector<std::int64_t> chunk_sum_, seen_;
};

// token_arrivals' arrivals of `phase` requests, usage-scaled the same way, handed to
// `on_arrival(request, t_ns, tokens, gap_ms)` in time order, from one pass over the event
// columns in record order. REQUIRES time_ordered(r). Memory: O(requests).
template <class OnArrival>
void stream_arrivals(const RecordView& r, int phase, OnArrival&& on_arrival) {
  const std::size_t n_req = r.sent_ns.size();
  const std::size_t n_ev = std::min({r.ev_request.size(), r.ev_t_ns.size(), r.ev_tokens.size()});
  UsageScale scaled(r, n_ev);
  struct Open {
    ns_t prev = kNever, cur = kNever;  // the previous arrival; the one being merged
    std::int64_t tokens = 0;
    bool merging = false;
  };
  std::vector<Open> open(n_req);
  // Requests whose arrival may still grow, in the order their arrivals began (t_ns never
  // goes back, so by `cur`): one delivery is every event of a request less than
  // kDeliveryNs after its first, as token_arrivals merges them.
  std::deque<std::int32_t> merging;
  auto close = [&](std::int32_t q) {
    Open& o = open[static_cast<std::size_t>(q)];
    o.merging = false;
    double gap = kNaN;
    if (o.prev != kNever) {
      gap = static_cast<double>(o.cur - o.prev);
      gap = gap * 1e-6 / static_cast<double>(o.tokens);  // token_arrivals' arithmetic
    }
    on_arrival(q, o.cur, o.tokens, gap);
  };
  for (std::size_t e = 0; e < n_ev; ++e) {
    const std::int32_t q = r.ev_request[e];
    const std::int32_t tok = scaled(e);
    if (q < 0 || static_cast<std::size_t>(q) >= n_req || tok <= 0) continue;
    if (phase >= 0 && (static_cast<std::size_t>(q) >= r.phase.size() ||
                       r.phase[static_cast<std::size_t>(q)] != static_cast<std::uint8_t>(phase)))
      continue;
    const ns_t t = r.ev_t_ns[e];
    // every arrival begun kDeliveryNs or more before t is whole
    while (!merging.empty() &&
           t - open[static_cast<std::size_t>(merging.front())].cur >= kDeliveryNs) {
      close(merging.front());
      merging.pop_front();
    }
    Open& o = open[static_cast<std::size_t>(q)];
    if (o.merging) {  // less than kDeliveryNs after its first: the same delivery
      o.tokens += tok;
      continue;
    }
    o.prev = o.cur;
    o.cur = t;
    o.tokens = tok;
    o.merging = true;
    merging.push_back(q);
  }
  for (std::int32_t p : merging) close(p);
}

}  // namespace speedmatrix::detail
