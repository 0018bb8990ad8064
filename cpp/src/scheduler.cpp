#include "speedmatrix/scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace speedmatrix {
namespace {

// first x 2^(n - 1), at most `most` (n >= 1).
ns_t doubled(ns_t first, std::int32_t n, ns_t most) {
  ns_t v = std::max<ns_t>(first, 0);
  for (std::int32_t k = 1; k < n && v < most; ++k) v *= 2;
  return std::min(v, most);
}

bool is_connect_failure(const RequestRecord& r) {
  return r.outcome == Outcome::kError &&
         (r.error_kind == "connect" || r.error_kind == "connect_timeout");
}

}  // namespace

ns_t stall_limit_ns(const StreamSilence& s, double median_gap_ms, ns_t stall_min_ns,
                    double gap_factor) {
  if (stall_min_ns <= 0) return kNoDeadline;
  double limit_ns = static_cast<double>(stall_min_ns);
  if (!std::isnan(median_gap_ms) && gap_factor > 0)
    limit_ns = std::max(limit_ns, gap_factor * median_gap_ms * 1e6);
  const double own_ns = s.gap_ns > 0
                            ? std::max(gap_factor, 0.0) * static_cast<double>(s.gap_ns)
                            : 2.0 * static_cast<double>(std::max<ns_t>(s.first_wait_ns, 0));
  limit_ns = std::max(limit_ns, own_ns);
  return limit_ns >= static_cast<double>(kNoDeadline) ? kNoDeadline : static_cast<ns_t>(limit_ns);
}

bool is_stalled(const StreamSilence& s, double median_gap_ms, ns_t stall_min_ns,
                double gap_factor) {
  return stall_min_ns > 0 &&
         s.silent_ns > stall_limit_ns(s, median_gap_ms, stall_min_ns, gap_factor);
}

std::vector<bool> stalled_streams(const std::vector<StreamSilence>& streams, std::size_t in_flight,
                                  double median_gap_ms, ns_t stall_min_ns, double gap_factor,
                                  ns_t pause_cap_ns) {
  std::vector<bool> out(streams.size());
  bool any_alive = false;
  ns_t longest_ns = 0;
  for (std::size_t i = 0; i < streams.size(); ++i) {
    out[i] = is_stalled(streams[i], median_gap_ms, stall_min_ns, gap_factor);
    any_alive = any_alive || !out[i];
    longest_ns = std::max(longest_ns, streams[i].silent_ns);
  }
  if (!any_alive && in_flight > 1 && longest_ns <= pause_cap_ns) out.assign(streams.size(), false);
  return out;
}

ns_t steady_window_open(const std::vector<ns_t>& first_token_ns, ns_t ramp_start_ns, ns_t now_ns,
                        ns_t settle_ns, ns_t cap_ns, bool* capped) {
  if (capped) *capped = false;
  std::vector<ns_t> t;
  t.reserve(first_token_ns.size());
  for (ns_t x : first_token_ns)
    if (x != kNever) t.push_back(std::max(x, ramp_start_ns));
  std::sort(t.begin(), t.end());
  if (!t.empty() && t.size() == first_token_ns.size()) return t.back();  // every slot streams
  if (!t.empty()) {
    // A plateau: no slot started streaming for longer than the settle time
    // and twice the longest wait between two slots' first tokens so far (a
    // server that admits slowly is not mistaken for one that stopped admitting).
    ns_t longest = t.front() - ramp_start_ns;
    for (std::size_t k = 1; k < t.size(); ++k) longest = std::max(longest, t[k] - t[k - 1]);
    if (now_ns - t.back() >= std::max(settle_ns, 2 * longest)) return t.back();
  }
  if (cap_ns > 0 && now_ns - ramp_start_ns >= cap_ns) {
    if (capped) *capped = true;
    return ramp_start_ns + cap_ns;
  }
  return kNever;
}

ns_t Backoff::on_finished(const RequestRecord& r, ns_t retry_after_ns) {
  if (r.outcome == Outcome::kOk) rate_limited_ = failed_ = 0;
  if (is_connect_failure(r)) {
    if (connect_failures_++ == 0) {
      connect_first_ns_ = r.sent_ns != kNever ? r.sent_ns : r.done_ns;
      all_refused_ = true;
    }
    if (r.error_kind != "connect") all_refused_ = false;
    connect_last_error_ = r.error_message;
    return doubled(p_.connect_first_ns, connect_failures_, p_.connect_max_ns);
  }
  if (r.outcome == Outcome::kCancelled && r.first_byte_ns == kNever) return 0;  // says nothing
  connect_failures_ = 0;  // any other ending: a connection was made
  if (r.outcome != Outcome::kError) return 0;
  const bool told = retry_after_ns != kNever;
  if (r.error_kind == "http_429") {
    ++rate_limited_;
    if (told) return std::clamp<ns_t>(retry_after_ns, 0, p_.retry_after_max_ns);
    return doubled(p_.rate_limit_first_ns, rate_limited_, p_.rate_limit_max_ns);
  }
  if (r.error_kind == "http_503" && told)
    return std::clamp<ns_t>(retry_after_ns, 0, p_.retry_after_max_ns);
  if (r.error_kind == kStallKind) return 0;  // the client's own cut: refilled at once
  return doubled(p_.error_first_ns, ++failed_, p_.error_max_ns);
}

bool Backoff::give_up(ns_t now) const {
  return p_.give_up_ns > 0 && connect_failures_ >= std::max<std::int32_t>(p_.give_up_failures, 1) &&
         connect_first_ns_ != kNever && now - connect_first_ns_ >= p_.give_up_ns;
}

std::string Backoff::give_up_reason(ns_t now) const {
  char over[32];
  std::snprintf(over, sizeof over, "%.1f", static_cast<double>(now - connect_first_ns_) / 1e9);
  std::string why = std::string("the server ") + (all_refused_ ? "refused " : "did not accept ") +
                    std::to_string(connect_failures_) + " connections in a row over " + over + " s";
  if (!connect_last_error_.empty()) why += " (" + connect_last_error_ + ")";
  return why;
}

}  // namespace speedmatrix
