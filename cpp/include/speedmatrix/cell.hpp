// One cell: warm-up, ramp, then a steady-state window of closed-loop load at concurrency N
// against one endpoint, with /metrics sampled beside it. The only entry point
// the Python layer calls to measure.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "speedmatrix/chain.hpp"
#include "speedmatrix/clock.hpp"
#include "speedmatrix/http.hpp"
#include "speedmatrix/openai.hpp"
#include "speedmatrix/records.hpp"

namespace speedmatrix {

struct CellSpec {
  // Where and how to send: url, headers, api key (never logged or returned),
  // api, timeouts (http.idle_timeout_s: no byte at all for this long =>
  // "stall", the last resort behind the stall rule below), TLS, event limits.
  // http.max_concurrency is set by the cell (N or the warm-up's size).
  HttpOptions http;

  // Warm-up: each body is sent once, all at once, and the ramp starts when
  // all have finished. A try is bounded by warmup_timeout_s (the rest are
  // cancelled); what failed or timed out is sent again, warmup_retries times.
  std::vector<std::string> warmup_bodies;
  double warmup_timeout_s = 600;
  std::int32_t warmup_retries = 1;

  // Window: slot k (0..concurrency-1) sends bodies[k % bodies.size()], and
  // sends it again as soon as it finishes (closed loop).
  std::vector<std::string> bodies;
  std::int32_t concurrency = 1;
  double duration_s = 30;         // window length (the cap with a precision target); at its end
                                  // everything in flight is cancelled
  std::int64_t max_requests = 0;  // >0: stop starting new requests after this many (window ends
                                  // when they finish; a duration_s > 0 still bounds the window)

  // Open loop (mode "open", open_loop.hpp): arrivals due in [t0, t0 + duration_s)
  // on a pacer's schedule, whatever the server does; concurrency and
  // max_requests are then unused. Window arrival k sends bodies[k % size].
  std::string mode = "closed";      // "closed" | "open"
  double rate_per_s = 0;            // asked arrival rate (requests/s), > 0 for open
  std::string arrival = "poisson";  // "poisson" | "constant" | "gamma"
  double gamma_shape = 1;           // gamma's shape: gap CV = 1/sqrt(shape); 1 = Poisson
  // Non-empty: replay these send times instead (ns from the window's start,
  // non-decreasing: a trace's arrivals divided by its speed-up); rate_per_s,
  // arrival and gamma_shape are then unused, and duration_s must reach past the last.
  std::vector<ns_t> schedule_ns;
  std::int32_t max_concurrency = 0;  // > 0: at most this many in flight; the rest wait (FIFO)
  std::uint64_t seed = 0;            // the pacer's seed: the same seed, the same schedule
  double drain_timeout_s = 60;       // after t0 + D, wait this long for the window's requests

  // Steady-state window (ClosedLoopPlan, DESIGN.md measurement 3): the window
  // opens when every slot streams, at the plateau of a queued server (no new
  // slot streaming for max(plateau_settle_s, 2 x the longest wait between two
  // slots' first tokens)), or at ramp_cap_s after the send (ramp_capped).
  // false: the window opens at the send (the old behaviour; max_requests
  // cells always do).
  bool steady_window = true;
  double ramp_cap_s = 180;
  double plateau_settle_s = 1;

  // Stall rule: a window stream that streamed and then got no token for
  // max(stall_min_s, stall_gap_factor x the cell's running median gap, its own
  // pace) (scheduler.hpp stall_limit_ns) is cancelled as error "stall" and its
  // slot refilled. stall_min_s <= 0: off.
  double stall_min_s = 2;
  double stall_gap_factor = 25;
  // A silence every streaming request shares (the server paused them all: a refill's
  // prefill that blocks decode) is spared up to this long before the stall rule cuts it
  // (scheduler.hpp, stalled_streams). 0: a shared silence is cut like any other.
  double stall_pause_cap_s = 0;

  // Failed connections (connect / connect_timeout) in a row for this long (and
  // at least 5 of them) end the cell: stopped_by "unreachable" with the reason
  // in stop_reason (BackoffPolicy, scheduler.hpp). <= 0: never.
  double unreachable_after_s = 10;

  // Precision stop: precision > 0 (0.02 = 2%) ends the window as soon as the
  // 95% intervals of total tok/s and median TBT are both within that fraction
  // of their value (stats.hpp precision_stop), checked every
  // precision_check_s once the window lasted min_duration_s; duration_s is
  // then the cap.
  double precision = 0;
  double min_duration_s = 5;
  double precision_check_s = 1;

  // /metrics sampler (empty url = off): polled every metrics_interval_s from
  // before the warm-up to the end of the window.
  std::string metrics_url;
  double metrics_interval_s = 0.25;
  std::vector<std::string> metric_names;
  // Per metric_names entry: "sum" (over label sets: counts of requests on
  // every rank) or "max" (a fraction of each rank's own pool, e.g. KV usage).
  // Missing entries are "sum".
  std::vector<std::string> metric_reduce;

  // Token events beyond this many are spilled to unlinked files in spill_dir ("" = $TMPDIR,
  // else /tmp) so memory does not grow with the window (records.hpp EventColumns); 0 = keep
  // all in memory. If the files cannot be written, the events stay in memory and
  // CellResult::events.note() says so.
  std::size_t spill_events = EventColumns::kDefaultSpillThreshold;
  // Request records past this many in memory are spilled there too, once finished for 2 s
  // (records.hpp RequestLog); 0 = all in memory.
  std::size_t spill_requests = RequestLog::kDefaultSpillThreshold;
  std::string spill_dir;

  // Event loops (loops.hpp, docs/SCALE.md): N > 1 runs N loops on their own threads, each
  // with its own libcurl multi handle and records, the slots (closed) or the arrivals
  // (open) dealt round-robin, one window, the records merged exactly at the end; 1: one
  // loop on the calling thread; 0: auto (auto_client_threads: ceil(streams / 256), at most
  // the cores minus one). Never more loops than slots. A precision stop, and an open loop
  // capped by max_concurrency (one FIFO gate), run one loop.
  std::int32_t client_threads = 1;

  // Keep what each request's stream delivered (CellResult::outputs): its content text and,
  // where the server streams them (vLLM with `return_token_ids`), its token ids. Off: no
  // string is read or copied on the hot path. Each request keeps at most
  // keep_output_max_bytes (text bytes + 4 a token id; RequestOutput::truncated past it), so
  // a hostile server cannot grow the client's memory; the whole cost is about that times
  // the cell's requests: meant for cells of few requests (a session's turns).
  bool keep_output = false;
  std::size_t keep_output_max_bytes = std::size_t{1} << 20;

  // Free-running sessions (chain.hpp): non-null, the closed loop sends `bodies` (one per
  // session: concurrency == chain->sessions() == bodies.size()) once each, hands every
  // finished request to the chain, and sends each session's later turns as a feeder pushes
  // them, no sooner than their due time; no slot is refilled otherwise. The cell ends when
  // every session is done (stopped_by "requests"), at duration_s, or on a stop; it runs one
  // event loop, and closes the chain when it ends. Turn k of session s is body k x N + s.
  std::shared_ptr<ChainFeed> chain;
};

struct CellResult {
  ns_t warmup_start_ns = kNever;
  ns_t ramp_start_ns = kNever;    // the window's first N requests were sent
  ns_t window_start_ns = kNever;  // t0: steady state (= ramp_start_ns when not steady_window)
  ns_t window_end_ns = kNever;    // t0 + D, the precision stop, or the last request's end
  ns_t end_ns = kNever;           // everything cancelled and accounted for
  bool ramp_capped = false;       // the ramp cap opened the window
  std::string stopped_by;         // "duration" | "precision" | "requests" | "stop" | "unreachable"
  std::string stop_reason;        // "unreachable": one line, e.g. "the server refused 9 connections
                                  // in a row over 10.1 s (...)" (BackoffPolicy, scheduler.hpp)
  std::int64_t stalls = 0;        // window requests cancelled as "stall"
  // Closed loop: slot waits imposed by a 429 / Retry-After or failed
  // connections (BackoffPolicy), and the slot time they took in the window.
  std::int64_t backoffs = 0;
  double backoff_s = 0;
  std::int32_t warmup_retried = 0;
  RequestLog requests;  // warm-up first, then window, in send order (some maybe spilled)
  EventColumns events;
  // CellSpec::keep_output: one per request (outputs[i] is requests[i]'s); else empty.
  std::vector<RequestOutput> outputs;
  MetricSamples metrics;
  std::int32_t client_threads = 1;  // the event loops the cell ran with
  double client_cpu_s = 0;          // CPU time of the client's loop threads during the cell
  double loop_lag_max_ms = 0;       // worst event-loop iteration beyond its wait
  bool stopped = false;             // CellRunner::stop() ended it early
  std::string fatal_error;          // set when the cell could not run at all (bad URL, ...)
};

// Live view for progress displays; read from another thread.
struct CellProgress {
  std::atomic<std::int64_t> tokens{0};  // window tokens so far
  std::atomic<std::int64_t> completed{0};
  std::atomic<std::int64_t> errors{0};
  std::atomic<std::int32_t> in_flight{0};
  std::atomic<std::int32_t> first_tokens{0};  // window requests that got their first token
  std::atomic<ns_t> window_start_ns{kNever};  // t0, once the ramp is over
  std::atomic<std::int32_t> warmup_total{0};  // warm-up prompts
  std::atomic<std::int32_t> warmup_done{0};   // of which prefilled (finished OK)

  // The /metrics sampler's latest sample, published from its own thread so a
  // display can show the server's state without scraping /metrics a second
  // time (that would load the server under test).
  struct Metrics {
    std::vector<std::string> names;  // CellSpec::metric_names
    std::vector<double> values;      // aligned with names, NaN where absent; empty: no sample yet
    ns_t t_ns = kNever;              // when that scrape was asked
    std::int64_t samples = 0;        // successful scrapes so far
    std::int64_t failures = 0;       // failed scrapes so far
  };
  Metrics metrics() const;
  // The sampler's side: names once at its start, then each scrape's outcome.
  void metrics_begin(const std::vector<std::string>& names);
  void metrics_sample(const std::vector<double>& values, ns_t t_ns);
  void metrics_failed();

 private:
  mutable std::mutex metrics_mu_;
  Metrics metrics_;
};

class CellRunner {
 public:
  explicit CellRunner(CellSpec spec);
  ~CellRunner();
  // Runs the cell on the calling thread. Call once.
  CellResult run();
  // Thread-safe: ends the cell early (in-flight requests cancelled, records kept).
  void stop() noexcept;
  const CellProgress& progress() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace speedmatrix
