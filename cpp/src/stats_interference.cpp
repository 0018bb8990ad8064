#include "speedmatrix/stats_interference.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>

#include "speedmatrix/stats.hpp"

namespace speedmatrix {
namespace {

// Windows sorted by start and merged where they touch, so one search answers "overlaps any".
std::vector<PrefillWindow> merged(std::span<const PrefillWindow> prefills) {
  std::vector<PrefillWindow> w;
  for (const PrefillWindow& p : prefills)
    if (p.end_ns >= p.start_ns) w.push_back(p);
  std::sort(w.begin(), w.end(),
            [](const PrefillWindow& a, const PrefillWindow& b) { return a.start_ns < b.start_ns; });
  std::vector<PrefillWindow> out;
  for (const PrefillWindow& p : w) {
    if (!out.empty() && p.start_ns <= out.back().end_ns)
      out.back().end_ns = std::max(out.back().end_ns, p.end_ns);
    else
      out.push_back(p);
  }
  return out;
}

bool overlaps(const std::vector<PrefillWindow>& windows, ns_t a, ns_t b) {
  // The first window that ends after a; it overlaps (a, b] when it starts before b.
  auto it = std::upper_bound(windows.begin(), windows.end(), a,
                             [](ns_t t, const PrefillWindow& w) { return t < w.end_ns; });
  return it != windows.end() && it->start_ns < b;
}

}  // namespace

InterferenceFigures interference_figures(std::span<const std::vector<ns_t>> streams,
                                         std::span<const PrefillWindow> prefills,
                                         ns_t long_gap_ns) {
  const std::vector<PrefillWindow> windows = merged(prefills);
  std::vector<double> overlap_ms, clear_ms;
  InterferenceFigures f;
  for (const std::vector<ns_t>& t : streams) {
    for (std::size_t i = 1; i < t.size(); ++i) {
      const ns_t gap_ns = t[i] - t[i - 1];
      if (gap_ns > long_gap_ns) ++f.gaps_over_long;
      (overlaps(windows, t[i - 1], t[i]) ? overlap_ms : clear_ms)
          .push_back(static_cast<double>(gap_ns) / 1e6);
    }
  }
  f.overlap_gaps = static_cast<std::int64_t>(overlap_ms.size());
  f.clear_gaps = static_cast<std::int64_t>(clear_ms.size());
  f.p99_tbt_overlap_ms = percentile(std::move(overlap_ms), 0.99);
  f.p99_tbt_clear_ms = percentile(std::move(clear_ms), 0.99);
  const bool defined = std::isfinite(f.p99_tbt_overlap_ms) && std::isfinite(f.p99_tbt_clear_ms) &&
                       f.p99_tbt_clear_ms > 0;
  f.tbt_inflation = defined ? f.p99_tbt_overlap_ms / f.p99_tbt_clear_ms
                            : std::numeric_limits<double>::quiet_NaN();
  return f;
}

}  // namespace speedmatrix
