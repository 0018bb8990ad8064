// One cell: warm-up, then a fixed window of closed-loop load at concurrency N
// against one endpoint, with /metrics sampled beside it. The only entry point
// the Python layer calls to measure.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "speedmatrix/clock.hpp"
#include "speedmatrix/openai.hpp"
#include "speedmatrix/records.hpp"

namespace speedmatrix {

struct CellSpec {
  std::string url;                   // full endpoint, e.g. http://127.0.0.1:8000/v1/completions
  std::vector<std::string> headers;  // extra "Name: value" headers
  std::string api_key;  // sent as "Authorization: Bearer ..."; never logged or returned
  ApiKind api = ApiKind::kCompletions;

  // Warm-up: each body is sent once, all at once, and the window starts when
  // all have finished (or warmup_timeout_s passed: the rest are cancelled).
  std::vector<std::string> warmup_bodies;
  double warmup_timeout_s = 600;

  // Window: slot k (0..concurrency-1) sends bodies[k % bodies.size()], and
  // sends it again as soon as it finishes (closed loop).
  std::vector<std::string> bodies;
  std::int32_t concurrency = 1;
  double duration_s = 30;         // window length; at its end everything in flight is cancelled
  std::int64_t max_requests = 0;  // >0: stop starting new requests after this many (window ends
                                  // when they finish; a duration_s > 0 still bounds the window)

  // Open loop (mode "open", open_loop.hpp): arrivals due in [t0, t0 + duration_s)
  // on a pacer's schedule, whatever the server does; concurrency and
  // max_requests are then unused. Window arrival k sends bodies[k % size].
  std::string mode = "closed";       // "closed" | "open"
  double rate_per_s = 0;             // asked arrival rate (requests/s), > 0 for open
  std::string arrival = "poisson";   // "poisson" | "constant" | "gamma"
  double gamma_shape = 1;            // gamma's shape: gap CV = 1/sqrt(shape); 1 = Poisson
  std::int32_t max_concurrency = 0;  // > 0: at most this many in flight; the rest wait (FIFO)
  std::uint64_t seed = 0;            // the pacer's seed: the same seed, the same schedule
  double drain_timeout_s = 60;       // after t0 + D, wait this long for the window's requests

  double connect_timeout_s = 10;
  double idle_timeout_s = 120;  // no byte for this long => "stall"
  bool tls_verify = true;       // https: verify the server's certificate and host name
  std::string ca_file;          // https: CA bundle (PEM) to verify against; "" = the system's
  std::size_t max_event_bytes = 16u << 20;
  bool record_events = true;
  bool server_stamps = false;  // read the engine's "sm_t_ns" stamps (benchmarks)

  // /metrics sampler (empty url = off): polled every metrics_interval_s from
  // before the warm-up to the end of the window.
  std::string metrics_url;
  double metrics_interval_s = 0.25;
  std::vector<std::string> metric_names;
  // Per metric_names entry: "sum" (over label sets: counts of requests on
  // every rank) or "max" (a fraction of each rank's own pool, e.g. KV usage).
  // Missing entries are "sum".
  std::vector<std::string> metric_reduce;
};

struct CellResult {
  ns_t warmup_start_ns = kNever;
  ns_t window_start_ns = kNever;  // t0: when the window's first requests were sent
  ns_t window_end_ns = kNever;    // t0 + D (or when the last request ended, with max_requests)
  ns_t end_ns = kNever;           // everything cancelled and accounted for
  std::vector<RequestRecord> requests;  // warm-up first, then window, in send order
  EventColumns events;
  MetricSamples metrics;
  double client_cpu_s = 0;     // CPU time of the client thread during the cell
  double loop_lag_max_ms = 0;  // worst event-loop iteration beyond its wait
  bool stopped = false;        // CellRunner::stop() ended it early
  std::string fatal_error;     // set when the cell could not run at all (bad URL, ...)
};

// Live view for progress displays; read from another thread.
struct CellProgress {
  std::atomic<std::int64_t> tokens{0};  // window tokens so far
  std::atomic<std::int64_t> completed{0};
  std::atomic<std::int64_t> errors{0};
  std::atomic<std::int32_t> in_flight{0};
  std::atomic<ns_t> window_start_ns{kNever};
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
