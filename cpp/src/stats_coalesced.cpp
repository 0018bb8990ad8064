// coalesced_share (stats.hpp): read in passes over the event columns when they are in the
// transport's order, else from a sorted copy. Both give the same figure, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "speedmatrix/records.hpp"
#include "speedmatrix/stats.hpp"
#include "stats_detail.hpp"

namespace speedmatrix {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// An event came with another when it followed the previous event of its delivery much
// sooner than the stream's pace (a burst: read at once, or in pieces microseconds apart),
// not when the stream is simply that fast (one token a read, 0.2 ms apart). `median_pace`:
// the stream's median gap between deliveries spread over their events (NaN: one delivery).
bool burst(ns_t inner_ns, double median_pace) {
  const double inner = static_cast<double>(inner_ns);
  return std::isnan(median_pace) ? inner == 0.0 : inner < 0.25 * median_pace;
}

// The window's token events of window requests (the figure's sample), visited in record
// order: on_event(request, t_ns).
template <class OnEvent>
void window_events(const RecordView& r, ns_t t0, ns_t t1, OnEvent&& on_event) {
  const std::size_t n_req = std::min(r.sent_ns.size(), r.phase.size());
  const std::size_t n_ev = std::min({r.ev_request.size(), r.ev_t_ns.size(), r.ev_tokens.size()});
  for (std::size_t e = 0; e < n_ev; ++e) {
    const std::int32_t q = r.ev_request[e];
    if (q < 0 || static_cast<std::size_t>(q) >= n_req || r.ev_tokens[e] <= 0) continue;
    if (r.phase[static_cast<std::size_t>(q)] != static_cast<std::uint8_t>(Phase::kWindow)) continue;
    if (r.ev_t_ns[e] < t0 || r.ev_t_ns[e] > t1) continue;
    on_event(q, r.ev_t_ns[e]);
  }
}

// From a copy sorted by (request, t_ns): any event order; 16 bytes an event.
double coalesced_share_sorted(const RecordView& r, ns_t t0, ns_t t1) {
  std::vector<std::pair<std::int32_t, ns_t>> ev;  // (request, t_ns) of the window's events
  window_events(r, t0, t1, [&](std::int32_t q, ns_t t) { ev.emplace_back(q, t); });
  if (ev.empty()) return kNaN;
  std::sort(ev.begin(), ev.end());
  std::int64_t n_together = 0;
  std::vector<double> pace;  // one stream's gaps between deliveries, per event (ns)
  for (std::size_t i = 0; i < ev.size();) {
    std::size_t end = i;
    while (end < ev.size() && ev[end].first == ev[i].first) ++end;
    // The stream's deliveries (token_arrivals' grouping) and its own pace.
    std::vector<std::pair<std::size_t, std::size_t>> deliveries;
    for (std::size_t d = i; d < end;) {
      std::size_t k = d + 1;
      while (k < end && ev[k].second - ev[d].second < kDeliveryNs) ++k;
      deliveries.emplace_back(d, k);
      d = k;
    }
    pace.clear();
    for (std::size_t d = 1; d < deliveries.size(); ++d) {
      const auto [a, b] = deliveries[d];
      const double gap = static_cast<double>(ev[a].second - ev[deliveries[d - 1].first].second);
      pace.push_back(gap / static_cast<double>(b - a));
    }
    const double median_pace = pace.empty() ? kNaN : percentile(pace, 0.5);
    for (const auto& [a, b] : deliveries) {
      bool prev_counted = false;  // the event before e was counted already
      for (std::size_t e = a + 1; e < b; ++e) {
        const bool together = burst(ev[e].second - ev[e - 1].second, median_pace);
        if (together) n_together += prev_counted ? 1 : 2;  // both events of the pair
        prev_counted = together;
      }
    }
    i = end;
  }
  return static_cast<double>(n_together) / static_cast<double>(ev.size());
}

// One stream's open delivery while its events are read in time order.
struct Delivery {
  ns_t first = kNever;       // its first event
  ns_t prev_first = kNever;  // the first event of the delivery before it
  ns_t last = kNever;        // its latest event
  std::int64_t events = 0;
  bool prev_counted = false;  // its latest event was counted already
};

// The same figure from three passes over the event columns in record order (REQUIRES
// time_ordered(r)): each stream's window events, then its paces (held only while the
// stream has events still to come: freed at its last one), then the bursts against its
// median pace. Memory: O(requests) plus the paces of the streams open at one time.
double coalesced_share_streamed(const RecordView& r, ns_t t0, ns_t t1) {
  const std::size_t n_req = std::min(r.sent_ns.size(), r.phase.size());
  std::vector<std::int64_t> left(n_req, 0);  // window events still to come, per stream
  std::int64_t n_events = 0;
  window_events(r, t0, t1, [&](std::int32_t q, ns_t) {
    ++left[static_cast<std::size_t>(q)];
    ++n_events;
  });
  if (n_events == 0) return kNaN;
  std::vector<Delivery> open(n_req);
  std::vector<std::vector<double>> pace(n_req);
  std::vector<double> median_pace(n_req, kNaN);
  auto close = [&](std::size_t q) {
    Delivery& d = open[q];
    if (d.prev_first != kNever)
      pace[q].push_back(static_cast<double>(d.first - d.prev_first) /
                        static_cast<double>(d.events));
    d.prev_first = d.first;
  };
  window_events(r, t0, t1, [&](std::int32_t request, ns_t t) {
    const auto q = static_cast<std::size_t>(request);
    Delivery& d = open[q];
    if (d.first != kNever && t - d.first < kDeliveryNs) {
      ++d.events;
    } else {
      if (d.first != kNever) close(q);
      d.first = t;
      d.events = 1;
    }
    if (--left[q] > 0) return;
    close(q);  // the stream's last window event: its pace is whole
    if (!pace[q].empty()) median_pace[q] = percentile(std::move(pace[q]), 0.5);
    std::vector<double>().swap(pace[q]);
  });
  std::vector<std::vector<double>>().swap(pace);
  std::fill(open.begin(), open.end(), Delivery{});
  std::int64_t n_together = 0;
  window_events(r, t0, t1, [&](std::int32_t request, ns_t t) {
    const auto q = static_cast<std::size_t>(request);
    Delivery& d = open[q];
    if (d.first == kNever || t - d.first >= kDeliveryNs) {
      d.first = d.last = t;
      d.prev_counted = false;
      return;
    }
    const bool together = burst(t - d.last, median_pace[q]);
    if (together) n_together += d.prev_counted ? 1 : 2;  // both events of the pair
    d.prev_counted = together;
    d.last = t;
  });
  return static_cast<double>(n_together) / static_cast<double>(n_events);
}

}  // namespace

double coalesced_share(const RecordView& r, ns_t t0, ns_t t1) {
  return detail::time_ordered(r) ? coalesced_share_streamed(r, t0, t1)
                                 : coalesced_share_sorted(r, t0, t1);
}

}  // namespace speedmatrix
