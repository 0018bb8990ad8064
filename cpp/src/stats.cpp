#include "speedmatrix/stats.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <utility>

#include "speedmatrix/records.hpp"
#include "stats_detail.hpp"

namespace speedmatrix {

using detail::kInf;
using detail::kNaN;

CellFigures detail::empty_figures() {
  CellFigures f;
  f.tbt_ms = f.per_request_tok_s = f.ttft_ms = f.ttft_first_wave_ms = kNaN;
  f.decode_tok_s_per_request = f.precision = kNaN;
  f.ttft_p90_ms = f.ttft_p99_ms = f.tbt_p90_ms = f.tbt_p99_ms = kNaN;
  f.tbt_mean_ms = kNaN;
  f.total_tok_s_ci = f.tbt_ms_ci = f.per_request_tok_s_ci = f.ttft_ms_ci = {kNaN, kNaN};
  f.decode_tok_s_per_request_ci = {kNaN, kNaN};
  return f;
}

namespace {

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
    medians.push_back(detail::sorted_weighted_quantile(group, 0, group.size(), 0.5));
    i = j;
  }
  return medians;
}

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
bool failed_request(const RecordView& r, std::size_t i) {
  return i < r.outcome.size() && r.outcome[i] == static_cast<std::uint8_t>(Outcome::kError);
}

struct WindowEvents {
  std::int64_t output_tokens = 0;
  std::vector<std::int64_t> bin_tokens;
  double tbt_ms = kNaN, tbt_p90_ms = kNaN, tbt_p99_ms = kNaN;
  std::int64_t tbt_count = 0;
  double tbt_mean_ms = kNaN;
  std::vector<double> tbt_quantiles_ms;  // at the caller's tbt_qs
  std::vector<double> bin_medians;
  std::vector<Span> spans;

  WindowEvents(const RecordView& r, const detail::Bins& bins)
      : bin_tokens(static_cast<std::size_t>(bins.n), 0), spans(r.sent_ns.size()) {}
  // Counts one arrival (of a window request): its request's span, and in [t0, t1] its
  // tokens and bin. Returns that bin when its gap is a TBT sample (in the window, of a
  // request that did not fail, not the request's first arrival), else -1.
  std::int64_t count(const RecordView& r, const detail::Bins& bins, ns_t t1, std::int32_t request,
                     ns_t t, std::int64_t tokens, double gap_ms) {
    const auto q = static_cast<std::size_t>(request);
    Span& s = spans[q];
    s.last = t;
    if (t == kNever || t < bins.t0 || t > t1) return -1;
    const std::int64_t bin = bins.index(t);
    output_tokens += tokens;
    bin_tokens[static_cast<std::size_t>(bin)] += tokens;
    if (failed_request(r, q)) return -1;  // a failed stream's silence is not the server's decode
    if (s.first_in == kNever) {
      s.first_in = t;
    } else {
      s.tokens_after += tokens;
      s.last_in = t;
    }
    return std::isnan(gap_ms) ? -1 : bin;
  }
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

// From token_arrivals' sorted copy (~90 bytes an event at the peak): any event order.
WindowEvents window_events_sorted(const RecordView& r, ns_t t1, const detail::Bins& bins,
                                  std::span<const double> tbt_qs) {
  WindowEvents w(r, bins);
  std::vector<std::pair<double, std::int64_t>> gaps;  // (ms per token, tokens)
  std::vector<std::pair<std::int64_t, std::pair<double, std::int64_t>>> bin_gaps;
  {
    const std::vector<Arrival> arrivals = token_arrivals(r);
    for (const Arrival& a : arrivals) {
      const std::int64_t bin = w.count(r, bins, t1, a.request, a.t_ns, a.tokens, a.gap_ms);
      if (bin < 0) continue;
      gaps.emplace_back(a.gap_ms, a.tokens);
      bin_gaps.push_back({bin, {a.gap_ms, a.tokens}});
    }
  }
  std::sort(gaps.begin(), gaps.end());
  w.tbt_quantiles_ms.assign(tbt_qs.size(), kNaN);
  if (!gaps.empty()) {
    w.tbt_ms = detail::sorted_weighted_quantile(gaps, 0, gaps.size(), 0.5);
    w.tbt_p90_ms = detail::sorted_weighted_quantile(gaps, 0, gaps.size(), 0.90);
    w.tbt_p99_ms = detail::sorted_weighted_quantile(gaps, 0, gaps.size(), 0.99);
    for (std::size_t i = 0; i < tbt_qs.size(); ++i)
      w.tbt_quantiles_ms[i] = detail::sorted_weighted_quantile(gaps, 0, gaps.size(), tbt_qs[i]);
    WeightedMean mean;
    for (const auto& [gap, tokens] : gaps) mean.add(gap, tokens);
    w.tbt_count = mean.count();
    w.tbt_mean_ms = mean.value();
  }
  w.bin_medians = group_medians(bin_gaps);
  return w;
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
WindowEvents window_events_streamed(const RecordView& r, ns_t t1, const detail::Bins& bins,
                                    std::span<const double> tbt_qs) {
  auto in_window = [&](ns_t t) { return t != kNever && t >= bins.t0 && t <= t1; };
  WindowEvents w(r, bins);
  // Arrivals come in time order, so bins fill one after another: one bin's gaps at a time.
  std::vector<std::pair<double, std::int64_t>> bin_gaps;
  std::int64_t bin_now = -1, total = 0;
  auto flush_bin = [&] {
    if (bin_gaps.empty()) return;
    std::sort(bin_gaps.begin(), bin_gaps.end());
    w.bin_medians.push_back(detail::sorted_weighted_quantile(bin_gaps, 0, bin_gaps.size(), 0.5));
    bin_gaps.clear();
  };
  RankSelect select;
  WeightedMean mean;
  detail::stream_arrivals(r, 1, [&](std::int32_t request, ns_t t, std::int64_t tokens, double gap) {
    const std::int64_t bin = w.count(r, bins, t1, request, t, tokens, gap);
    if (bin < 0) return;
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
    detail::stream_arrivals(r, 1,
                            [&](std::int32_t request, ns_t t, std::int64_t tokens, double gap) {
                              if (in_window(t) && !std::isnan(gap) &&
                                  !failed_request(r, static_cast<std::size_t>(request)))
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

namespace {

// From the window's events: tokens, per-bin throughput, TBT and its interval, per-request
// decode speed.
void event_figures(CellFigures& f, WindowEvents& w, const detail::Bins& bins, double d_s) {
  f.output_tokens = w.output_tokens;
  f.total_tok_s = static_cast<double>(f.output_tokens) / d_s;
  f.bin_tok_s = bins.rates(w.bin_tokens);
  f.tbt_ms = w.tbt_ms;
  f.tbt_p90_ms = w.tbt_p90_ms;
  f.tbt_p99_ms = w.tbt_p99_ms;
  f.tbt_count = w.tbt_count;
  f.tbt_mean_ms = w.tbt_mean_ms;
  f.tbt_quantiles_ms = std::move(w.tbt_quantiles_ms);
  if (!std::isnan(f.tbt_ms)) f.per_request_tok_s = 1000.0 / f.tbt_ms;
  f.tbt_ms_ci = mean_interval_autocorrelated(w.bin_medians);
  std::vector<double> decode_rates;
  for (const Span& a : w.spans) {
    if (a.last_in == kNever || a.last_in <= a.first_in) continue;
    decode_rates.push_back(static_cast<double>(a.tokens_after) /
                           (static_cast<double>(a.last_in - a.first_in) * 1e-9));
  }
  f.decode_requests = static_cast<std::int64_t>(decode_rates.size());
  if (!decode_rates.empty()) f.decode_tok_s_per_request = percentile(decode_rates, 0.5);
  f.decode_tok_s_per_request_ci = detail::order_median_interval(decode_rates);
  f.per_request_tok_s_ci = detail::per_request_interval(f.tbt_ms_ci);
}

// Per window request: TTFT (sent in [ttft_from, t1]), the first wave's, in flight, outcomes
// and the slot time failures held silent.
void request_figures(CellFigures& f, const RecordView& r, const std::vector<Span>& spans, ns_t t0,
                     ns_t t1, ns_t ttft_from) {
  auto in_window = [&](ns_t t) { return t != kNever && t >= t0 && t <= t1; };
  std::vector<double> ttfts, first_wave;
  std::vector<char> slot_seen;
  double in_flight_ns = 0;
  const std::size_t n_req = std::min(r.sent_ns.size(), r.phase.size());
  for (std::size_t i = 0; i < n_req; ++i) {
    if (r.phase[i] != static_cast<std::uint8_t>(Phase::kWindow)) continue;
    const ns_t sent = r.sent_ns[i];
    const ns_t done = i < r.done_ns.size() ? r.done_ns[i] : kNever;
    const ns_t first = i < r.first_token_ns.size() ? r.first_token_ns[i] : kNever;
    const auto outcome =
        i < r.outcome.size() ? static_cast<Outcome>(r.outcome[i]) : Outcome::kPending;
    const ns_t to = done == kNever ? t1 : std::min(done, t1);
    if (sent != kNever) {
      const ns_t from = std::max(sent, t0);
      if (to > from) in_flight_ns += static_cast<double>(to - from);
    }
    const bool has_ttft = first != kNever && sent != kNever && first >= sent;
    if (in_window(sent)) ++f.started;
    if (sent != kNever && sent >= ttft_from && sent <= t1 && has_ttft)
      ttfts.push_back(static_cast<double>(first - sent) * 1e-6);
    if (i < r.slot.size() && r.slot[i] >= 0) {
      const auto s = static_cast<std::size_t>(r.slot[i]);
      if (s >= slot_seen.size()) slot_seen.resize(s + 1, 0);
      if (!slot_seen[s] && has_ttft) first_wave.push_back(static_cast<double>(first - sent) * 1e-6);
      slot_seen[s] = 1;
    }
    if (outcome == Outcome::kOk && in_window(done)) ++f.completed;
    if (outcome == Outcome::kError) {
      ++f.errors;
      // silence before the failure: from the last token (or the send) to the end
      const ns_t quiet = spans[i].last != kNever ? spans[i].last : sent;
      const ns_t from = std::max(quiet, t0);
      if (quiet != kNever && to > from) f.error_slot_s += static_cast<double>(to - from) * 1e-9;
    }
  }
  if (!first_wave.empty()) f.ttft_first_wave_ms = percentile(first_wave, 0.5);
  f.avg_active = in_flight_ns / static_cast<double>(t1 - t0);
  if (!ttfts.empty()) {
    f.ttft_ms = percentile(ttfts, 0.5);
    f.ttft_p90_ms = percentile(ttfts, 0.90);
    f.ttft_p99_ms = percentile(ttfts, 0.99);
  }
  f.ttft_ms_ci = detail::order_median_interval(ttfts);
}

// Drift: a least-squares line through per-bin throughput against bin centre, over the bins
// that start at or after steady_from_ns (the ramp while the first wave is admitted is not
// drift).
void drift_figures(CellFigures& f, const detail::Bins& bins, double bin_s, ns_t steady_from_ns) {
  std::vector<double> x, y;
  double edge = 0;
  const double steady_s =
      steady_from_ns > bins.t0 ? static_cast<double>(steady_from_ns - bins.t0) / 1e9 : 0.0;
  for (std::size_t k = 0; k < f.bin_tok_s.size(); ++k) {
    const double w = bins.width_s(static_cast<std::int64_t>(k));
    if (edge + 1e-9 >= steady_s) {
      x.push_back(edge + w / 2);
      y.push_back(f.bin_tok_s[k]);
    }
    edge += w;
  }
  const std::size_t n = y.size();
  if (n < 2) return;
  const double span_s = x.back() - x.front() + bin_s;
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / static_cast<double>(n);
  const double my = std::accumulate(y.begin(), y.end(), 0.0) / static_cast<double>(n);
  double sxx = 0, sxy = 0;
  for (std::size_t k = 0; k < n; ++k) {
    sxx += (x[k] - mx) * (x[k] - mx);
    sxy += (x[k] - mx) * (y[k] - my);
  }
  if (!(sxx > 0 && my > 0)) return;
  const double slope = sxy / sxx;
  f.drift = slope * span_s / my;
  if (n < 3) return;
  double ss_res = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const double fit = my + slope * (x[k] - mx);
    ss_res += (y[k] - fit) * (y[k] - fit);
  }
  const double se = std::sqrt(ss_res / static_cast<double>(n - 2) / sxx);
  const double half = t975(static_cast<std::int64_t>(n) - 2) * se;
  f.drifting = std::abs(f.drift) > 0.05 && std::abs(slope) > half;
}

}  // namespace

ns_t detail::bin_ns_of(double bin_s) {
  if (!(bin_s > 0)) bin_s = 1.0;
  return std::max<ns_t>(1'000'000, std::llround(bin_s * 1e9));
}

detail::Bins::Bins(ns_t t0_ns, ns_t t1_ns, ns_t bin_width_ns)
    : t0(t0_ns), span_ns(t1_ns - t0_ns), bin_ns(bin_width_ns) {
  n = std::max<std::int64_t>(1, span_ns / bin_ns);
}

double detail::Bins::width_s(std::int64_t k) const {
  const ns_t w = k < n - 1 ? bin_ns : span_ns - (n - 1) * bin_ns;
  return static_cast<double>(w) * 1e-9;
}

std::vector<double> detail::Bins::rates(const std::vector<std::int64_t>& tokens) const {
  std::vector<double> out(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k) {
    out[static_cast<std::size_t>(k)] =
        static_cast<double>(tokens[static_cast<std::size_t>(k)]) / width_s(k);
  }
  return out;
}

Interval detail::per_request_interval(const Interval& tbt_ci) {
  if (std::isnan(tbt_ci.lo)) return {kNaN, kNaN};
  return {1000.0 / tbt_ci.hi, tbt_ci.lo > 0 ? 1000.0 / tbt_ci.lo : kInf};
}

CellFigures summarize_cell(const RecordView& r, ns_t t0, ns_t t1, double bin_s, ns_t steady_from_ns,
                           ns_t ttft_from_ns, std::span<const double> tbt_qs) {
  CellFigures f = detail::empty_figures();
  if (t1 <= t0) return f;
  const double d_s = static_cast<double>(t1 - t0) * 1e-9;
  f.measured_s = d_s;
  if (!(bin_s > 0)) bin_s = 1.0;
  const detail::Bins bins(t0, t1, detail::bin_ns_of(bin_s));
  // Read straight from the event columns when they are in the transport's order (bounded
  // memory however many events, which may be spilled mappings); else from a sorted copy.
  WindowEvents w = detail::time_ordered(r) ? window_events_streamed(r, t1, bins, tbt_qs)
                                           : window_events_sorted(r, t1, bins, tbt_qs);
  event_figures(f, w, bins, d_s);
  request_figures(f, r, w.spans, t0, t1, ttft_from_ns == kNever ? t0 : ttft_from_ns);
  f.total_tok_s_ci = mean_interval_autocorrelated(f.bin_tok_s);
  f.precision = precision_of(f);
  drift_figures(f, bins, bin_s, steady_from_ns);
  return f;
}

}  // namespace speedmatrix
