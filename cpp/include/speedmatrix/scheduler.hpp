// When requests are sent: the closed loop of a cell (warm-up, then N slots
// refilled on finish for a fixed window or request count, then cancellation)
// and the rules both loops share (backoff, stalls, the window's opening); the
// open loop's arrivals are in pacer.hpp. No I/O: the scheduler drives a
// Transport and reads a Clock, so tests run it with fakes of both.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "speedmatrix/clock.hpp"
#include "speedmatrix/pacer.hpp"
#include "speedmatrix/records.hpp"

namespace speedmatrix {

struct CellProgress;  // cell.hpp
class LoopGroup;      // loops.hpp
class ChainFeed;      // chain.hpp

// The loops spill request records (RequestLog::spill_finished) that finished at least this
// long ago: a just-finished record is still read (and a stalled one written) by the loop
// that handles it, in the same iteration; two seconds is many iterations of slack.
inline constexpr ns_t kRequestSpillLag_ns = 2'000'000'000;

// The records a cell accumulates. Requests are appended in send order (the
// scheduler creates them); the transport fills in what it observes.
struct CellRecords {
  RequestLog requests;
  EventColumns events;
  // The delay an error answer asked for in its Retry-After header, by request
  // id (ns from the answer; kNever, or an index past the end: none). Written by
  // the transport when it finishes such a request; read by the loops' backoff.
  std::vector<ns_t> retry_after_ns;
  // What each request's stream delivered, by request id, when the cell keeps output
  // (CellSpec::keep_output; empty otherwise). Written by the transport as events arrive.
  std::vector<RequestOutput> outputs;
  RequestOutput& output(std::int32_t id) {
    const auto i = static_cast<std::size_t>(id);
    if (i >= outputs.size()) outputs.resize(i + 1);
    return outputs[i];
  }
  ns_t retry_after(std::int32_t id) const {
    const auto i = static_cast<std::size_t>(id);
    return id >= 0 && i < retry_after_ns.size() ? retry_after_ns[i] : kNever;
  }
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

// How a cell answers a server that pushes back (docs/internals.md "Backoff").
//  - A request that ends http_429 (or http_503 with a Retry-After) makes its
//    slot wait before its next send: the Retry-After it carried, at most
//    retry_after_max_ns; without one, rate_limit_first_ns doubled for every
//    429 the cell got since its last successful request, at most
//    rate_limit_max_ns.
//  - Any other error (a 500, a 503 without Retry-After, a broken stream; not a
//    stall, which the client cut) makes its slot wait error_first_ns doubled for
//    every such error since the cell's last successful request, at most
//    error_max_ns: a server that fails at once is not hammered in a tight loop.
//  - A request that ends connect / connect_timeout makes its slot wait
//    connect_first_ns doubled for every such failure in a row in the cell (any
//    other ending resets the run: a connection was made), at most
//    connect_max_ns.
//  - Once connections failed give_up_failures times in a row over at least
//    give_up_ns (from the first one's send), the cell ends (kUnreachable) with
//    a one-line reason. give_up_ns <= 0: never.
// Waits are the closed loop's (per slot, on the loop's timers); the open loop
// keeps its schedule and only gives up (open_loop.hpp).
struct BackoffPolicy {
  ns_t retry_after_max_ns = 10'000'000'000;
  ns_t rate_limit_first_ns = 100'000'000;
  ns_t rate_limit_max_ns = 2'000'000'000;
  ns_t error_first_ns = 100'000'000;
  ns_t error_max_ns = 2'000'000'000;
  ns_t connect_first_ns = 50'000'000;
  ns_t connect_max_ns = 2'000'000'000;
  std::int32_t give_up_failures = 5;
  ns_t give_up_ns = 10'000'000'000;
};

// The policy's bookkeeping over one cell, pure: fed every finished request.
class Backoff {
 public:
  explicit Backoff(BackoffPolicy policy = {}) : p_(policy) {}
  // A request that finished (any phase, any outcome) and the Retry-After its
  // answer carried (kNever: none). Returns how long its slot should wait from
  // the request's end before sending again (0: no backoff).
  ns_t on_finished(const RequestRecord& r, ns_t retry_after_ns);
  // Whether the connection failures in a row call for ending the cell, at `now`.
  bool give_up(ns_t now) const;
  // One line: "the server refused 9 connections in a row over 10.2 s (...)".
  std::string give_up_reason(ns_t now) const;
  std::int32_t rate_limited_in_a_row() const { return rate_limited_; }
  std::int32_t connect_failures_in_a_row() const { return connect_failures_; }

 private:
  BackoffPolicy p_;
  std::int32_t rate_limited_ = 0;      // 429s since the cell's last successful request
  std::int32_t failed_ = 0;            // other errors since then (not 429, connect, stall)
  std::int32_t connect_failures_ = 0;  // connect / connect_timeout in a row
  bool all_refused_ = true;            // every one of them was "connect" (not a timeout)
  ns_t connect_first_ns_ = kNever;     // the first of them was sent
  std::string connect_last_error_;
};

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
  // Warm-up requests that failed or ran past warmup_timeout_ns are sent once
  // more (this many times), each try bounded by the same timeout.
  std::int32_t warmup_retries = 0;
  // 429 / Retry-After and refused connections (on top of error_backoff_ns).
  BackoffPolicy backoff;

  // Steady-state window (DESIGN.md, measurement 3). The N requests are sent at
  // the ramp's start; the window [t0, t0 + D] opens when every slot has
  // streamed (t0 = the last slot's first token), or when the number of slots
  // that streamed stopped growing for max(plateau_settle_ns, 2 x the longest
  // wait between two slots' first tokens) (a server that runs fewer than N:
  // t0 = its last growth), or at ramp start + ramp_cap_ns (ramp_capped).
  // false, or a max_requests plan: t0 = the send.
  bool steady_window = false;
  ns_t ramp_cap_ns = 180'000'000'000;
  ns_t plateau_settle_ns = 1'000'000'000;

  // Stalls: a window request that has streamed and then gets no token for
  // max(stall_min_ns, stall_gap_factor x the cell's running median gap, its own
  // pace) (stall_limit_ns) is cancelled as error "stall" and its slot refilled at
  // once. Judged from the token events (records.events; none when the transport
  // keeps none).
  // stall_min_ns <= 0: off.
  ns_t stall_min_ns = 0;
  double stall_gap_factor = 25;
  ns_t stall_pause_cap_ns = 0;  // a silence every stream shares is spared this long
  ns_t tick_ns = 100'000'000;   // how often stalls and the ramp are checked

  // Early end: once the window has lasted min_duration_ns, every
  // check_interval_ns should_end(t0, now) is asked (without I/O; cell.cpp
  // passes the precision stop on the figures so far); true ends the window now.
  // A check that took c ns is followed by at least 4c ns without one.
  std::function<bool(ns_t t0, ns_t now)> should_end;
  ns_t min_duration_ns = 0;
  ns_t check_interval_ns = 1'000'000'000;

  // Many loops (loops.hpp): this run is loop `loop` of group->loops(), and runs the global
  // slots loop, loop + N, ... and warm-up bodies likewise; the window, the request budget
  // and the end are the group's. nullptr: the only loop (slots 0..concurrency-1).
  LoopGroup* group = nullptr;
  std::int32_t loop = 0;

  // Free-running sessions (chain.hpp, CellSpec::chain): slot s sends bodies[s] once, then
  // session s's later turns as the chain hands them; finished requests go to the chain and
  // no slot is refilled. REQUIRES one loop and bodies.size() == concurrency == sessions.
  ChainFeed* chain = nullptr;
};

enum class StopReason : std::uint8_t {
  kDuration = 0,     // t0 + D reached
  kPrecision = 1,    // should_end said so
  kRequests = 2,     // max_requests spent and all finished (or nothing left to run)
  kStop = 3,         // stop was requested
  kUnreachable = 4,  // connections kept failing (BackoffPolicy): stop_reason says how
};

struct ScheduleTimes {
  ns_t warmup_start_ns = kNever;
  ns_t ramp_start_ns = kNever;    // the window's first N requests handed to the transport
  ns_t window_start_ns = kNever;  // t0: steady state reached (= ramp_start_ns without it)
  ns_t window_end_ns = kNever;    // t0 + D, the last finish (max_requests), the early end or stop
  ns_t end_ns = kNever;           // everything finished or cancelled
  bool stopped = false;
  bool ramp_capped = false;  // the window opened at the ramp cap, not at steady state
  StopReason stopped_by = StopReason::kDuration;
  std::int64_t stalls = 0;          // window requests cancelled as stalls
  std::int32_t warmup_retried = 0;  // warm-up requests sent a second time
  double stall_median_gap_ms = 0;   // the running median gap at the end (NaN if none)
  // Slot waits the BackoffPolicy imposed (429 / Retry-After, failed connections)
  // and the slot time they took inside the window [t0, its end]. Closed loop only.
  std::int64_t backoffs = 0;
  ns_t backoff_ns = 0;
  std::string stop_reason;  // kUnreachable: the one-line why
};

// The error kind of a window request the closed loop cut as a stall.
inline constexpr std::string_view kStallKind = "stall";

// One streaming request's silence and its own pace, as the stall rule reads them.
struct StreamSilence {
  ns_t silent_ns = 0;      // since its last token
  ns_t gap_ns = 0;         // its mean gap per token so far (0: fewer than two tokens)
  ns_t first_wait_ns = 0;  // from its send to its first token
};

// The stall rule, pure: how long a stream may go without a token, given the cell's
// running median gap (NaN: none yet): max(stall_min_ns, gap_factor x the cell's median
// gap, the stream's own pace), its own pace being gap_factor x its own mean gap, or,
// before its second token, twice its first token's wait (the next token may take as long
// as the first did, twice over). A server that is uniformly slow (3 s a token) is judged
// by its own pace, not cut at stall_min_ns before its second token. stall_min_ns <= 0: off
// (kNoDeadline).
ns_t stall_limit_ns(const StreamSilence& s, double median_gap_ms, ns_t stall_min_ns,
                    double gap_factor);
bool is_stalled(const StreamSilence& s, double median_gap_ms, ns_t stall_min_ns, double gap_factor);

// Which of a cell's streaming requests to cut as stalls, pure. `streams[i]`: streaming
// request i (one that has had its first token); `in_flight`: the cell's requests in
// flight, streaming or not yet. A request is cut when it is_stalled and the server is
// evidently still working for others: another streaming request is not stalled, or it is
// the only request in flight. A silence that every streaming request shares while others
// are in flight is the server's own pause (a refill's prefill that blocks decode, a batch
// waiting on memory), which the figures must count: nothing is cut while the longest
// silence is at most `pause_cap_ns`. Beyond it (a server that hung, or streams that
// stalled one by one until none was left) every stalled stream is cut.
std::vector<bool> stalled_streams(const std::vector<StreamSilence>& streams, std::size_t in_flight,
                                  double median_gap_ms, ns_t stall_min_ns, double gap_factor,
                                  ns_t pause_cap_ns);

// The window-opening rule, pure. `first_token_ns`: per slot, the first token
// time of its first streamed request (kNever: not yet). Returns t0 or kNever
// (not yet); `capped` says the cap opened it.
ns_t steady_window_open(const std::vector<ns_t>& first_token_ns, ns_t ramp_start_ns, ns_t now_ns,
                        ns_t settle_ns, ns_t cap_ns, bool* capped);

// Runs warm-up, ramp and window on the calling thread. `stop` is polled after
// every transport poll (set it, then call transport.wake()). `progress` may be
// null.
// REQUIRES: plan.bodies non-empty, plan.concurrency >= 1, and a duration or a
// request count.
ScheduleTimes run_closed_loop(const ClosedLoopPlan& plan, Transport& transport, Clock& clock,
                              CellRecords& records, const std::atomic<bool>& stop,
                              CellProgress* progress = nullptr);

}  // namespace speedmatrix
