#include "speedmatrix/open_loop.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <utility>

#include "loop_book.hpp"
#include "loop_run.hpp"
#include "speedmatrix/cell.hpp"
#include "speedmatrix/loops.hpp"
#include "warmup.hpp"

namespace speedmatrix {
namespace {

ns_t s_to_ns(double s) {
  if (!(s > 0)) return 0;
  if (s > 1e9) return std::numeric_limits<ns_t>::max() / 4;
  return static_cast<ns_t>(s * 1e9);
}

}  // namespace

namespace {

// One open-loop run: arrivals due on the pacer's schedule go out (through the gate when
// the client caps its concurrency) whatever the server does; failed connections are only
// counted (the schedule is kept, no slot waits): a server gone for give_up_ns ends the
// cell as in the closed loop.
class OpenLoop : LoopRun<OpenLoopPlan> {
 public:
  OpenLoop(const OpenLoopPlan& plan, Pacer& pacer, Transport& transport, Clock& clock,
           CellRecords& records, const std::atomic<bool>& stop, CellProgress* progress)
      : LoopRun(plan, transport, clock, records, stop, progress, 0), pacer_(pacer) {}

  ScheduleTimes run() {
    // Warm-up (warmup.hpp), as the closed loop does, so both modes start from
    // the same server state.
    if (!warm_up([&](std::int32_t id) { backoff_after(id); })) return stopped_in_warmup();
    // Every loop's warm-up is over: one t0 for all.
    const ns_t t0 = group_.arrive(clock_, loop_.stop_requested_flag());
    if (t0 == kNever) return stopped_in_warmup();
    open_window(t0);
    while (step()) {
    }
    finish();
    return times_;
  }

 private:
  ScheduleTimes stopped_in_warmup() {
    loop_.cancel_all();
    return stopped_before_window();
  }

  void open_window(ns_t t0) {
    t0_ = t0;
    times_.window_start_ns = t0_;
    if (progress_) progress_->window_start_ns.store(t0_, std::memory_order_relaxed);
    window_end_ = t0_ + plan_.duration_ns;
    drain_end_ = window_end_ + std::max<ns_t>(plan_.drain_timeout_ns, 0);
    advance();
  }

  // The next arrival's due time (kNever once the plan or the window ends).
  void advance() {
    const ns_t off = pacer_.due_ns(k_);
    next_due_ = (off == kNever || t0_ + off >= window_end_) ? kNever : t0_ + off;
  }

  // Every arrival already due goes out now, in order: a late loop sends a burst rather
  // than skipping any (the schedule is the user population).
  void queue_due(ns_t now) {
    const std::size_t nb = plan_.bodies.size();
    while (next_due_ != kNever && next_due_ <= now) {
      const std::int64_t global = index_ + k_ * loops_;  // this loop's k-th of the schedule
      const auto slot = static_cast<std::int32_t>(global);
      const auto body = static_cast<std::int32_t>(static_cast<std::size_t>(global) % nb);
      gate_.push_back(loop_.add(slot, body, Phase::kWindow, next_due_));
      ++k_;
      advance();
    }
  }

  void open_gate() {
    const bool gated = plan_.max_concurrency > 0;
    while (!gate_.empty() && (!gated || loop_.in_flight() < plan_.max_concurrency)) {
      const std::int32_t id = gate_.front();
      gate_.pop_front();
      const RequestRecord& r = records_.requests[static_cast<std::size_t>(id)];
      loop_.start(id, plan_.bodies[static_cast<std::size_t>(r.body)]);
    }
  }

  void on_finished(std::int32_t id) {
    backoff_after(id);
    ns_t done = records_.requests[static_cast<std::size_t>(id)].done_ns;
    if (done == kNever) done = clock_.now();
    if (times_.stopped_by != StopReason::kUnreachable && backoff_.give_up(done)) {
      times_.stopped_by = StopReason::kUnreachable;
      times_.stop_reason = backoff_.give_up_reason(done);
      group_.abort(times_.stop_reason);  // every loop ends
    }
  }

  // One turn of the event loop; false when the run has ended.
  bool step() {
    const ns_t now = turn_start();
    if (now == kNever) return false;
    queue_due(now);
    open_gate();
    if (next_due_ == kNever && gate_.empty() && loop_.in_flight() == 0) return false;  // all done
    if (now >= drain_end_) return false;
    const ns_t deadline = next_due_ != kNever ? std::min(next_due_, drain_end_) : drain_end_;
    for (std::int32_t id : loop_.poll(deadline)) on_finished(id);
    if (times_.stopped_by != StopReason::kUnreachable && group_.aborted()) {  // another loop
      times_.stopped_by = StopReason::kUnreachable;
      times_.stop_reason = group_.abort_reason();
    }
    return times_.stopped_by != StopReason::kUnreachable;
  }

  void finish() {
    times_.window_end_ns = times_.stopped || times_.stopped_by == StopReason::kUnreachable
                               ? std::min(clock_.now(), window_end_)
                               : window_end_;
    loop_.cancel_all();
    const ns_t end = clock_.now();
    for (std::int32_t id : gate_) {  // never sent: the drain bound (or a stop) came first
      RequestRecord& r = records_.requests[static_cast<std::size_t>(id)];
      r.outcome = Outcome::kCancelled;
      r.done_ns = end;
    }
    times_.end_ns = end;
  }

  Pacer& pacer_;
  ns_t t0_ = kNever, window_end_ = kNever, drain_end_ = kNever;
  std::int64_t k_ = 0;  // next arrival
  ns_t next_due_ = kNever;
  std::deque<std::int32_t> gate_;  // due, not yet sent (FIFO)
};

}  // namespace

ScheduleTimes run_open_loop(const OpenLoopPlan& plan, Pacer& pacer, Transport& transport,
                            Clock& clock, CellRecords& records, const std::atomic<bool>& stop,
                            CellProgress* progress) {
  return OpenLoop(plan, pacer, transport, clock, records, stop, progress).run();
}

namespace {

// The spec's pacer: its explicit schedule when it has one, else its arrival process.
std::unique_ptr<Pacer> spec_pacer(const CellSpec& spec, std::string* why) {
  if (!spec.schedule_ns.empty()) return make_schedule_pacer(spec.schedule_ns, why);
  return make_pacer(spec.arrival, spec.rate_per_s, spec.gamma_shape, spec.seed, why);
}

}  // namespace

std::string check_open_loop(const CellSpec& spec) {
  if (spec.mode != "open") return "mode '" + spec.mode + "' is not closed or open";
  if (!(spec.duration_s > 0)) return "an open-loop cell needs duration_s > 0";
  if (spec.max_concurrency < 0) return "max_concurrency must be >= 0";
  if (spec.drain_timeout_s < 0) return "drain_timeout_s must be >= 0";
  std::string why;
  if (!spec_pacer(spec, &why)) return why;
  return "";
}

ScheduleTimes run_open_loop_cell(const CellSpec& spec, Transport& transport, Clock& clock,
                                 CellRecords& records, const std::atomic<bool>& stop,
                                 CellProgress* progress, LoopGroup* group, std::int32_t loop) {
  OpenLoopPlan plan;
  plan.warmup_bodies.assign(spec.warmup_bodies.begin(), spec.warmup_bodies.end());
  plan.warmup_timeout_ns = s_to_ns(spec.warmup_timeout_s);
  plan.bodies.assign(spec.bodies.begin(), spec.bodies.end());
  plan.duration_ns = s_to_ns(spec.duration_s);
  plan.max_concurrency = spec.max_concurrency;
  plan.drain_timeout_ns = s_to_ns(spec.drain_timeout_s);
  plan.backoff.give_up_ns = s_to_ns(spec.unreachable_after_s);
  std::string why;
  std::unique_ptr<Pacer> pacer = spec_pacer(spec, &why);
  plan.group = group;
  plan.loop = loop;
  if (group && group->loops() > 1)  // this loop's arrivals of the one schedule
    pacer = std::make_unique<DealtPacer>(std::move(pacer), loop, group->loops());
  return run_open_loop(plan, *pacer, transport, clock, records, stop, progress);
}

std::int64_t open_loop_stream_bound(const CellSpec& spec) {
  if (spec.max_concurrency > 0) return spec.max_concurrency;
  if (!spec.schedule_ns.empty()) return static_cast<std::int64_t>(spec.schedule_ns.size());
  // Unbounded: everything that can arrive in the window may be in flight at
  // once (a stalled server). Three sigma above the mean covers Poisson.
  const double mean = spec.rate_per_s * std::max(spec.duration_s, 0.0);
  const double bound = mean + 3 * std::sqrt(std::max(mean, 1.0)) + 16;
  return static_cast<std::int64_t>(std::min(bound, 1e6));
}

}  // namespace speedmatrix
