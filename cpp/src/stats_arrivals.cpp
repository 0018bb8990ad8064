// Token arrivals (stats.hpp): token_arrivals, request_tokens and the usage scaling they share.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "speedmatrix/records.hpp"
#include "speedmatrix/stats.hpp"
#include "stats_detail.hpp"

namespace speedmatrix {

using detail::kNaN;

detail::UsageScale::UsageScale(const RecordView& r, std::size_t n_ev)
    : r_(r), n_req_(std::min(r.output_tokens.size(), r.token_source.size())) {
  chunk_sum_.assign(n_req_, 0);
  seen_.assign(n_req_, 0);
  for (std::size_t e = 0; n_req_ > 0 && e < n_ev; ++e) {
    const auto q = static_cast<std::size_t>(r.ev_request[e]);
    if (q < n_req_ && r.ev_tokens[e] > 0) chunk_sum_[q] += r.ev_tokens[e];
  }
}

std::int32_t detail::UsageScale::operator()(std::size_t e) {
  const std::int32_t tok = r_.ev_tokens[e];
  const auto q = static_cast<std::size_t>(r_.ev_request[e]);
  if (q >= n_req_ || tok <= 0 || chunk_sum_[q] <= 0) return tok;
  if (!scaled_to_usage(static_cast<TokenSource>(r_.token_source[q]))) return tok;
  const std::int64_t total = r_.output_tokens[q];
  if (total <= 0 || total == chunk_sum_[q]) return tok;
  const double scale = static_cast<double>(total) / static_cast<double>(chunk_sum_[q]);
  const auto before = std::llround(static_cast<double>(seen_[q]) * scale);
  seen_[q] += tok;
  const auto after = std::llround(static_cast<double>(seen_[q]) * scale);
  return static_cast<std::int32_t>(after - before);
}

std::vector<Arrival> token_arrivals(const RecordView& r, int phase) {
  const std::size_t n_req = r.sent_ns.size();
  const std::size_t n_ev = std::min({r.ev_request.size(), r.ev_t_ns.size(), r.ev_tokens.size()});
  std::vector<std::int32_t> ev_tokens(n_ev);
  detail::UsageScale scaled(r, n_ev);
  for (std::size_t e = 0; e < n_ev; ++e) ev_tokens[e] = scaled(e);
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

bool detail::time_ordered(const RecordView& r) {
  const std::size_t n = std::min({r.ev_request.size(), r.ev_t_ns.size(), r.ev_tokens.size()});
  for (std::size_t e = 1; e < n; ++e) {
    if (r.ev_t_ns[e] < r.ev_t_ns[e - 1]) return false;
  }
  return true;
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
    detail::stream_arrivals(r, -1, add);
  } else {
    for (const Arrival& a : token_arrivals(r, -1)) add(a.request, a.t_ns, a.tokens, a.gap_ms);
  }
  return out;
}

}  // namespace speedmatrix
