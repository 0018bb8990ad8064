// When requests are sent: the closed loop of a cell (warm-up, then N slots
// refilled on finish for a fixed window or request count, then cancellation),
// and the pacer interface of the open loop. No I/O: the scheduler drives a
// Transport and reads a Clock, so tests run it with fakes of both.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <random>
#include <string_view>
#include <vector>

#include "speedmatrix/clock.hpp"
#include "speedmatrix/records.hpp"

namespace speedmatrix {

struct CellProgress;  // cell.hpp

// The records a cell accumulates. Requests are appended in send order (the
// scheduler creates them); the transport fills in what it observes.
struct CellRecords {
  std::vector<RequestRecord> requests;
  EventColumns events;
};

// What the scheduler needs from an HTTP engine. Single-threaded: every member
// but wake() is called from the scheduler's thread.
class Transport {
 public:
  virtual ~Transport() = default;
  // Hands request `id` (records.requests[id], already holding slot, body,
  // phase and scheduled_ns) to the engine and sets its sent_ns.
  // REQUIRES: `body` outlives the transfer (it is sent in place, never copied).
  // A request that cannot start still finishes, at a later poll().
  virtual void start(std::int32_t id, std::string_view body) = 0;
  // Ends in-flight request `id` now: outcome kCancelled, done_ns = now. The
  // connection is closed, so the server sees the client go away.
  virtual void cancel(std::int32_t id) = 0;
  // Runs I/O until at least one request finished, the clock reaches
  // `deadline_ns`, or wake() was called. Appends the finished ids (records
  // complete, outcome set) to `finished`.
  virtual void poll(ns_t deadline_ns, std::vector<std::int32_t>& finished) = 0;
  // Thread-safe, async-signal-unsafe: makes a blocked poll() return soon.
  virtual void wake() noexcept = 0;
};

inline constexpr ns_t kNoDeadline = std::numeric_limits<ns_t>::max();

struct ClosedLoopPlan {
  std::vector<std::string_view> warmup_bodies;  // sent once each, all at once
  ns_t warmup_timeout_ns = 600'000'000'000;
  std::vector<std::string_view> bodies;  // slot k sends bodies[k % size]
  std::int32_t concurrency = 1;
  ns_t duration_ns = 30'000'000'000;  // <= 0: no time limit (needs max_requests)
  std::int64_t max_requests = 0;      // > 0: start at most this many window requests
  // A slot whose request failed is refilled no sooner than this after the
  // failed request was sent, so an endpoint that refuses at once is not
  // hammered in a tight loop (and the records stay bounded).
  ns_t error_backoff_ns = 50'000'000;
};

struct ScheduleTimes {
  ns_t warmup_start_ns = kNever;
  ns_t window_start_ns = kNever;  // t0: the window's first requests handed to the transport
  ns_t window_end_ns = kNever;    // t0 + D, the last finish (max_requests), or the stop
  ns_t end_ns = kNever;           // everything finished or cancelled
  bool stopped = false;
};

// Runs warm-up and window on the calling thread. `stop` is polled after every
// transport poll (set it, then call transport.wake()). `progress` may be null.
// REQUIRES: plan.bodies non-empty, plan.concurrency >= 1, and a duration or a
// request count.
ScheduleTimes run_closed_loop(const ClosedLoopPlan& plan, Transport& transport, Clock& clock,
                              CellRecords& records, const std::atomic<bool>& stop,
                              CellProgress* progress = nullptr);

// --- open loop (run_open_loop and GammaPacer: open_loop.hpp) ---------------
// A pacer says when the k-th request of an open-loop run is due, as an offset
// from the start. Offsets are intended send times: latency is measured from
// them (wrk2's rule against coordinated omission). Pure and deterministic.
class Pacer {
 public:
  virtual ~Pacer() = default;
  // Offset (ns since start) at which request `k` (0, 1, 2, ... called in
  // order) is due, or kNever when the plan ends before it.
  virtual ns_t due_ns(std::int64_t k) = 0;
};

// rate_per_s requests per second, evenly spaced; `count` > 0 bounds the plan.
class ConstantPacer final : public Pacer {
 public:
  explicit ConstantPacer(double rate_per_s, std::int64_t count = 0)
      : rate_(rate_per_s), count_(count) {}
  ns_t due_ns(std::int64_t k) override;

 private:
  double rate_;
  std::int64_t count_;
};

// Poisson arrivals at rate_per_s (exponential gaps), reproducible by seed.
class PoissonPacer final : public Pacer {
 public:
  PoissonPacer(double rate_per_s, std::uint64_t seed, std::int64_t count = 0);
  ns_t due_ns(std::int64_t k) override;

 private:
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_s_;
  std::int64_t count_;
  std::int64_t next_k_ = 0;
  double t_s_ = 0;
};

}  // namespace speedmatrix
