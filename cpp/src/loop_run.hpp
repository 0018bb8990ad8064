// What one run of the closed loop (closed_loop.cpp) and of the open loop (open_loop.cpp)
// hold alike: the plan, the clock and records, the book of requests in flight, the backoff,
// the times the run reports, and this loop's place in its group of loops. Private to cpp/src.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "loop_book.hpp"
#include "speedmatrix/cell.hpp"
#include "speedmatrix/loops.hpp"
#include "speedmatrix/scheduler.hpp"
#include "warmup.hpp"

namespace speedmatrix {

// Plan: ClosedLoopPlan or OpenLoopPlan (warmup_*, backoff, group, loop).
template <typename Plan>
class LoopRun {
 protected:
  // A plan that names no group runs as the only loop of a group of its own, of
  // `own_slots` slots.
  LoopRun(const Plan& plan, Transport& transport, Clock& clock, CellRecords& records,
          const std::atomic<bool>& stop, CellProgress* progress, std::int32_t own_slots)
      : plan_(plan),
        clock_(clock),
        records_(records),
        progress_(progress),
        loop_(transport, records, stop, progress),
        backoff_(plan.backoff),
        own_group_(plan.group ? nullptr : std::make_unique<LoopGroup>(1, own_slots)),
        group_(plan.group ? *plan.group : *own_group_),
        index_(plan.group ? plan.loop : 0),
        loops_(group_.loops()) {}

  // This loop's share of the warm-up (warmup.hpp); `feed` sees each finished request.
  // False when a stop came first.
  template <typename Feed>
  bool warm_up(Feed&& feed) {
    return run_warmup(plan_.warmup_bodies, plan_.warmup_timeout_ns, plan_.warmup_retries, loop_,
                      clock_, records_, progress_, times_, std::forward<Feed>(feed),
                      static_cast<std::size_t>(index_), static_cast<std::size_t>(loops_));
  }

  // Every finished request feeds the backoff; returns the wait it asks of its slot.
  ns_t backoff_after(std::int32_t id) {
    return backoff_.on_finished(records_.requests[static_cast<std::size_t>(id)],
                                records_.retry_after(id));
  }

  // The start of a turn of the event loop: the time now, or kNever when a stop was asked
  // (the run ends, stopped). Finished requests older than the spill lag leave memory.
  ns_t turn_start() {
    if (loop_.stop_requested()) {
      times_.stopped = true;
      times_.stopped_by = StopReason::kStop;
      return kNever;
    }
    const ns_t now = clock_.now();
    records_.requests.spill_finished(now - kRequestSpillLag_ns);
    return now;
  }

  // The times of a run stopped before its window opened.
  ScheduleTimes stopped_before_window() {
    times_.stopped = true;
    times_.stopped_by = StopReason::kStop;
    times_.end_ns = clock_.now();
    return times_;
  }

  const Plan& plan_;
  Clock& clock_;
  CellRecords& records_;
  CellProgress* progress_;
  LoopBook loop_;
  Backoff backoff_;
  ScheduleTimes times_;
  std::unique_ptr<LoopGroup> own_group_;  // a run with no group: the only loop
  LoopGroup& group_;
  const std::int32_t index_, loops_;  // this loop, of loops_
};

}  // namespace speedmatrix
