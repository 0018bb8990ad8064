#include "speedmatrix/stats.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <numeric>
#include <utility>

#include "speedmatrix/records.hpp"
#include "stats_detail.hpp"

namespace speedmatrix {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

double t975(std::int64_t df) {
  static constexpr double kTable[] = {
      12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
      2.2010,  2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
      2.0796,  2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423};
  if (df < 1) return kNaN;
  if (df <= 30) return kTable[df - 1];
  // Cornish-Fisher expansion around the normal quantile; error < 1e-4 for df
  // > 30.
  const double z = kZ975, n = static_cast<double>(df);
  const double z3 = z * z * z, z5 = z3 * z * z, z7 = z5 * z * z;
  return z + (z3 + z) / (4 * n) + (5 * z5 + 16 * z3 + 3 * z) / (96 * n * n) +
         (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * n * n * n);
}

namespace {

// 95% interval of the median from order statistics: ranks n/2 -+ z sqrt(n)/2
// (1-based, the usual normal approximation of the binomial); NaN below 6 values.
// 1-based ranks of the order statistics bounding quantile q of n values at kConfidence:
// n q -+ z sqrt(n q (1 - q)), the low one floored, the high one ceiled plus one (the
// normal approximation of the binomial). They may fall outside [1, n].
std::pair<std::int64_t, std::int64_t> order_ranks(std::size_t n, double q) {
  const double nn = static_cast<double>(n), half = kZ975 * std::sqrt(nn * q * (1 - q));
  return {static_cast<std::int64_t>(std::floor(nn * q - half)),
          static_cast<std::int64_t>(std::ceil(nn * q + half)) + 1};
}

Interval order_median_interval(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  const std::size_t n = v.size();
  if (n < 6) return {kNaN, kNaN};
  std::sort(v.begin(), v.end());
  const auto [lo, hi] = order_ranks(n, 0.5);
  const auto j = std::max<std::int64_t>(1, lo);
  const auto k = std::min<std::int64_t>(static_cast<std::int64_t>(n), hi);
  return {v[static_cast<std::size_t>(j - 1)], v[static_cast<std::size_t>(k - 1)]};
}

// Quantile q of the multiset in which each sorted value appears `weight`
// times, interpolating linearly between neighbours (so unit weights give the
// same figure as percentile()). REQUIRES: sorted by value, weights > 0.
double sorted_weighted_quantile(const std::vector<std::pair<double, std::int64_t>>& vw,
                                std::size_t begin, std::size_t end, double q) {
  std::int64_t total = 0;
  for (std::size_t i = begin; i < end; ++i) total += vw[i].second;
  if (total <= 0) return kNaN;
  q = std::clamp(q, 0.0, 1.0);
  const double pos = q * static_cast<double>(total - 1);
  const auto lo_rank = static_cast<std::int64_t>(std::floor(pos));
  const double frac = pos - static_cast<double>(lo_rank);
  // Value at 0-based rank r of the expanded multiset.
  std::size_t i = begin;
  std::int64_t cum = 0;
  auto value_at = [&](std::int64_t r) {
    while (i < end && cum + vw[i].second <= r) cum += vw[i++].second;
    return vw[std::min(i, end - 1)].first;
  };
  const double lo = value_at(lo_rank);
  if (frac == 0) return lo;
  const double hi = value_at(lo_rank + 1);
  return lo + frac * (hi - lo);
}

// Median of each group of values sharing a key; `kv` is sorted in place by
// (key, value). Returns one median per non-empty key.
std::vector<double> group_medians(
    std::vector<std::pair<std::int64_t, std::pair<double, std::int64_t>>>& kv) {
  std::sort(kv.begin(), kv.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.first < b.second.first;
  });
  std::vector<double> medians;
  std::vector<std::pair<double, std::int64_t>> group;
  for (std::size_t i = 0; i < kv.size();) {
    std::size_t j = i;
    group.clear();
    while (j < kv.size() && kv[j].first == kv[i].first) group.push_back(kv[j++].second);
    medians.push_back(sorted_weighted_quantile(group, 0, group.size(), 0.5));
    i = j;
  }
  return medians;
}

// Event token counts with chunk-counted requests scaled to their usage total.
// Cumulative rounding keeps every count an integer and each request's sum
// exactly its total; an event can drop to 0 tokens when chunks over-counted.
std::vector<std::int32_t> usage_scaled_tokens(const RecordView& r, std::size_t n_ev) {
  std::vector<std::int32_t> tokens(r.ev_tokens.begin(), r.ev_tokens.begin() + n_ev);
  const std::size_t n_req = std::min(r.output_tokens.size(), r.token_source.size());
  if (n_req == 0) return tokens;
  std::vector<std::int64_t> chunk_sum(n_req, 0);
  for (std::size_t e = 0; e < n_ev; ++e) {
    const auto q = static_cast<std::size_t>(r.ev_request[e]);
    if (q < n_req && tokens[e] > 0) chunk_sum[q] += tokens[e];
  }
  std::vector<std::int64_t> seen(n_req, 0);
  for (std::size_t e = 0; e < n_ev; ++e) {
    const auto q = static_cast<std::size_t>(r.ev_request[e]);
    if (q >= n_req || tokens[e] <= 0 || chunk_sum[q] <= 0) continue;
    if (!scaled_to_usage(static_cast<TokenSource>(r.token_source[q]))) continue;
    const std::int64_t total = r.output_tokens[q];
    if (total <= 0 || total == chunk_sum[q]) continue;
    const double scale = static_cast<double>(total) / static_cast<double>(chunk_sum[q]);
    const auto before = std::llround(static_cast<double>(seen[q]) * scale);
    seen[q] += tokens[e];
    const auto after = std::llround(static_cast<double>(seen[q]) * scale);
    tokens[e] = static_cast<std::int32_t>(after - before);
  }
  return tokens;
}

}  // namespace

Interval mean_interval_autocorrelated(const std::vector<double>& v) {
  const std::size_t n = v.size();
  if (n < 2) return {kNaN, kNaN};
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(n);
  double ss = 0, lag = 0;
  for (std::size_t k = 0; k < n; ++k) {
    ss += (v[k] - mean) * (v[k] - mean);
    if (k + 1 < n) lag += (v[k] - mean) * (v[k + 1] - mean);
  }
  // Positively correlated bins (a slow wave of admissions, a batch that
  // grows) carry less information than their count: shrink n to the AR(1)
  // effective sample size. Negative correlation is not credited.
  const double r = (n >= 3 && ss > 0) ? std::clamp(lag / ss, 0.0, 0.9) : 0.0;
  const double n_eff = static_cast<double>(n) * (1 - r) / (1 + r);
  const auto df = std::max<std::int64_t>(1, std::llround(n_eff) - 1);
  const double sd = std::sqrt(ss / static_cast<double>(n - 1));
  const double half = t975(df) * sd / std::sqrt(n_eff);
  return {mean - half, mean + half};
}

Interval median_interval(std::vector<double> v) { return order_median_interval(std::move(v)); }

double precision_of(const CellFigures& f) {
  auto rel = [](double value, const Interval& ci) {
    if (std::isnan(ci.lo) || std::isnan(ci.hi) || !(value > 0) || std::isinf(ci.hi)) return kNaN;
    return (ci.hi - ci.lo) / 2 / value;
  };
  const double a = rel(f.total_tok_s, f.total_tok_s_ci), b = rel(f.tbt_ms, f.tbt_ms_ci);
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  return std::max(a, b);
}

bool precision_stop(const CellFigures& f, double target, double elapsed_s, double min_duration_s) {
  if (!(target > 0) || elapsed_s < min_duration_s) return false;
  const double p = precision_of(f);
  return !std::isnan(p) && p <= target;
}

double percentile(std::vector<double> values, double q) {
  values.erase(std::remove_if(values.begin(), values.end(), [](double x) { return std::isnan(x); }),
               values.end());
  if (values.empty()) return kNaN;
  std::sort(values.begin(), values.end());
  q = std::clamp(q, 0.0, 1.0);
  const double pos = q * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const double frac = pos - static_cast<double>(lo);
  if (frac == 0 || lo + 1 >= values.size()) return values[lo];
  return values[lo] + frac * (values[lo + 1] - values[lo]);
}

std::vector<QuantileEstimate> quantiles(std::vector<double> v, std::span<const double> qs) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  std::vector<QuantileEstimate> out;
  out.reserve(qs.size());
  for (double q : qs) {
    QuantileEstimate e{kNaN, kNaN, kNaN};
    if (n > 0) {
      q = std::clamp(q, 0.0, 1.0);
      const double pos = q * static_cast<double>(n - 1);
      const auto i = static_cast<std::size_t>(std::floor(pos));
      const double frac = pos - static_cast<double>(i);
      e.value = (frac == 0 || i + 1 >= n) ? v[i] : v[i] + frac * (v[i + 1] - v[i]);
      const auto [lo, hi] = order_ranks(n, q);
      const auto inside = [n](std::int64_t r) {
        return r >= 1 && r <= static_cast<std::int64_t>(n);
      };
      if (inside(lo)) e.lo = v[static_cast<std::size_t>(lo - 1)];
      if (inside(hi)) e.hi = v[static_cast<std::size_t>(hi - 1)];
    }
    out.push_back(e);
  }
  return out;
}

double weighted_percentile(std::span<const double> values, std::span<const std::int64_t> weights,
                           double q) {
  std::vector<std::pair<double, std::int64_t>> vw;
  vw.reserve(values.size());
  for (std::size_t i = 0; i < values.size() && i < weights.size(); ++i) {
    if (weights[i] > 0 && !std::isnan(values[i])) vw.emplace_back(values[i], weights[i]);
  }
  std::sort(vw.begin(), vw.end());
  return sorted_weighted_quantile(vw, 0, vw.size(), q);
}

std::vector<Arrival> token_arrivals(const RecordView& r, int phase) {
  const std::size_t n_req = r.sent_ns.size();
  const std::size_t n_ev = std::min({r.ev_request.size(), r.ev_t_ns.size(), r.ev_tokens.size()});
  const std::vector<std::int32_t> ev_tokens = usage_scaled_tokens(r, n_ev);
  auto counted = [&](std::int32_t q) {
    if (q < 0 || static_cast<std::size_t>(q) >= n_req) return false;
    if (phase < 0) return true;
    return static_cast<std::size_t>(q) < r.phase.size() &&
           r.phase[static_cast<std::size_t>(q)] == static_cast<std::uint8_t>(phase);
  };
  std::vector<std::size_t> order;
  order.reserve(n_ev);
  for (std::size_t e = 0; e < n_ev; ++e) {
    if (counted(r.ev_request[e]) && ev_tokens[e] > 0) order.push_back(e);
  }
  // Records hold each request's events in arrival order, interleaved across
  // requests; a stable sort by (request, time) keeps one read's events together.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return r.ev_request[a] != r.ev_request[b] ? r.ev_request[a] < r.ev_request[b]
                                              : r.ev_t_ns[a] < r.ev_t_ns[b];
  });
  // Events of one request in one delivery (one socket read, or reads within
  // kDeliveryNs of its first) are one arrival, and the gap since the previous
  // arrival is spread over all their tokens (k tokens -> k gaps of gap/k).
  std::vector<Arrival> out;
  out.reserve(order.size());
  for (std::size_t e : order) {
    const std::int32_t q = r.ev_request[e];
    const ns_t t = r.ev_t_ns[e];
    if (!out.empty() && out.back().request == q && t - out.back().t_ns < kDeliveryNs) {
      out.back().tokens += ev_tokens[e];
      continue;
    }
    Arrival a;
    a.request = q;
    a.t_ns = t;
    a.tokens = ev_tokens[e];
    a.gap_ms = kNaN;
    if (!out.empty() && out.back().request == q)
      a.gap_ms = static_cast<double>(t - out.back().t_ns);
    out.push_back(a);
  }
  // The gap is known once all of an arrival's tokens are: spread it now.
  for (Arrival& a : out) {
    if (!std::isnan(a.gap_ms)) a.gap_ms = a.gap_ms * 1e-6 / static_cast<double>(a.tokens);
  }
  return out;
}

namespace {

CellFigures empty_figures() {
  CellFigures f;
  f.tbt_ms = f.per_request_tok_s = f.ttft_ms = f.ttft_first_wave_ms = kNaN;
  f.decode_tok_s_per_request = f.precision = kNaN;
  f.ttft_p90_ms = f.ttft_p99_ms = f.tbt_p90_ms = f.tbt_p99_ms = kNaN;
  f.tbt_mean_ms = kNaN;
  f.total_tok_s_ci = f.tbt_ms_ci = f.per_request_tok_s_ci = f.ttft_ms_ci = {kNaN, kNaN};
  f.decode_tok_s_per_request_ci = {kNaN, kNaN};
  return f;
}

}  // namespace

PrecisionScan::PrecisionScan(const RecordView& r, ns_t t0, ns_t t1, double bin_s)
    : r_(r), t0_(t0), t1_(t1) {
  // the bins exactly as summarize_cell makes them
  if (!(bin_s > 0)) bin_s = 1.0;
  bin_ns_ = std::max<ns_t>(1'000'000, std::llround(bin_s * 1e9));
  n_bins_ = t1 > t0 ? std::max<std::int64_t>(1, (t1 - t0) / bin_ns_) : 1;
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
  CellFigures f = empty_figures();
  if (t1_ <= t0_) return f;
  for (std::size_t q = 0; q < open_.size(); ++q) close_arrival(q);
  const ns_t span_ns = t1_ - t0_;
  const double d_s = static_cast<double>(span_ns) * 1e-9;
  f.measured_s = d_s;
  f.output_tokens = output_tokens_;
  f.total_tok_s = static_cast<double>(output_tokens_) / d_s;
  f.bin_tok_s.resize(static_cast<std::size_t>(n_bins_));
  for (std::int64_t k = 0; k < n_bins_; ++k) {
    const ns_t w = k < n_bins_ - 1 ? bin_ns_ : span_ns - (n_bins_ - 1) * bin_ns_;
    f.bin_tok_s[static_cast<std::size_t>(k)] =
        static_cast<double>(bin_tokens_[static_cast<std::size_t>(k)]) /
        (static_cast<double>(w) * 1e-9);
  }
  // per-bin weighted medians (group_medians: non-empty bins, in order)
  std::vector<double> medians;
  std::int64_t total = 0;
  for (auto& g : bin_gaps_) {
    if (g.empty()) continue;
    std::sort(g.begin(), g.end());
    medians.push_back(sorted_weighted_quantile(g, 0, g.size(), 0.5));
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
  if (!std::isnan(f.tbt_ms_ci.lo)) {
    f.per_request_tok_s_ci = {1000.0 / f.tbt_ms_ci.hi,
                              f.tbt_ms_ci.lo > 0 ? 1000.0 / f.tbt_ms_ci.lo : kInf};
  }
  f.total_tok_s_ci = mean_interval_autocorrelated(f.bin_tok_s);
  f.precision = precision_of(f);
  return f;
}

namespace {

// Per request: its last arrival (any time), and its first and last arrival inside the
// window with the tokens after the first (decode speed).
struct Span {
  ns_t last = kNever;
  ns_t first_in = kNever;
  ns_t last_in = kNever;
  std::int64_t tokens_after = 0;
};

// What summarize_cell reads from the events: window tokens per bin, the weighted
// quantiles of the gaps, each non-empty bin's weighted median gap (in bin order) and the
// per-request spans.
struct WindowEvents {
  std::int64_t output_tokens = 0;
  std::vector<std::int64_t> bin_tokens;
  double tbt_ms = kNaN, tbt_p90_ms = kNaN, tbt_p99_ms = kNaN;
  std::int64_t tbt_count = 0;
  double tbt_mean_ms = kNaN;
  std::vector<double> tbt_quantiles_ms;  // at the caller's tbt_qs
  std::vector<double> bin_medians;
  std::vector<Span> spans;
};

// The mean of values each repeated `weight` times, summed with Neumaier's compensation (so
// millions of samples lose no more than a rounding or two, unlike a plain running sum).
class WeightedMean {
 public:
  void add(double v, std::int64_t weight) {
    const double x = v * static_cast<double>(weight);
    const double t = sum_ + x;
    carry_ += std::abs(sum_) >= std::abs(x) ? (sum_ - t) + x : (x - t) + sum_;
    sum_ = t;
    count_ += weight;
  }
  std::int64_t count() const { return count_; }
  double value() const { return count_ > 0 ? (sum_ + carry_) / static_cast<double>(count_) : kNaN; }

 private:
  double sum_ = 0, carry_ = 0;
  std::int64_t count_ = 0;
};

bool failed_request(const RecordView& r, std::size_t i) {
  return i < r.outcome.size() && r.outcome[i] == static_cast<std::uint8_t>(Outcome::kError);
}

std::int64_t bin_index(ns_t t, ns_t t0, ns_t bin_ns, std::int64_t n_bins) {
  return std::min<std::int64_t>(n_bins - 1, (t - t0) / bin_ns);
}

// From token_arrivals' sorted copy (~90 bytes an event at the peak): any event order.
WindowEvents window_events_sorted(const RecordView& r, ns_t t0, ns_t t1, ns_t bin_ns,
                                  std::int64_t n_bins, std::span<const double> tbt_qs) {
  WindowEvents w;
  w.bin_tokens.assign(static_cast<std::size_t>(n_bins), 0);
  w.spans.resize(r.sent_ns.size());
  auto in_window = [&](ns_t t) { return t != kNever && t >= t0 && t <= t1; };
  std::vector<std::pair<double, std::int64_t>> gaps;  // (ms per token, tokens)
  std::vector<std::pair<std::int64_t, std::pair<double, std::int64_t>>> bin_gaps;
  {
    const std::vector<Arrival> arrivals = token_arrivals(r);
    for (const Arrival& a : arrivals) {
      const auto q = static_cast<std::size_t>(a.request);
      Span& s = w.spans[q];
      s.last = a.t_ns;
      if (!in_window(a.t_ns)) continue;
      const std::int64_t bin = bin_index(a.t_ns, t0, bin_ns, n_bins);
      w.output_tokens += a.tokens;
      w.bin_tokens[static_cast<std::size_t>(bin)] += a.tokens;
      if (failed_request(r, q)) continue;  // a failed stream's silence is not the server's decode
      if (s.first_in == kNever) {
        s.first_in = a.t_ns;
      } else {
        s.tokens_after += a.tokens;
        s.last_in = a.t_ns;
      }
      if (!std::isnan(a.gap_ms)) {
        gaps.emplace_back(a.gap_ms, a.tokens);
        bin_gaps.push_back({bin, {a.gap_ms, a.tokens}});
      }
    }
  }
  std::sort(gaps.begin(), gaps.end());
  w.tbt_quantiles_ms.assign(tbt_qs.size(), kNaN);
  if (!gaps.empty()) {
    w.tbt_ms = sorted_weighted_quantile(gaps, 0, gaps.size(), 0.5);
    w.tbt_p90_ms = sorted_weighted_quantile(gaps, 0, gaps.size(), 0.90);
    w.tbt_p99_ms = sorted_weighted_quantile(gaps, 0, gaps.size(), 0.99);
    for (std::size_t i = 0; i < tbt_qs.size(); ++i)
      w.tbt_quantiles_ms[i] = sorted_weighted_quantile(gaps, 0, gaps.size(), tbt_qs[i]);
    WeightedMean mean;
    for (const auto& [gap, tokens] : gaps) mean.add(gap, tokens);
    w.tbt_count = mean.count();
    w.tbt_mean_ms = mean.value();
  }
  w.bin_medians = group_medians(bin_gaps);
  return w;
}

// token_arrivals' arrivals of `phase` requests, usage-scaled the same way, handed to
// `on_arrival(request, t_ns, tokens, gap_ms)` in time order, from one pass over the event
// columns in record order. REQUIRES detail::time_ordered(r). Memory: O(requests).
template <class OnArrival>
void stream_arrivals(const RecordView& r, int phase, OnArrival&& on_arrival) {
  const std::size_t n_req = r.sent_ns.size();
  const std::size_t n_ev = std::min({r.ev_request.size(), r.ev_t_ns.size(), r.ev_tokens.size()});
  // usage_scaled_tokens, event by event: the per-request chunk sums first
  const std::size_t n_usage = std::min(r.output_tokens.size(), r.token_source.size());
  std::vector<std::int64_t> chunk_sum(n_usage, 0), seen(n_usage, 0);
  for (std::size_t e = 0; n_usage > 0 && e < n_ev; ++e) {
    const auto q = static_cast<std::size_t>(r.ev_request[e]);
    if (q < n_usage && r.ev_tokens[e] > 0) chunk_sum[q] += r.ev_tokens[e];
  }
  auto scaled = [&](std::size_t e) -> std::int32_t {
    const std::int32_t tok = r.ev_tokens[e];
    const auto q = static_cast<std::size_t>(r.ev_request[e]);
    if (q >= n_usage || tok <= 0 || chunk_sum[q] <= 0) return tok;
    if (!scaled_to_usage(static_cast<TokenSource>(r.token_source[q]))) return tok;
    const std::int64_t total = r.output_tokens[q];
    if (total <= 0 || total == chunk_sum[q]) return tok;
    const double scale = static_cast<double>(total) / static_cast<double>(chunk_sum[q]);
    const auto before = std::llround(static_cast<double>(seen[q]) * scale);
    seen[q] += tok;
    const auto after = std::llround(static_cast<double>(seen[q]) * scale);
    return static_cast<std::int32_t>(after - before);
  };
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

// Exact weighted quantiles of positive doubles without holding them: the values are
// presented again for each pass, and each pass fixes 16 more bits of each wanted rank's
// value (the bits of positive doubles order as the values do). Memory: one 65,536-count
// histogram per distinct prefix wanted (at most one per rank).
class RankSelect {
 public:
  static constexpr int kPasses = 4;
  void add(double v, std::int64_t w) {
    const auto key = std::bit_cast<std::uint64_t>(v);
    if (pass_ == 0) {
      first_[key >> 48] += w;
      return;
    }
    const int shift = 64 - 16 * pass_;
    for (Hist& h : hists_) {
      if ((key >> shift) == h.prefix) {
        h.counts[(key >> (shift - 16)) & 0xFFFF] += w;
        break;
      }
    }
  }
  // After the first pass: the ranks (0-based, in the multiset with each value repeated
  // its weight) to find.
  void want(const std::vector<std::int64_t>& ranks) {
    for (std::int64_t rank : ranks) wants_.push_back({0, rank});
    narrow(first_);
    first_.clear();
    first_.shrink_to_fit();
  }
  bool done() const { return pass_ >= kPasses; }
  // After each later pass.
  void end_pass() {
    for (Want& w : wants_) {
      for (const Hist& h : hists_)
        if (h.prefix == w.prefix) digit(w, h.counts);
    }
    ++pass_;
    prepare();
  }
  double value(std::size_t i) const { return std::bit_cast<double>(wants_[i].prefix); }

 private:
  struct Want {
    std::uint64_t prefix;  // the bits fixed so far
    std::int64_t rank;     // its rank among the values with that prefix
  };
  struct Hist {
    std::uint64_t prefix;
    std::vector<std::int64_t> counts;
  };
  static void digit(Want& w, const std::vector<std::int64_t>& counts) {
    std::int64_t cum = 0;
    std::size_t d = 0;
    while (d + 1 < counts.size() && cum + counts[d] <= w.rank) cum += counts[d++];
    w.rank -= cum;
    w.prefix = (w.prefix << 16) | d;
  }
  void narrow(const std::vector<std::int64_t>& counts) {
    for (Want& w : wants_) digit(w, counts);
    pass_ = 1;
    prepare();
  }
  void prepare() {
    hists_.clear();
    if (done()) return;
    for (const Want& w : wants_) {
      bool have = false;
      for (const Hist& h : hists_) have = have || h.prefix == w.prefix;
      if (!have) hists_.push_back({w.prefix, std::vector<std::int64_t>(65536, 0)});
    }
  }
  int pass_ = 0;
  std::vector<std::int64_t> first_ = std::vector<std::int64_t>(65536, 0);
  std::vector<Want> wants_;
  std::vector<Hist> hists_;
};

// The same figures as window_events_sorted, read in passes over the event columns
// (REQUIRES detail::time_ordered(r)): O(requests + bins) plus one bin's gaps at a time and the
// rank selection's histograms (a few MB), however many events.
WindowEvents window_events_streamed(const RecordView& r, ns_t t0, ns_t t1, ns_t bin_ns,
                                    std::int64_t n_bins, std::span<const double> tbt_qs) {
  WindowEvents w;
  w.bin_tokens.assign(static_cast<std::size_t>(n_bins), 0);
  w.spans.resize(r.sent_ns.size());
  auto in_window = [&](ns_t t) { return t != kNever && t >= t0 && t <= t1; };
  // Arrivals come in time order, so bins fill one after another: one bin's gaps at a time.
  std::vector<std::pair<double, std::int64_t>> bin_gaps;
  std::int64_t bin_now = -1, total = 0;
  auto flush_bin = [&] {
    if (bin_gaps.empty()) return;
    std::sort(bin_gaps.begin(), bin_gaps.end());
    w.bin_medians.push_back(sorted_weighted_quantile(bin_gaps, 0, bin_gaps.size(), 0.5));
    bin_gaps.clear();
  };
  RankSelect select;
  WeightedMean mean;
  stream_arrivals(r, 1, [&](std::int32_t request, ns_t t, std::int64_t tokens, double gap) {
    const auto q = static_cast<std::size_t>(request);
    Span& s = w.spans[q];
    s.last = t;
    if (!in_window(t)) return;
    const std::int64_t bin = bin_index(t, t0, bin_ns, n_bins);
    w.output_tokens += tokens;
    w.bin_tokens[static_cast<std::size_t>(bin)] += tokens;
    if (failed_request(r, q)) return;  // a failed stream's silence is not the server's decode
    if (s.first_in == kNever) {
      s.first_in = t;
    } else {
      s.tokens_after += tokens;
      s.last_in = t;
    }
    if (std::isnan(gap)) return;
    if (bin != bin_now) {
      flush_bin();
      bin_now = bin;
    }
    bin_gaps.emplace_back(gap, tokens);
    select.add(gap, tokens);
    mean.add(gap, tokens);
    total += tokens;
  });
  flush_bin();
  std::vector<std::pair<double, std::int64_t>>().swap(bin_gaps);
  w.tbt_quantiles_ms.assign(tbt_qs.size(), kNaN);
  if (total <= 0) return w;
  w.tbt_count = mean.count();
  w.tbt_mean_ms = mean.value();
  // sorted_weighted_quantile's ranks: q (total - 1), and the next one to interpolate
  std::vector<double> qs = {0.5, 0.90, 0.99};
  for (double q : tbt_qs) qs.push_back(std::clamp(q, 0.0, 1.0));
  std::vector<std::int64_t> ranks;
  for (double q : qs) {
    const double pos = q * static_cast<double>(total - 1);
    const auto lo = static_cast<std::int64_t>(std::floor(pos));
    ranks.push_back(lo);
    ranks.push_back(std::min(lo + 1, total - 1));
  }
  select.want(ranks);
  while (!select.done()) {
    stream_arrivals(r, 1, [&](std::int32_t request, ns_t t, std::int64_t tokens, double gap) {
      if (in_window(t) && !std::isnan(gap) && !failed_request(r, static_cast<std::size_t>(request)))
        select.add(gap, tokens);
    });
    select.end_pass();
  }
  std::vector<double*> out = {&w.tbt_ms, &w.tbt_p90_ms, &w.tbt_p99_ms};
  for (double& v : w.tbt_quantiles_ms) out.push_back(&v);
  for (std::size_t i = 0; i < qs.size(); ++i) {
    const double pos = qs[i] * static_cast<double>(total - 1);
    const double frac = pos - std::floor(pos);
    const double lo = select.value(2 * i);
    *out[i] = frac == 0 ? lo : lo + frac * (select.value(2 * i + 1) - lo);
  }
  return w;
}

}  // namespace

bool detail::time_ordered(const RecordView& r) {
  const std::size_t n = std::min({r.ev_request.size(), r.ev_t_ns.size(), r.ev_tokens.size()});
  for (std::size_t e = 1; e < n; ++e) {
    if (r.ev_t_ns[e] < r.ev_t_ns[e - 1]) return false;
  }
  return true;
}

CellFigures summarize_cell(const RecordView& r, ns_t t0, ns_t t1, double bin_s, ns_t steady_from_ns,
                           ns_t ttft_from_ns, std::span<const double> tbt_qs) {
  CellFigures f = empty_figures();
  if (t1 <= t0) return f;
  const ns_t span_ns = t1 - t0;
  const double d_s = static_cast<double>(span_ns) * 1e-9;
  f.measured_s = d_s;

  const std::size_t n_req = r.sent_ns.size();
  auto in_window = [&](ns_t t) { return t != kNever && t >= t0 && t <= t1; };
  auto window_req = [&](std::int64_t i) {
    return i >= 0 && static_cast<std::size_t>(i) < n_req &&
           static_cast<std::size_t>(i) < r.phase.size() &&
           r.phase[static_cast<std::size_t>(i)] == static_cast<std::uint8_t>(Phase::kWindow);
  };

  // Bins of bin_s from t0; the remainder of D that does not fill a bin is
  // added to the last one, so every bin spans at least bin_s.
  if (!(bin_s > 0)) bin_s = 1.0;
  const ns_t bin_ns = std::max<ns_t>(1'000'000, std::llround(bin_s * 1e9));  // >= 1 ms bins
  const std::int64_t n_bins = std::max<std::int64_t>(1, span_ns / bin_ns);
  auto bin_width_s = [&](std::int64_t k) {
    const ns_t w = k < n_bins - 1 ? bin_ns : span_ns - (n_bins - 1) * bin_ns;
    return static_cast<double>(w) * 1e-9;
  };

  // --- tokens in the window, per bin, and the gaps between arrivals ---
  // Read straight from the event columns when they are in the transport's order (bounded
  // memory however many events, which may be spilled mappings); else from a sorted copy.
  WindowEvents w = detail::time_ordered(r)
                       ? window_events_streamed(r, t0, t1, bin_ns, n_bins, tbt_qs)
                       : window_events_sorted(r, t0, t1, bin_ns, n_bins, tbt_qs);
  f.output_tokens = w.output_tokens;
  const std::vector<Span>& spans = w.spans;
  const std::vector<std::int64_t>& bin_tokens = w.bin_tokens;
  f.total_tok_s = static_cast<double>(f.output_tokens) / d_s;
  f.bin_tok_s.resize(static_cast<std::size_t>(n_bins));
  for (std::int64_t k = 0; k < n_bins; ++k) {
    f.bin_tok_s[static_cast<std::size_t>(k)] =
        static_cast<double>(bin_tokens[static_cast<std::size_t>(k)]) / bin_width_s(k);
  }
  f.tbt_ms = w.tbt_ms;
  f.tbt_p90_ms = w.tbt_p90_ms;
  f.tbt_p99_ms = w.tbt_p99_ms;
  f.tbt_count = w.tbt_count;
  f.tbt_mean_ms = w.tbt_mean_ms;
  f.tbt_quantiles_ms = std::move(w.tbt_quantiles_ms);
  if (!std::isnan(f.tbt_ms)) f.per_request_tok_s = 1000.0 / f.tbt_ms;
  f.tbt_ms_ci = mean_interval_autocorrelated(w.bin_medians);
  std::vector<double> decode_rates;
  for (const Span& a : spans) {
    if (a.last_in == kNever || a.last_in <= a.first_in) continue;
    decode_rates.push_back(static_cast<double>(a.tokens_after) /
                           (static_cast<double>(a.last_in - a.first_in) * 1e-9));
  }
  f.decode_requests = static_cast<std::int64_t>(decode_rates.size());
  if (!decode_rates.empty()) f.decode_tok_s_per_request = percentile(decode_rates, 0.5);
  f.decode_tok_s_per_request_ci = order_median_interval(decode_rates);
  if (!std::isnan(f.tbt_ms_ci.lo)) {
    // per-request tok/s = 1000 / tbt is decreasing in tbt: the bounds swap.
    f.per_request_tok_s_ci = {1000.0 / f.tbt_ms_ci.hi,
                              f.tbt_ms_ci.lo > 0 ? 1000.0 / f.tbt_ms_ci.lo : kInf};
  }

  // --- per request: TTFT, in flight, outcomes ---
  std::vector<double> ttfts, first_wave;
  const ns_t ttft_from = ttft_from_ns == kNever ? t0 : ttft_from_ns;
  std::vector<char> slot_seen;
  double in_flight_ns = 0;
  for (std::size_t i = 0; i < n_req; ++i) {
    if (!window_req(static_cast<std::int64_t>(i))) continue;
    const ns_t sent = r.sent_ns[i];
    const ns_t done = i < r.done_ns.size() ? r.done_ns[i] : kNever;
    const ns_t first = i < r.first_token_ns.size() ? r.first_token_ns[i] : kNever;
    const auto outcome =
        i < r.outcome.size() ? static_cast<Outcome>(r.outcome[i]) : Outcome::kPending;
    if (sent != kNever) {
      const ns_t from = std::max(sent, t0);
      const ns_t to = done == kNever ? t1 : std::min(done, t1);
      if (to > from) in_flight_ns += static_cast<double>(to - from);
    }
    const bool has_ttft = first != kNever && sent != kNever && first >= sent;
    if (in_window(sent)) ++f.started;
    if (sent != kNever && sent >= ttft_from && sent <= t1 && has_ttft)
      ttfts.push_back(static_cast<double>(first - sent) * 1e-6);
    if (i < r.slot.size() && r.slot[i] >= 0) {
      const auto s = static_cast<std::size_t>(r.slot[i]);
      if (s >= slot_seen.size()) slot_seen.resize(s + 1, 0);
      if (!slot_seen[s]) {
        slot_seen[s] = 1;
        if (has_ttft) first_wave.push_back(static_cast<double>(first - sent) * 1e-6);
      }
    }
    if (outcome == Outcome::kOk && in_window(done)) ++f.completed;
    if (outcome == Outcome::kError) {
      ++f.errors;
      // silence before the failure: from the last token (or the send) to the end
      const ns_t quiet = spans[i].last != kNever ? spans[i].last : sent;
      const ns_t from = std::max(quiet, t0);
      const ns_t to = done == kNever ? t1 : std::min(done, t1);
      if (quiet != kNever && to > from) f.error_slot_s += static_cast<double>(to - from) * 1e-9;
    }
  }
  if (!first_wave.empty()) f.ttft_first_wave_ms = percentile(first_wave, 0.5);
  f.avg_active = in_flight_ns / static_cast<double>(span_ns);
  if (!ttfts.empty()) {
    f.ttft_ms = percentile(ttfts, 0.5);
    f.ttft_p90_ms = percentile(ttfts, 0.90);
    f.ttft_p99_ms = percentile(ttfts, 0.99);
  }
  f.ttft_ms_ci = order_median_interval(ttfts);
  f.total_tok_s_ci = mean_interval_autocorrelated(f.bin_tok_s);
  f.precision = precision_of(f);

  // --- drift: least-squares line through per-bin throughput vs bin centre ---
  // Only bins that start at or after steady_from_ns count: the ramp while the
  // first wave is admitted is not drift.
  std::vector<double> x, y;
  {
    double edge = 0;
    const double steady_s =
        steady_from_ns > t0 ? static_cast<double>(steady_from_ns - t0) / 1e9 : 0.0;
    for (std::size_t k = 0; k < f.bin_tok_s.size(); ++k) {
      const double w = bin_width_s(static_cast<std::int64_t>(k));
      if (edge + 1e-9 >= steady_s) {
        x.push_back(edge + w / 2);
        y.push_back(f.bin_tok_s[k]);
      }
      edge += w;
    }
  }
  const std::size_t n = y.size();
  if (n >= 2) {
    const double span_s = x.back() - x.front() + bin_s;
    const double mx = std::accumulate(x.begin(), x.end(), 0.0) / static_cast<double>(n);
    const double my = std::accumulate(y.begin(), y.end(), 0.0) / static_cast<double>(n);
    double sxx = 0, sxy = 0;
    for (std::size_t k = 0; k < n; ++k) {
      sxx += (x[k] - mx) * (x[k] - mx);
      sxy += (x[k] - mx) * (y[k] - my);
    }
    if (sxx > 0 && my > 0) {
      const double slope = sxy / sxx;
      f.drift = slope * span_s / my;
      if (n >= 3) {
        double ss_res = 0;
        for (std::size_t k = 0; k < n; ++k) {
          const double fit = my + slope * (x[k] - mx);
          ss_res += (y[k] - fit) * (y[k] - fit);
        }
        const double se = std::sqrt(ss_res / static_cast<double>(n - 2) / sxx);
        const double half = t975(static_cast<std::int64_t>(n) - 2) * se;
        f.drifting = std::abs(f.drift) > 0.05 && std::abs(slope) > half;
      }
    }
  }
  return f;
}

std::vector<RequestTokens> request_tokens(const RecordView& r, ns_t t0, ns_t t1) {
  std::vector<RequestTokens> out(r.sent_ns.size());
  for (RequestTokens& q : out) q.max_gap_ms = kNaN;
  auto add = [&](std::int32_t request, ns_t t, std::int64_t tokens, double gap_ms) {
    RequestTokens& q = out[static_cast<std::size_t>(request)];
    q.tokens += tokens;
    if (t >= t0 && t <= t1) q.window_tokens += tokens;
    if (q.first_ns == kNever) q.first_ns = t;
    q.last_ns = std::max(q.last_ns, t);
    const double silence = gap_ms * static_cast<double>(tokens);  // as token_arrivals' reader
    if (!std::isnan(silence) && !(silence <= q.max_gap_ms)) q.max_gap_ms = silence;
  };
  if (detail::time_ordered(r)) {
    stream_arrivals(r, -1, add);
  } else {
    for (const Arrival& a : token_arrivals(r, -1)) add(a.request, a.t_ns, a.tokens, a.gap_ms);
  }
  return out;
}

}  // namespace speedmatrix
