// Many event loops for one cell (CellSpec::client_threads): what the loops share (one
// warm-up barrier, one window, one request budget, one end), how streams and arrivals are
// dealt to them, and the exact merge of their records before any figure is computed.
// docs/SCALE.md says how it is used; a cell with one loop runs exactly as before.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "speedmatrix/clock.hpp"
#include "speedmatrix/pacer.hpp"
#include "speedmatrix/scheduler.hpp"

namespace speedmatrix {

// What the loops of one cell share. Thread-safe; one object per cell, shared by its loops.
// A cell with one loop has one too (every call is then immediate).
//  - Dealing: loop i of N runs the closed loop's global slots k = i, i + N, i + 2N, ...
//    (slot k sends bodies[k % B], as with one loop), the warm-up's bodies w = i, i + N, ...
//    and the open loop's arrivals i, i + N, ... of the one global schedule.
//  - Window: every loop reports each slot's first token; the one window-opening rule
//    (steady_window_open) runs over all slots of all loops, and its t0 is the cell's.
//  - Budget: max_requests is spent from one counter.
//  - End: a loop that gives up on an unreachable server ends every loop with its reason.
class LoopGroup {
 public:
  // `slots`: the closed loop's concurrency (all loops together); 0 for an open loop.
  LoopGroup(std::int32_t loops, std::int32_t slots);
  LoopGroup(const LoopGroup&) = delete;
  LoopGroup& operator=(const LoopGroup&) = delete;

  std::int32_t loops() const noexcept { return loops_; }
  // How many of `total` dealt items (slots, warm-up bodies) loop `i` gets.
  std::int32_t share(std::int32_t i, std::int32_t total) const noexcept;

  // Registers loop i's transport, to be woken when another loop opens the window or ends
  // the cell; nullptr detaches it. Call from the loop's own thread before and after it runs.
  void attach(std::int32_t i, Transport* transport);
  void wake_all() noexcept;

  // The warm-up barrier: blocks until every loop has arrived (or `stop` is set, checked
  // every 20 ms); returns the clock when the last arrived (the common ramp start, and the
  // open loop's t0), or kNever on a stop.
  ns_t arrive(Clock& clock, const std::atomic<bool>& stop);

  // The ramp. `slot` is global. A loop reports a slot's first token once.
  void note_first_token(std::int32_t slot, ns_t first_token_ns);
  void note_ramp_failure();
  // The window-opening rule over every slot (steady_window_open), plus: nothing streams and
  // a whole wave (`slots` window requests) failed, so t0 = now. Returns t0 once found (the
  // same value for every caller thereafter) or kNever; *capped: the cap opened it.
  ns_t open_window(ns_t ramp_start_ns, ns_t now_ns, ns_t settle_ns, ns_t cap_ns, bool* capped);
  ns_t t0() const noexcept { return t0_.load(std::memory_order_acquire); }

  // The window's request budget (max_requests <= 0: unbounded). take_request spends one
  // and says whether it was there.
  bool take_request(std::int64_t max_requests) noexcept;
  bool budget_left(std::int64_t max_requests) const noexcept;

  // Ends every loop: the first reason wins. Wakes them.
  void abort(const std::string& reason);
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() const;

 private:
  const std::int32_t loops_;
  const std::int32_t slots_;
  mutable std::mutex mu_;  // guards everything below that is not atomic
  std::condition_variable arrived_cv_;
  std::int32_t arrived_ = 0;
  ns_t ramp_start_ns_ = kNever;
  std::vector<ns_t> first_token_ns_;  // by global slot
  std::int64_t ramp_failures_ = 0;
  bool any_streamed_ = false;
  std::atomic<ns_t> t0_{kNever};
  bool capped_ = false;
  std::atomic<std::int64_t> started_{0};
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
  std::vector<Transport*> transports_;
};

// Loop i's view of the one global arrival schedule: its k-th arrival is the global
// arrival i + k * loops (every loop runs its own copy of the same seeded pacer, so the
// union over loops is the schedule one loop would have run).
class DealtPacer final : public Pacer {
 public:
  DealtPacer(std::unique_ptr<Pacer> global, std::int32_t loop, std::int32_t loops);
  ns_t due_ns(std::int64_t k) override;
  // The global arrival index of local arrival k.
  std::int64_t global_index(std::int64_t k) const noexcept { return loop_ + k * loops_; }

 private:
  std::unique_ptr<Pacer> global_;
  std::int64_t loop_, loops_;
  std::int64_t next_global_ = 0;  // the global pacer is asked in order
};

// The loops a cell runs: `asked` > 0 is taken as it is (at most 1024); 0 (auto) is
// ceil(streams / 256), at most cores - 1, at least 1.
std::int32_t auto_client_threads(std::int32_t asked, std::int64_t streams, std::int32_t cores);

// Merges the loops' records into `out` (configured for spilling by the caller), exactly:
// requests ordered by (phase, sent_ns with never-sent last, loop, id) and renumbered,
// events merged by t_ns (ties by loop) with their request ids renumbered. Empties `parts`.
void merge_loop_records(std::vector<CellRecords>& parts, CellRecords& out);

// Combines the loops' ScheduleTimes: window and ramp from loop 0 (they share them), the
// earliest warm-up start, the latest ends, counts summed, and the stop that ended the cell
// (a stop, then an unreachable server, then loop 0's own).
ScheduleTimes merge_loop_times(const std::vector<ScheduleTimes>& parts);

// Pins the calling thread to the i-th CPU it may run on (modulo their number); false where
// the OS does not allow it (the thread then runs where the OS puts it).
bool pin_to_cpu(std::int32_t i) noexcept;

}  // namespace speedmatrix
