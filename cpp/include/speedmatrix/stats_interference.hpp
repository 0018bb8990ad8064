// The prefill-interference figures: N streams decode while long prompts arrive;
// how much do the prompts' prefills stretch the decoders' time between tokens?
// Pure (no I/O, no clock): derived once from the core's per-token arrivals.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "speedmatrix/clock.hpp"

namespace speedmatrix {

// A prefill's window: the interfering prompt's send time to its first token.
struct PrefillWindow {
  ns_t start_ns = 0;
  ns_t end_ns = 0;
};

struct InterferenceFigures {
  std::int64_t overlap_gaps = 0;    // gaps (t[i-1], t[i]] that intersect a prefill window
  std::int64_t clear_gaps = 0;      // gaps that intersect none
  double p99_tbt_overlap_ms = 0;    // NaN when overlap_gaps == 0
  double p99_tbt_clear_ms = 0;      // NaN when clear_gaps == 0
  double tbt_inflation = 0;         // p99_tbt_overlap_ms / p99_tbt_clear_ms; NaN when either is
                                    // NaN or the clear p99 is 0
  std::int64_t gaps_over_long = 0;  // gaps longer than long_gap_ns, overlapping or not
};

// `streams`: each decoding stream's token arrival times (ns, non-decreasing);
// a stream with k arrivals has k - 1 gaps. `prefills`: the interfering
// prompts' windows, in any order (end < start is read as empty). A gap
// (a, b] overlaps a window [s, e] when a < e and s < b. Percentiles by linear
// interpolation (stats.hpp's percentile).
InterferenceFigures interference_figures(std::span<const std::vector<ns_t>> streams,
                                         std::span<const PrefillWindow> prefills,
                                         ns_t long_gap_ns = 100'000'000);

}  // namespace speedmatrix
