#include "speedmatrix/scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <queue>
#include <unordered_map>
#include <utility>

#include "loop_book.hpp"
#include "speedmatrix/cell.hpp"
#include "warmup.hpp"

namespace speedmatrix {
namespace {

struct Refill {
  ns_t due_ns;
  std::int32_t slot;
  ns_t since_ns;  // the failed request's end: a backoff's wait runs from there
  bool backoff;   // imposed by the BackoffPolicy (counted in backoffs / backoff_ns)
  bool operator>(const Refill& o) const { return due_ns > o.due_ns; }
};

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

// Running median of the gaps between a window request's token arrivals (ns
// per token, weighted by tokens), in log buckets of 2^(1/16) (~4.4%): O(1)
// per event, good enough for a threshold 25 times larger.
class GapHistogram {
 public:
  void add(ns_t gap_ns, std::int64_t tokens) {
    if (gap_ns <= 0 || tokens <= 0) return;
    const double per = static_cast<double>(gap_ns) / static_cast<double>(tokens) / 1e3;  // us
    const auto b = static_cast<std::int64_t>(std::floor(16 * std::log2(std::max(per, 1.0))));
    counts_[static_cast<std::size_t>(std::clamp<std::int64_t>(b, 0, kBuckets - 1))] += tokens;
    total_ += tokens;
  }
  double median_ms() const {
    if (total_ == 0) return std::nan("");
    std::int64_t cum = 0;
    for (std::size_t b = 0; b < kBuckets; ++b) {
      cum += counts_[b];
      if (2 * cum >= total_) return std::exp2((static_cast<double>(b) + 0.5) / 16) / 1e3;
    }
    return std::nan("");
  }

 private:
  static constexpr std::size_t kBuckets = 560;  // up to ~35 minutes per token
  std::int64_t counts_[kBuckets] = {};
  std::int64_t total_ = 0;
};

const char* kStallKind = "stall";

// What the stall rule knows of one streaming request from its token events.
struct TokenPace {
  ns_t first_ns, last_ns;
  std::int64_t later_tokens;  // tokens after the first event's
  StreamSilence silence(ns_t now, ns_t sent_ns) const {
    StreamSilence s;
    s.silent_ns = now - last_ns;
    if (later_tokens > 0) s.gap_ns = (last_ns - first_ns) / later_tokens;
    if (sent_ns != kNever) s.first_wait_ns = first_ns - sent_ns;
    return s;
  }
};

std::string ms_text(double ms) {
  if (std::isnan(ms)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", ms);
  return buf;
}

// "no token for 2100 ms (stall limit 2000 ms: max(2000 ms, 25 x median gap 10.0 ms, own
// pace 25 x 10.0 ms))"
std::string stall_message(const StreamSilence& s, double median_ms, const ClosedLoopPlan& plan) {
  const ns_t limit = stall_limit_ns(s, median_ms, plan.stall_min_ns, plan.stall_gap_factor);
  char factor[32];
  std::snprintf(factor, sizeof factor, "%g", plan.stall_gap_factor);
  const std::string own =
      s.gap_ns > 0
          ? std::string(factor) + " x " + ms_text(static_cast<double>(s.gap_ns) / 1e6)
          : "2 x first token's wait " + ms_text(static_cast<double>(s.first_wait_ns) / 1e6);
  return "no token for " + std::to_string(s.silent_ns / 1'000'000) + " ms (stall limit " +
         std::to_string(limit / 1'000'000) + " ms: max(" +
         std::to_string(plan.stall_min_ns / 1'000'000) + " ms, " + factor + " x median gap " +
         ms_text(median_ms) + ", own pace " + own + "))";
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

ScheduleTimes run_closed_loop(const ClosedLoopPlan& plan, Transport& transport, Clock& clock,
                              CellRecords& records, const std::atomic<bool>& stop,
                              CellProgress* progress) {
  ScheduleTimes times;
  times.stall_median_gap_ms = std::nan("");
  LoopBook loop(transport, records, stop, progress);

  Backoff backoff(plan.backoff);
  bool gave_up = false;
  // Every finished request feeds the backoff; returns the wait it asks of the slot.
  auto backoff_after = [&](std::int32_t id) {
    return backoff.on_finished(records.requests[static_cast<std::size_t>(id)],
                               records.retry_after(id));
  };

  // Warm-up (warmup.hpp): everything at once, then wait for all (or the
  // timeout); what failed or timed out is sent again, up to warmup_retries times.
  if (!run_warmup(plan.warmup_bodies, plan.warmup_timeout_ns, plan.warmup_retries, loop, clock,
                  records, progress, times, [&](std::int32_t id) { backoff_after(id); })) {
    times.stopped = true;
    times.stopped_by = StopReason::kStop;
    times.end_ns = clock.now();
    return times;
  }

  // Window: N slots, each refilled with its own body as soon as it finishes.
  const auto n = static_cast<std::size_t>(std::max<std::int32_t>(plan.concurrency, 1));
  std::vector<std::int32_t> slot_request(n, -1);
  std::priority_queue<Refill, std::vector<Refill>, std::greater<>> refills;
  std::int64_t started = 0;
  auto may_start = [&] { return plan.max_requests <= 0 || started < plan.max_requests; };
  auto launch_slot = [&](std::size_t slot, ns_t scheduled) {
    const std::size_t b = slot % plan.bodies.size();
    slot_request[slot] = loop.launch(static_cast<std::int32_t>(slot), static_cast<std::int32_t>(b),
                                     plan.bodies[b], Phase::kWindow, scheduled);
    ++started;
  };

  // The ramp's start is read once, before the first hand-over: requests are
  // timed from when they were sent, not from when the last of N was queued.
  const ns_t ramp_start = clock.now();
  times.ramp_start_ns = ramp_start;
  const bool steady = plan.steady_window && plan.max_requests <= 0;
  ns_t t0 = kNever;
  // The slot time of an imposed wait [since, until) that lies inside the window
  // [t0, window end]: a wait that began in the ramp (a first wave answered 429 before
  // the window opened) counts from t0 only.
  auto window_wait_ns = [&](ns_t since, ns_t until) -> ns_t {
    if (t0 == kNever) return 0;
    const ns_t from = std::max(since, t0);
    return until > from ? until - from : 0;
  };
  ns_t end_at = kNoDeadline;
  ns_t next_check = kNoDeadline;
  auto open_window = [&](ns_t at) {
    t0 = at;
    times.window_start_ns = t0;
    end_at = plan.duration_ns > 0 ? t0 + plan.duration_ns : kNoDeadline;
    if (plan.should_end) next_check = t0 + std::max<ns_t>(plan.min_duration_ns, 0);
    if (progress) {
      // the live figure counts window tokens only: the ramp's are dropped (a
      // t0 in the past keeps the tokens that arrived since)
      std::int64_t since = 0;
      records.events.for_each(0, records.events.size(),
                              [&](std::size_t, std::int32_t req, ns_t t, std::int32_t tokens) {
                                const auto q = static_cast<std::size_t>(req);
                                if (t >= t0 && q < records.requests.size() &&
                                    std::as_const(records.requests)[q].phase == Phase::kWindow)
                                  since += tokens;
                              });
      progress->tokens.store(since, std::memory_order_relaxed);
      progress->window_start_ns.store(t0, std::memory_order_relaxed);
    }
  };
  if (!steady) open_window(ramp_start);
  std::vector<ns_t> slot_first_token(n, kNever);  // the ramp: first token per slot
  std::int64_t ramp_failures = 0;  // window requests that failed before any slot streamed
  auto note_streamed = [&](const RequestRecord& rec) {
    const auto slot = static_cast<std::size_t>(rec.slot);
    if (rec.phase == Phase::kWindow && rec.first_token_ns != kNever &&
        slot_first_token[slot] == kNever)
      slot_first_token[slot] = rec.first_token_ns;
  };
  for (std::size_t k = 0; k < n && may_start(); ++k) launch_slot(k, ramp_start);

  // Token events of window requests feed the stall rule: each request's last
  // token and the cell's running median gap.
  const bool stalls_on = plan.stall_min_ns > 0;
  // by request id, for the requests in flight at the last scan (so it does not grow with
  // the window: finished ones are dropped once their events have been scanned)
  std::unordered_map<std::int32_t, TokenPace> last_token;
  std::size_t events_seen = 0;
  GapHistogram gaps;
  auto scan_events = [&] {
    const std::size_t m = records.events.size();
    // Events already spilled to disk (records.hpp) are read back in blocks: a tick's worth.
    records.events.for_each(events_seen, m,
                            [&](std::size_t, std::int32_t req, ns_t t, std::int32_t tokens) {
                              const auto q = static_cast<std::size_t>(req);
                              // const: an event of a request finished and spilled since the last
                              // tick is read back
                              if (q >= records.requests.size() ||
                                  std::as_const(records.requests)[q].phase != Phase::kWindow)
                                return;
                              auto [it, fresh] = last_token.try_emplace(req, TokenPace{t, t, 0});
                              if (!fresh && t > it->second.last_ns) {
                                gaps.add(t - it->second.last_ns, tokens);
                                it->second.last_ns = t;
                                it->second.later_tokens += tokens;
                              }
                            });
    events_seen = m;
    // Every event of a request no slot holds has now been seen: it gets no more.
    std::erase_if(last_token, [&](const auto& e) {
      const auto slot = static_cast<std::size_t>(
          std::as_const(records.requests)[static_cast<std::size_t>(e.first)].slot);
      return slot >= n || slot_request[slot] != e.first;
    });
  };
  ns_t next_tick = ramp_start + plan.tick_ns;

  ns_t last_done = ramp_start;
  ns_t gave_up_at = kNever;
  for (;;) {
    if (loop.stop_requested()) {
      times.stopped = true;
      times.stopped_by = StopReason::kStop;
      break;
    }
    ns_t now = clock.now();
    records.requests.spill_finished(now - kRequestSpillLag_ns);
    if (t0 == kNever) {
      for (std::size_t k = 0; k < n; ++k) {
        if (slot_request[k] >= 0)
          note_streamed(records.requests[static_cast<std::size_t>(slot_request[k])]);
      }
      bool capped = false;
      ns_t at = steady_window_open(slot_first_token, ramp_start, now, plan.plateau_settle_ns,
                                   plan.ramp_cap_ns, &capped);
      // Nothing streams and a whole wave failed: no steady state is coming, and
      // the window (which records the failures) should not wait for the cap.
      if (at == kNever && ramp_failures >= static_cast<std::int64_t>(n) &&
          std::none_of(slot_first_token.begin(), slot_first_token.end(),
                       [](ns_t t) { return t != kNever; }))
        at = now;
      if (at != kNever) {
        times.ramp_capped = capped;
        open_window(at);
      }
    }
    if (now >= end_at) {
      times.stopped_by = StopReason::kDuration;
      break;
    }
    if (t0 != kNever && now >= next_check) {
      if (plan.should_end(t0, now)) {
        times.stopped_by = StopReason::kPrecision;
        end_at = now;
        break;
      }
      // The check reads every window event, so it costs more as the window grows (a second
      // at ~400 s of 25K events/s): asked no sooner than 4x its own cost after it ends, it
      // takes at most a fifth of the loop's time, whatever the window.
      const ns_t checked = clock.now();
      next_check = checked + std::max<ns_t>({plan.check_interval_ns - (checked - now),
                                             4 * (checked - now), 1'000'000});
    }
    if (stalls_on && now >= next_tick) {
      scan_events();
      const double median_ms = gaps.median_ms();
      std::vector<std::size_t> streaming;  // slots whose request has had a token
      std::vector<StreamSilence> silences;
      std::size_t in_flight = 0;
      for (std::size_t k = 0; k < n; ++k) {
        const std::int32_t id = slot_request[k];
        if (id >= 0) ++in_flight;
        const auto seen = id >= 0 ? last_token.find(id) : last_token.end();
        if (seen == last_token.end()) continue;
        streaming.push_back(k);
        silences.push_back(
            seen->second.silence(now, records.requests[static_cast<std::size_t>(id)].sent_ns));
      }
      const std::vector<bool> cut =
          stalled_streams(silences, in_flight, median_ms, plan.stall_min_ns, plan.stall_gap_factor,
                          plan.stall_pause_cap_ns);
      for (std::size_t s = 0; s < streaming.size(); ++s) {
        if (!cut[s]) continue;
        const std::size_t k = streaming[s];
        const std::int32_t id = slot_request[k];
        loop.cancel(id);
        RequestRecord& rec = records.requests[static_cast<std::size_t>(id)];
        rec.outcome = Outcome::kError;
        rec.error_kind = kStallKind;
        rec.error_message = stall_message(silences[s], median_ms, plan);
        if (progress) progress->errors.fetch_add(1, std::memory_order_relaxed);
        ++times.stalls;
        backoff_after(id);
        slot_request[k] = -1;
        last_done = std::max(last_done, now);
        if (may_start()) launch_slot(k, now);
      }
    }
    if (now >= next_tick) next_tick = now + std::max<ns_t>(plan.tick_ns, 1'000'000);
    while (!refills.empty() && refills.top().due_ns <= now) {
      const Refill r = refills.top();
      refills.pop();
      if (r.backoff) times.backoff_ns += window_wait_ns(r.since_ns, r.due_ns);
      if (may_start()) launch_slot(static_cast<std::size_t>(r.slot), r.due_ns);
    }
    if (loop.in_flight() == 0 && (refills.empty() || !may_start())) {  // request budget spent
      times.stopped_by = StopReason::kRequests;
      break;
    }
    ns_t deadline = std::min(end_at, next_check);
    if (!refills.empty()) deadline = std::min(deadline, refills.top().due_ns);
    if (t0 == kNever || stalls_on) deadline = std::min(deadline, next_tick);
    for (std::int32_t id : loop.poll(deadline)) {
      const ns_t wait = backoff_after(id);
      const RequestRecord& rec = records.requests[static_cast<std::size_t>(id)];
      if (rec.phase != Phase::kWindow) continue;
      const auto slot = static_cast<std::size_t>(rec.slot);
      if (t0 == kNever) {
        note_streamed(rec);
        if (rec.outcome == Outcome::kError) ++ramp_failures;
      }
      slot_request[slot] = -1;
      now = clock.now();
      const ns_t finished_at = rec.done_ns != kNever ? rec.done_ns : now;
      last_done = std::max(last_done, finished_at);
      if (!gave_up && backoff.give_up(finished_at)) {
        gave_up = true;
        times.stop_reason = backoff.give_up_reason(finished_at);
      }
      if (gave_up || !may_start() || now >= end_at || loop.stop_requested()) continue;
      // A failed request's slot waits at least error_backoff_ns from its send,
      // and what the BackoffPolicy asks from its end (a 429, a refused connection).
      ns_t due = finished_at;
      if (rec.outcome == Outcome::kError && rec.sent_ns != kNever)
        due = std::max(due, rec.sent_ns + plan.error_backoff_ns);
      const bool imposed = wait > 0 && finished_at + wait > due;
      if (imposed) {
        due = finished_at + wait;
        ++times.backoffs;
      }
      if (due > now) {
        refills.push({due, rec.slot, finished_at, imposed});
      } else {
        if (imposed) times.backoff_ns += window_wait_ns(finished_at, due);
        launch_slot(slot, finished_at);
      }
    }
    if (gave_up) {
      times.stopped_by = StopReason::kUnreachable;
      gave_up_at = clock.now();
      break;
    }
  }

  if (t0 == kNever) open_window(ramp_start);  // stopped or spent during the ramp
  if (times.stopped) {
    times.window_end_ns = clock.now();
  } else if (times.stopped_by == StopReason::kUnreachable) {
    times.window_end_ns = std::max(gave_up_at, t0);
  } else if (times.stopped_by == StopReason::kDuration ||
             times.stopped_by == StopReason::kPrecision) {
    times.window_end_ns = end_at;
  } else {
    times.window_end_ns = last_done;
  }
  // Backoffs still waiting at the end count up to the window's end.
  for (; !refills.empty(); refills.pop()) {
    const Refill& r = refills.top();
    if (r.backoff)
      times.backoff_ns += window_wait_ns(r.since_ns, std::min(r.due_ns, times.window_end_ns));
  }
  for (std::int32_t id : slot_request) {
    if (id >= 0) loop.cancel(id);
  }
  if (stalls_on) times.stall_median_gap_ms = gaps.median_ms();
  times.end_ns = clock.now();
  return times;
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
