#include "speedmatrix/scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <utility>

#include "speedmatrix/cell.hpp"

namespace speedmatrix {
namespace {

// The bookkeeping of one run: which request each slot has in flight, the
// refills waiting for their due time, and the progress counters.
class Loop {
 public:
  Loop(Transport& t, CellRecords& r, const std::atomic<bool>& stop, CellProgress* p)
      : transport_(t), records_(r), stop_(stop), progress_(p) {}

  // Creates record `id` and hands it to the transport.
  std::int32_t launch(std::int32_t slot, std::int32_t body_index, std::string_view body,
                      Phase phase, ns_t scheduled_ns) {
    RequestRecord rec;
    rec.slot = slot;
    rec.body = body_index;
    rec.phase = phase;
    rec.scheduled_ns = scheduled_ns;
    records_.requests.push_back(std::move(rec));
    const auto id = static_cast<std::int32_t>(records_.requests.size() - 1);
    ++in_flight_;
    if (progress_) progress_->in_flight.store(in_flight_, std::memory_order_relaxed);
    transport_.start(id, body);
    return id;
  }

  // One transport poll; returns the ids that finished (valid until the next call).
  const std::vector<std::int32_t>& poll(ns_t deadline) {
    finished_.clear();
    transport_.poll(deadline, finished_);
    for (std::int32_t id : finished_) account(id);
    return finished_;
  }

  void cancel(std::int32_t id) {
    transport_.cancel(id);
    account(id);
  }

  bool stop_requested() const { return stop_.load(std::memory_order_relaxed); }
  std::int32_t in_flight() const { return in_flight_; }

 private:
  void account(std::int32_t id) {
    --in_flight_;
    if (!progress_) return;
    progress_->in_flight.store(in_flight_, std::memory_order_relaxed);
    const RequestRecord& r = records_.requests[static_cast<std::size_t>(id)];
    if (r.phase != Phase::kWindow) return;
    if (r.outcome == Outcome::kOk) progress_->completed.fetch_add(1, std::memory_order_relaxed);
    if (r.outcome == Outcome::kError) progress_->errors.fetch_add(1, std::memory_order_relaxed);
  }

  Transport& transport_;
  CellRecords& records_;
  const std::atomic<bool>& stop_;
  CellProgress* progress_;
  std::int32_t in_flight_ = 0;
  std::vector<std::int32_t> finished_;
};

struct Refill {
  ns_t due_ns;
  std::int32_t slot;
  bool operator>(const Refill& o) const { return due_ns > o.due_ns; }
};

}  // namespace

ScheduleTimes run_closed_loop(const ClosedLoopPlan& plan, Transport& transport, Clock& clock,
                              CellRecords& records, const std::atomic<bool>& stop,
                              CellProgress* progress) {
  ScheduleTimes times;
  Loop loop(transport, records, stop, progress);

  // Warm-up: everything at once, then wait for all (or the timeout).
  if (!plan.warmup_bodies.empty()) {
    times.warmup_start_ns = clock.now();
    std::vector<std::int32_t> live;
    live.reserve(plan.warmup_bodies.size());
    for (std::size_t i = 0; i < plan.warmup_bodies.size(); ++i) {
      live.push_back(loop.launch(static_cast<std::int32_t>(i), static_cast<std::int32_t>(i),
                                 plan.warmup_bodies[i], Phase::kWarmup, times.warmup_start_ns));
    }
    const ns_t deadline =
        plan.warmup_timeout_ns > 0 ? times.warmup_start_ns + plan.warmup_timeout_ns : kNoDeadline;
    std::vector<char> done(records.requests.size(), 0);
    while (loop.in_flight() > 0 && !loop.stop_requested() && clock.now() < deadline) {
      for (std::int32_t id : loop.poll(deadline)) done[static_cast<std::size_t>(id)] = 1;
    }
    for (std::int32_t id : live) {
      if (!done[static_cast<std::size_t>(id)]) loop.cancel(id);
    }
    if (loop.stop_requested()) {
      times.stopped = true;
      times.end_ns = clock.now();
      return times;
    }
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

  // t0 is read once, before the first hand-over: the window is defined by
  // when its requests were sent, not by when the last of N was queued.
  const ns_t t0 = clock.now();
  times.window_start_ns = t0;
  if (progress) progress->window_start_ns.store(t0, std::memory_order_relaxed);
  const ns_t end_at = plan.duration_ns > 0 ? t0 + plan.duration_ns : kNoDeadline;
  for (std::size_t k = 0; k < n && may_start(); ++k) launch_slot(k, t0);

  ns_t last_done = t0;
  bool reached_end = false;
  for (;;) {
    if (loop.stop_requested()) {
      times.stopped = true;
      break;
    }
    ns_t now = clock.now();
    if (now >= end_at) {
      reached_end = true;
      break;
    }
    while (!refills.empty() && refills.top().due_ns <= now) {
      const Refill r = refills.top();
      refills.pop();
      if (may_start()) launch_slot(static_cast<std::size_t>(r.slot), r.due_ns);
    }
    if (loop.in_flight() == 0 && (refills.empty() || !may_start())) break;  // request budget spent
    const ns_t deadline = refills.empty() ? end_at : std::min(end_at, refills.top().due_ns);
    for (std::int32_t id : loop.poll(deadline)) {
      const RequestRecord& rec = records.requests[static_cast<std::size_t>(id)];
      const auto slot = static_cast<std::size_t>(rec.slot);
      slot_request[slot] = -1;
      now = clock.now();
      const ns_t finished_at = rec.done_ns != kNever ? rec.done_ns : now;
      last_done = std::max(last_done, finished_at);
      if (!may_start() || now >= end_at || loop.stop_requested()) continue;
      if (rec.outcome == Outcome::kError && rec.sent_ns != kNever &&
          rec.sent_ns + plan.error_backoff_ns > now) {
        refills.push({rec.sent_ns + plan.error_backoff_ns, rec.slot});
      } else {
        launch_slot(slot, finished_at);
      }
    }
  }

  if (times.stopped) {
    times.window_end_ns = clock.now();
  } else if (reached_end) {
    times.window_end_ns = end_at;
  } else {
    times.window_end_ns = last_done;
  }
  for (std::int32_t id : slot_request) {
    if (id >= 0) loop.cancel(id);
  }
  times.end_ns = clock.now();
  return times;
}

ns_t ConstantPacer::due_ns(std::int64_t k) {
  if (rate_ <= 0 || (count_ > 0 && k >= count_)) return kNever;
  return static_cast<ns_t>(std::llround(static_cast<double>(k) * 1e9 / rate_));
}

PoissonPacer::PoissonPacer(double rate_per_s, std::uint64_t seed, std::int64_t count)
    : rng_(seed), gap_s_(rate_per_s > 0 ? rate_per_s : 1.0), count_(rate_per_s > 0 ? count : -1) {}

ns_t PoissonPacer::due_ns(std::int64_t k) {
  if (count_ < 0 || (count_ > 0 && k >= count_)) return kNever;
  // Request 0 is due at once; each later one an exponential gap after the previous.
  while (next_k_ <= k) {
    if (next_k_ > 0) t_s_ += gap_s_(rng_);
    ++next_k_;
  }
  return static_cast<ns_t>(std::llround(t_s_ * 1e9));
}

}  // namespace speedmatrix
