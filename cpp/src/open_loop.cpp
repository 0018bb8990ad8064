#include "speedmatrix/open_loop.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <utility>

#include "loop_book.hpp"
#include "speedmatrix/cell.hpp"
#include "warmup.hpp"

namespace speedmatrix {
namespace {

ns_t s_to_ns(double s) {
  if (!(s > 0)) return 0;
  if (s > 1e9) return std::numeric_limits<ns_t>::max() / 4;
  return static_cast<ns_t>(s * 1e9);
}

}  // namespace

ScheduleTimes run_open_loop(const OpenLoopPlan& plan, Pacer& pacer, Transport& transport,
                            Clock& clock, CellRecords& records, const std::atomic<bool>& stop,
                            CellProgress* progress) {
  ScheduleTimes times;
  LoopBook loop(transport, records, stop, progress);
  auto stopped = [&] { return loop.stop_requested(); };
  // Failed connections are only counted here (the schedule is kept, no slot
  // waits): a server gone for give_up_ns ends the cell as in the closed loop.
  Backoff backoff(plan.backoff);
  auto feed = [&](std::int32_t id) {
    backoff.on_finished(records.requests[static_cast<std::size_t>(id)], records.retry_after(id));
  };

  // Warm-up (warmup.hpp), as the closed loop does, so both modes start from
  // the same server state.
  if (!run_warmup(plan.warmup_bodies, plan.warmup_timeout_ns, plan.warmup_retries, loop, clock,
                  records, progress, times, feed)) {
    loop.cancel_all();
    times.stopped = true;
    times.stopped_by = StopReason::kStop;
    times.end_ns = clock.now();
    return times;
  }

  const ns_t t0 = clock.now();
  times.window_start_ns = t0;
  if (progress) progress->window_start_ns.store(t0, std::memory_order_relaxed);
  const ns_t window_end = t0 + plan.duration_ns;
  const ns_t drain_end = window_end + std::max<ns_t>(plan.drain_timeout_ns, 0);
  const std::size_t nb = plan.bodies.size();
  const bool gated = plan.max_concurrency > 0;

  std::int64_t k = 0;  // next arrival
  ns_t next_due = kNever;
  auto advance = [&] {
    const ns_t off = pacer.due_ns(k);
    next_due = (off == kNever || t0 + off >= window_end) ? kNever : t0 + off;
  };
  advance();
  std::deque<std::int32_t> gate;  // due, not yet sent (FIFO)
  auto send = [&](std::int32_t id) {
    const RequestRecord& r = records.requests[static_cast<std::size_t>(id)];
    loop.start(id, plan.bodies[static_cast<std::size_t>(r.body)]);
  };
  auto open_gate = [&] {
    while (!gate.empty() && (!gated || loop.in_flight() < plan.max_concurrency)) {
      const std::int32_t id = gate.front();
      gate.pop_front();
      send(id);
    }
  };

  for (;;) {
    if (stopped()) {
      times.stopped = true;
      times.stopped_by = StopReason::kStop;
      break;
    }
    const ns_t now = clock.now();
    records.requests.spill_finished(now - kRequestSpillLag_ns);
    // Every arrival already due goes out now, in order: a late loop sends a
    // burst rather than skipping any (the schedule is the user population).
    while (next_due != kNever && next_due <= now) {
      const auto slot = static_cast<std::int32_t>(k);
      const auto body = static_cast<std::int32_t>(static_cast<std::size_t>(k) % nb);
      gate.push_back(loop.add(slot, body, Phase::kWindow, next_due));
      ++k;
      advance();
    }
    open_gate();
    if (next_due == kNever && gate.empty() && loop.in_flight() == 0) break;  // all done
    if (now >= drain_end) break;
    const ns_t deadline = next_due != kNever ? std::min(next_due, drain_end) : drain_end;
    for (std::int32_t id : loop.poll(deadline)) {
      feed(id);
      ns_t done = records.requests[static_cast<std::size_t>(id)].done_ns;
      if (done == kNever) done = clock.now();
      if (times.stopped_by != StopReason::kUnreachable && backoff.give_up(done)) {
        times.stopped_by = StopReason::kUnreachable;
        times.stop_reason = backoff.give_up_reason(done);
      }
    }
    if (times.stopped_by == StopReason::kUnreachable) break;
  }

  times.window_end_ns = times.stopped || times.stopped_by == StopReason::kUnreachable
                            ? std::min(clock.now(), window_end)
                            : window_end;
  loop.cancel_all();
  const ns_t end = clock.now();
  for (std::int32_t id : gate) {  // never sent: the drain bound (or a stop) came first
    RequestRecord& r = records.requests[static_cast<std::size_t>(id)];
    r.outcome = Outcome::kCancelled;
    r.done_ns = end;
  }
  times.end_ns = end;
  return times;
}

std::string check_open_loop(const CellSpec& spec) {
  if (spec.mode != "open") return "mode '" + spec.mode + "' is not closed or open";
  if (!(spec.duration_s > 0)) return "an open-loop cell needs duration_s > 0";
  if (spec.max_concurrency < 0) return "max_concurrency must be >= 0";
  if (spec.drain_timeout_s < 0) return "drain_timeout_s must be >= 0";
  std::string why;
  if (!make_pacer(spec.arrival, spec.rate_per_s, spec.gamma_shape, spec.seed, &why)) return why;
  return "";
}

ScheduleTimes run_open_loop_cell(const CellSpec& spec, Transport& transport, Clock& clock,
                                 CellRecords& records, const std::atomic<bool>& stop,
                                 CellProgress* progress) {
  OpenLoopPlan plan;
  plan.warmup_bodies.assign(spec.warmup_bodies.begin(), spec.warmup_bodies.end());
  plan.warmup_timeout_ns = s_to_ns(spec.warmup_timeout_s);
  plan.bodies.assign(spec.bodies.begin(), spec.bodies.end());
  plan.duration_ns = s_to_ns(spec.duration_s);
  plan.max_concurrency = spec.max_concurrency;
  plan.drain_timeout_ns = s_to_ns(spec.drain_timeout_s);
  plan.backoff.give_up_ns = s_to_ns(spec.unreachable_after_s);
  std::string why;
  std::unique_ptr<Pacer> pacer =
      make_pacer(spec.arrival, spec.rate_per_s, spec.gamma_shape, spec.seed, &why);
  return run_open_loop(plan, *pacer, transport, clock, records, stop, progress);
}

std::int64_t open_loop_stream_bound(const CellSpec& spec) {
  if (spec.max_concurrency > 0) return spec.max_concurrency;
  // Unbounded: everything that can arrive in the window may be in flight at
  // once (a stalled server). Three sigma above the mean covers Poisson.
  const double mean = spec.rate_per_s * std::max(spec.duration_s, 0.0);
  const double bound = mean + 3 * std::sqrt(std::max(mean, 1.0)) + 16;
  return static_cast<std::int64_t>(std::min(bound, 1e6));
}

}  // namespace speedmatrix
