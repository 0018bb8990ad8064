// Quantiles, intervals and the precision rule (stats.hpp): the one owner of percentiles and
// confidence intervals.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "speedmatrix/stats.hpp"
#include "stats_detail.hpp"

namespace speedmatrix {

using detail::kNaN;

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

// 1-based ranks of the order statistics bounding quantile q of n values at kConfidence:
// n q -+ z sqrt(n q (1 - q)), the low one floored, the high one ceiled plus one (the
// normal approximation of the binomial). They may fall outside [1, n].
std::pair<std::int64_t, std::int64_t> order_ranks(std::size_t n, double q) {
  const double nn = static_cast<double>(n), half = kZ975 * std::sqrt(nn * q * (1 - q));
  return {static_cast<std::int64_t>(std::floor(nn * q - half)),
          static_cast<std::int64_t>(std::ceil(nn * q + half)) + 1};
}

}  // namespace

Interval detail::order_median_interval(std::vector<double> v) {
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
double detail::sorted_weighted_quantile(const std::vector<std::pair<double, std::int64_t>>& vw,
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

Interval median_interval(std::vector<double> v) {
  return detail::order_median_interval(std::move(v));
}

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
  return detail::sorted_weighted_quantile(vw, 0, vw.size(), q);
}

}  // namespace speedmatrix
