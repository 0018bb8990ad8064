// The open loop of a cell: requests arrive on a pacer's schedule whatever the
// server does (a slow server makes them pile up, as users would), optionally
// gated by a client-side concurrency limit. Latency is measured from each
// request's scheduled time as well as from its actual send (wrk2's rule
// against coordinated omission). No I/O: driven through Transport and Clock
// (scheduler.hpp), so tests run it with fakes of both.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "speedmatrix/clock.hpp"
#include "speedmatrix/pacer.hpp"
#include "speedmatrix/scheduler.hpp"

namespace speedmatrix {

struct CellSpec;  // cell.hpp

struct OpenLoopPlan {
  std::vector<std::string_view> warmup_bodies;  // sent once each, all at once (as closed loop)
  ns_t warmup_timeout_ns = 600'000'000'000;
  std::int32_t warmup_retries = 0;       // as ClosedLoopPlan's (run_open_loop_cell keeps 0)
  std::vector<std::string_view> bodies;  // arrival k sends bodies[k % size]
  // The window: arrivals due in [t0, t0 + duration_ns) belong to it (half
  // open, so a constant rate r gives exactly r * D arrivals).
  ns_t duration_ns = 30'000'000'000;
  // > 0: at most this many in flight; a due arrival waits at the gate (FIFO)
  // and is sent when one finishes. Its scheduled_ns stays its due time, so
  // sent_ns - scheduled_ns is the time it was client-queued.
  std::int32_t max_concurrency = 0;
  // After t0 + D, how long window requests (and arrivals still at the gate)
  // may take to finish before the rest are cancelled. 0 = cancel at t0 + D.
  ns_t drain_timeout_ns = 60'000'000'000;
  // A 429 or a refused connection changes nothing here: every arrival is sent
  // on its schedule (that is the open loop) and a failed one is recorded, never
  // retried. Only the give-up rule applies: connections failing
  // give_up_failures times in a row over give_up_ns end the cell
  // (StopReason::kUnreachable, stop_reason); the wait fields are unused.
  BackoffPolicy backoff;

  // Many loops (loops.hpp): this run is loop `loop` of group->loops(); its pacer is its
  // share of the one schedule (DealtPacer), and its t0 and end are the group's. nullptr:
  // the only loop.
  LoopGroup* group = nullptr;
  std::int32_t loop = 0;
};

// Runs warm-up then the open-loop window on the calling thread. Every window
// record has slot = its arrival index k, body = k % bodies.size(),
// scheduled_ns = t0 + pacer.due_ns(k), sent_ns = when handed to the
// transport. An arrival never sent (still at the gate at the end) is recorded
// with outcome kCancelled, sent_ns = kNever, done_ns = the end.
// Times: window_start_ns = t0, window_end_ns = t0 + D (or the stop, or the
// give-up), end_ns = after the drain.
// REQUIRES: plan.bodies non-empty, plan.duration_ns > 0, a fresh pacer.
ScheduleTimes run_open_loop(const OpenLoopPlan& plan, Pacer& pacer, Transport& transport,
                            Clock& clock, CellRecords& records, const std::atomic<bool>& stop,
                            CellProgress* progress = nullptr);

// The open-loop fields of a CellSpec checked: "" or a one-line reason.
std::string check_open_loop(const CellSpec& spec);

// Runs an open-loop cell's schedule from its spec (pacer built from the spec); with a
// group, as loop `loop` of it (its share of the arrivals).
// REQUIRES: check_open_loop(spec) == "".
ScheduleTimes run_open_loop_cell(const CellSpec& spec, Transport& transport, Clock& clock,
                                 CellRecords& records, const std::atomic<bool>& stop,
                                 CellProgress* progress, LoopGroup* group = nullptr,
                                 std::int32_t loop = 0);

// How many streams an open-loop cell may hold at once, for sizing the
// connection cache and the descriptor limit.
std::int64_t open_loop_stream_bound(const CellSpec& spec);

}  // namespace speedmatrix
