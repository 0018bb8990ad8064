// PrecisionScan (stats.hpp): the figures the precision stop reads, from events visited once.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "speedmatrix/records.hpp"
#include "speedmatrix/stats.hpp"
#include "stats_detail.hpp"

namespace speedmatrix {

using detail::kNaN;

PrecisionScan::PrecisionScan(const RecordView& r, ns_t t0, ns_t t1, double bin_s)
    : r_(r), t0_(t0), t1_(t1) {
  // the bins exactly as summarize_cell makes them
  const detail::Bins bins(t0, t1, detail::bin_ns_of(bin_s));
  bin_ns_ = bins.bin_ns;
  n_bins_ = bins.n;
  bin_tokens_.assign(static_cast<std::size_t>(n_bins_), 0);
  bin_gaps_.resize(static_cast<std::size_t>(n_bins_));
  open_.resize(r.sent_ns.size());
}

void PrecisionScan::add(std::int32_t request, ns_t t_ns, std::int32_t tokens) {
  // token_arrivals' filter: a window request's events with tokens
  if (request < 0 || static_cast<std::size_t>(request) >= open_.size() || tokens <= 0) return;
  const auto q = static_cast<std::size_t>(request);
  if (q >= r_.phase.size() || r_.phase[q] != static_cast<std::uint8_t>(Phase::kWindow)) return;
  Open& o = open_[q];
  if (o.cur != kNever && t_ns >= o.cur && t_ns - o.cur < kDeliveryNs) {  // one delivery
    o.tokens += tokens;
    return;
  }
  if (o.cur != kNever && t_ns < o.cur) ordered_ = false;
  close_arrival(q);
  o.prev = o.cur;
  o.cur = t_ns;
  o.tokens = tokens;
}

void PrecisionScan::close_arrival(std::size_t q) {
  const Open& o = open_[q];
  if (o.cur == kNever) return;
  const ns_t t = o.cur;
  if (t1_ <= t0_ || t < t0_ || t > t1_) return;  // summarize_cell's in_window
  const std::int64_t bin = std::min<std::int64_t>(n_bins_ - 1, (t - t0_) / bin_ns_);
  output_tokens_ += o.tokens;
  bin_tokens_[static_cast<std::size_t>(bin)] += o.tokens;
  if (q < r_.outcome.size() && r_.outcome[q] == static_cast<std::uint8_t>(Outcome::kError)) return;
  if (o.prev == kNever) return;
  // the same arithmetic as token_arrivals: ns as double, to ms, spread over the tokens
  double gap = static_cast<double>(t - o.prev);
  gap = gap * 1e-6 / static_cast<double>(o.tokens);
  bin_gaps_[static_cast<std::size_t>(bin)].emplace_back(gap, o.tokens);
}

CellFigures PrecisionScan::finish() {
  CellFigures f = detail::empty_figures();
  if (t1_ <= t0_) return f;
  for (std::size_t q = 0; q < open_.size(); ++q) close_arrival(q);
  const ns_t span_ns = t1_ - t0_;
  const double d_s = static_cast<double>(span_ns) * 1e-9;
  f.measured_s = d_s;
  f.output_tokens = output_tokens_;
  f.total_tok_s = static_cast<double>(output_tokens_) / d_s;
  f.bin_tok_s = detail::Bins(t0_, t1_, bin_ns_).rates(bin_tokens_);
  // per-bin weighted medians (group_medians: non-empty bins, in order)
  std::vector<double> medians;
  std::int64_t total = 0;
  for (auto& g : bin_gaps_) {
    if (g.empty()) continue;
    std::sort(g.begin(), g.end());
    medians.push_back(detail::sorted_weighted_quantile(g, 0, g.size(), 0.5));
    for (const auto& x : g) total += x.second;
  }
  f.tbt_ms_ci = mean_interval_autocorrelated(medians);
  if (total > 0) {
    // The overall weighted median of the sorted bins merged, read as sorted_weighted_quantile
    // reads one sorted list (the value at a rank does not depend on how ties are ordered).
    struct Cur {
      double v;
      std::size_t bin, i;
    };
    auto later = [](const Cur& a, const Cur& b) { return a.v > b.v; };
    std::vector<Cur> heap;
    for (std::size_t b = 0; b < bin_gaps_.size(); ++b)
      if (!bin_gaps_[b].empty()) heap.push_back({bin_gaps_[b][0].first, b, 0});
    std::make_heap(heap.begin(), heap.end(), later);
    const double pos = 0.5 * static_cast<double>(total - 1);
    const auto lo_rank = static_cast<std::int64_t>(std::floor(pos));
    const double frac = pos - static_cast<double>(lo_rank);
    std::int64_t cum = 0;
    double last = kNaN;
    auto value_at = [&](std::int64_t r) {
      while (!heap.empty()) {
        const Cur c = heap.front();
        const std::int64_t w = bin_gaps_[c.bin][c.i].second;
        if (cum + w > r) return c.v;
        cum += w;
        last = c.v;
        std::pop_heap(heap.begin(), heap.end(), later);
        heap.pop_back();
        if (c.i + 1 < bin_gaps_[c.bin].size()) {
          heap.push_back({bin_gaps_[c.bin][c.i + 1].first, c.bin, c.i + 1});
          std::push_heap(heap.begin(), heap.end(), later);
        }
      }
      return last;  // past the end: the largest value
    };
    const double lo = value_at(lo_rank);
    f.tbt_ms = frac == 0 ? lo : lo + frac * (value_at(lo_rank + 1) - lo);
    f.per_request_tok_s = 1000.0 / f.tbt_ms;
  }
  std::vector<std::vector<std::pair<double, std::int64_t>>>().swap(bin_gaps_);
  f.per_request_tok_s_ci = detail::per_request_interval(f.tbt_ms_ci);
  f.total_tok_s_ci = mean_interval_autocorrelated(f.bin_tok_s);
  f.precision = precision_of(f);
  return f;
}

}  // namespace speedmatrix
