#include "speedmatrix/cell.hpp"

#include <sched.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "speedmatrix/http.hpp"
#include "speedmatrix/loops.hpp"
#include "speedmatrix/open_loop.hpp"
#include "speedmatrix/prom.hpp"
#include "speedmatrix/scheduler.hpp"
#include "speedmatrix/stats.hpp"

namespace speedmatrix {
namespace {

// Polls /metrics on its own thread (a blocking easy handle must not sit in
// the streaming loop) every interval, on an absolute schedule so a slow
// scrape does not shift later ones. Failures are counted, never fatal.
class MetricsSampler {
 public:
  MetricsSampler(const CellSpec& spec, MetricSamples& out, CellProgress* progress)
      : spec_(spec), out_(out), progress_(progress) {
    out_.names = spec.metric_names;
    for (const std::string& r : spec.metric_reduce) {
      if (r != "sum" && r != "max")
        throw std::invalid_argument("metric_reduce: '" + r + "' is not sum or max");
      how_.push_back(r == "max" ? Reduce::kMax : Reduce::kSum);
    }
    if (spec.metrics_url.empty()) return;
    if (progress_) progress_->metrics_begin(out_.names);
    thread_ = std::thread([this] { loop(); });
  }
  ~MetricsSampler() { finish(); }

  void finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    const double interval_s = spec_.metrics_interval_s > 0 ? spec_.metrics_interval_s : 0.25;
    const ns_t interval = static_cast<ns_t>(interval_s * 1e9);
    // A scrape may take at most a few intervals (and never less than 1 s).
    HttpGetter getter(spec_.http.headers, spec_.http.api_key, std::max(1.0, 4 * interval_s),
                      spec_.http.tls_verify, spec_.http.ca_file);
    std::string body, error;
    const ns_t start = now_ns();
    for (std::int64_t k = 0;; ++k) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        const ns_t due = start + k * interval;
        const ns_t wait = std::max<ns_t>(due - now_ns(), 0);
        cv_.wait_for(lock, std::chrono::nanoseconds(wait), [this] { return stop_; });
        if (stop_) return;
      }
      const ns_t t = now_ns();  // the sample is stamped when the scrape was asked
      if (!getter.get(spec_.metrics_url, &body, &error)) {
        ++out_.failures;
        if (progress_) progress_->metrics_failed();
        continue;
      }
      const std::vector<double> values = reduce_by_name(parse_prometheus(body), out_.names, how_);
      out_.t_ns.push_back(t);
      out_.values.insert(out_.values.end(), values.begin(), values.end());
      if (progress_) progress_->metrics_sample(values, t);
      // Catch up without a burst when a scrape overran several intervals.
      const ns_t behind = (now_ns() - start) / interval;
      if (behind > k + 1) k = behind - 1;
    }
  }

  const CellSpec& spec_;
  MetricSamples& out_;
  CellProgress* progress_;  // the live view; may be null
  std::vector<Reduce> how_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Every stream holds a socket: make sure the process may open them all (the
// usual soft limit of 1024 would fail connections above ~1000 streams).
void ensure_descriptors(std::int64_t streams) {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return;
  const rlim_t want = static_cast<rlim_t>(streams) + 256;
  if (r.rlim_cur >= want || r.rlim_cur == RLIM_INFINITY) return;
  r.rlim_cur = (r.rlim_max == RLIM_INFINITY || r.rlim_max > want) ? want : r.rlim_max;
  setrlimit(RLIMIT_NOFILE, &r);
}

ns_t seconds_to_ns(double s) {
  if (!(s > 0)) return 0;
  if (s > 1e9) return std::numeric_limits<ns_t>::max() / 4;
  return static_cast<ns_t>(s * 1e9);
}

}  // namespace

CellProgress::Metrics CellProgress::metrics() const {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  return metrics_;
}

void CellProgress::metrics_begin(const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  metrics_ = Metrics{};
  metrics_.names = names;
}

void CellProgress::metrics_sample(const std::vector<double>& values, ns_t t_ns) {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  metrics_.values = values;
  metrics_.t_ns = t_ns;
  ++metrics_.samples;
}

void CellProgress::metrics_failed() {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  ++metrics_.failures;
}

struct CellRunner::Impl {
  CellSpec spec;
  CellProgress progress;
  std::atomic<bool> stop{false};
  std::atomic<bool> ran{false};
  std::mutex group_mu;         // guards `group` against stop() racing its destruction
  LoopGroup* group = nullptr;  // the loops' group while they run (it wakes their transports)
};

CellRunner::CellRunner(CellSpec spec) : impl_(std::make_unique<Impl>()) {
  impl_->spec = std::move(spec);
}

CellRunner::~CellRunner() = default;

const CellProgress& CellRunner::progress() const noexcept { return impl_->progress; }

void CellRunner::stop() noexcept {
  impl_->stop.store(true);
  std::lock_guard<std::mutex> lock(impl_->group_mu);
  if (impl_->group) impl_->group->wake_all();
}

namespace {

// The spec's fields checked: "" or a one-line reason.
std::string check_spec(const CellSpec& spec) {
  if (spec.http.url.empty()) return "CellSpec.url is empty";
  if (spec.bodies.empty()) return "CellSpec.bodies is empty";
  if (spec.mode != "closed") return check_open_loop(spec);
  if (spec.concurrency < 1) return "CellSpec.concurrency must be >= 1";
  if (!(spec.duration_s > 0) && spec.max_requests <= 0 && !spec.chain)
    return "CellSpec needs duration_s > 0 or max_requests > 0";
  if (spec.chain && (spec.chain->sessions() != spec.concurrency ||
                     spec.bodies.size() != static_cast<std::size_t>(spec.concurrency)))
    return "CellSpec.chain needs concurrency == its sessions == len(bodies) (one first turn each)";
  if (std::isnan(spec.precision) || spec.precision < 0 || spec.precision >= 1)
    return "CellSpec.precision must be in [0, 1) (0.02 = 2%)";
  return check_url(spec.http.url);
}

ClosedLoopPlan closed_loop_plan(const CellSpec& spec) {
  ClosedLoopPlan plan;
  plan.warmup_bodies.assign(spec.warmup_bodies.begin(), spec.warmup_bodies.end());
  plan.bodies.assign(spec.bodies.begin(), spec.bodies.end());
  plan.warmup_timeout_ns = seconds_to_ns(spec.warmup_timeout_s);
  plan.warmup_retries = std::max<std::int32_t>(spec.warmup_retries, 0);
  plan.concurrency = spec.concurrency;
  plan.duration_ns = seconds_to_ns(spec.duration_s);
  plan.max_requests = spec.max_requests;
  plan.steady_window = spec.steady_window;
  plan.ramp_cap_ns = seconds_to_ns(spec.ramp_cap_s);
  plan.plateau_settle_ns = seconds_to_ns(spec.plateau_settle_s);
  plan.stall_min_ns = spec.http.record_events ? seconds_to_ns(spec.stall_min_s) : 0;
  plan.stall_gap_factor = spec.stall_gap_factor;
  plan.stall_pause_cap_ns = seconds_to_ns(spec.stall_pause_cap_s);
  plan.backoff.give_up_ns = seconds_to_ns(spec.unreachable_after_s);
  plan.min_duration_ns = seconds_to_ns(spec.min_duration_s);
  plan.check_interval_ns = std::max<ns_t>(seconds_to_ns(spec.precision_check_s), 100'000'000);
  plan.chain = spec.chain.get();
  return plan;
}

// The precision stop: the figures so far, by the same function the final figures come
// from (on the loop's thread, between polls: the records are not being written).
std::function<bool(ns_t, ns_t)> precision_check(CellRecords& records, double target, double min_s) {
  return [&records, target, min_s](ns_t t0, ns_t now) {
    const std::size_t n = records.requests.size();
    std::vector<ns_t> sent(n), first(n), done(n);
    std::vector<std::uint8_t> outcome(n), phase(n);
    std::vector<std::int64_t> prompt(n, -1);
    records.requests.for_each(0, n, [&](std::size_t i, const RequestRecord& q) {
      sent[i] = q.sent_ns;
      first[i] = q.first_token_ns;
      done[i] = q.done_ns;
      outcome[i] = static_cast<std::uint8_t>(q.outcome);
      phase[i] = static_cast<std::uint8_t>(q.phase);
    });
    RecordView v;
    v.sent_ns = sent;
    v.first_token_ns = first;
    v.done_ns = done;
    v.outcome = outcome;
    v.phase = phase;
    v.prompt_tokens = prompt;
    // One pass over the events, spilled ones read back in blocks (records.hpp): no copy
    // of the columns; the same figures as summarize_cell (stats.hpp PrecisionScan).
    PrecisionScan scan(v, t0, now);
    records.events.for_each(0, records.events.size(),
                            [&scan](std::size_t, std::int32_t q, ns_t t, std::int32_t tokens) {
                              scan.add(q, t, tokens);
                            });
    CellFigures f = scan.finish();
    if (!scan.ordered()) {  // never from the transport; exact all the same
      const EventColumns::Plain p = records.events.plain_copy();
      v.ev_request = {p.request.data(), p.request.size()};
      v.ev_t_ns = {p.t_ns.data(), p.t_ns.size()};
      v.ev_tokens = {p.tokens.data(), p.tokens.size()};
      f = summarize_cell(v, t0, now);
    }
    return precision_stop(f, target, static_cast<double>(now - t0) / 1e9, min_s);
  };
}

const char* stop_name(StopReason r) {
  switch (r) {
    case StopReason::kDuration:
      return "duration";
    case StopReason::kPrecision:
      return "precision";
    case StopReason::kRequests:
      return "requests";
    case StopReason::kStop:
      return "stop";
    case StopReason::kUnreachable:
      return "unreachable";
  }
  return "";
}

void copy_times(const ScheduleTimes& times, CellResult& res) {
  res.warmup_start_ns = times.warmup_start_ns;
  res.ramp_start_ns = times.ramp_start_ns;
  res.window_start_ns = times.window_start_ns;
  res.ramp_capped = times.ramp_capped;
  res.stalls = times.stalls;
  res.backoffs = times.backoffs;
  res.backoff_s = static_cast<double>(times.backoff_ns) / 1e9;
  res.stop_reason = times.stop_reason;
  res.warmup_retried = times.warmup_retried;
  res.stopped_by = stop_name(times.stopped_by);
  res.window_end_ns = times.window_end_ns;
  res.end_ns = times.end_ns;
  res.stopped = times.stopped;
}

}  // namespace

namespace {

// The loops the cell runs (CellSpec::client_threads).
std::int32_t loops_for(const CellSpec& spec, std::int64_t streams) {
  if (spec.precision > 0) return 1;  // the precision stop reads one loop's records
  if (spec.chain) return 1;          // one loop takes the chain's pushes
  if (spec.mode == "open" && spec.max_concurrency > 0) return 1;  // one FIFO gate
  const auto cores = static_cast<std::int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  std::int32_t n = auto_client_threads(spec.client_threads, streams, cores);
  if (spec.mode != "open") n = std::min(n, spec.concurrency);
  return std::max(n, 1);
}

// One loop's run and what it leaves.
struct LoopOut {
  ScheduleTimes times;
  double cpu_s = 0;
  double lag_ms = 0;
  std::string error;  // what it threw
};

// Runs loop `i` of `group` on the calling thread into `records`.
void run_loop(const CellSpec& spec, const HttpOptions& opt, ClosedLoopPlan plan, LoopGroup& group,
              std::int32_t i, CellRecords& records, const std::atomic<bool>& stop,
              CellProgress* progress, LoopOut& out) {
  try {
    CurlTransport transport(opt, records, progress);
    group.attach(i, &transport);
    struct Detach {
      LoopGroup& g;
      std::int32_t i;
      ~Detach() { g.attach(i, nullptr); }
    } detach{group, i};
    if (stop.load()) transport.wake();  // a stop before the attach
    plan.group = &group;
    plan.loop = i;
    SystemClock clock;
    const ns_t cpu0 = thread_cpu_ns();
    out.times = spec.mode == "open"
                    ? run_open_loop_cell(spec, transport, clock, records, stop, progress, &group, i)
                    : run_closed_loop(plan, transport, clock, records, stop, progress);
    out.cpu_s = static_cast<double>(thread_cpu_ns() - cpu0) / 1e9;
    out.lag_ms = transport.loop_lag_max_ms();
  } catch (const std::exception& e) {
    out.error = e.what();
    group.abort(out.error);  // the other loops end too
  }
}

// Loops 1..N-1 on their own threads (pinned to CPUs 1..N-1 where allowed), loop 0 on the
// calling thread (CPU 0); their records merged into `records`.
std::vector<LoopOut> run_loops(const CellSpec& spec, const HttpOptions& opt,
                               const ClosedLoopPlan& plan, LoopGroup& group, CellRecords& records,
                               const std::atomic<bool>& stop, CellProgress* progress) {
  const std::int32_t n = group.loops();
  std::vector<LoopOut> out(static_cast<std::size_t>(n));
  if (n == 1) {
    run_loop(spec, opt, plan, group, 0, records, stop, progress, out[0]);
    return out;
  }
  std::vector<CellRecords> parts(static_cast<std::size_t>(n));
  for (CellRecords& p : parts) {
    p.events.configure_spill(spec.spill_events, spec.spill_dir);
    p.requests.configure_spill(spec.spill_requests, spec.spill_dir);
  }
  std::vector<std::thread> threads;
  for (std::int32_t i = 1; i < n; ++i) {
    threads.emplace_back([&, i] {
      pin_to_cpu(i);
      const auto k = static_cast<std::size_t>(i);
      run_loop(spec, opt, plan, group, i, parts[k], stop, progress, out[k]);
    });
  }
  cpu_set_t before;
  const bool had = sched_getaffinity(0, sizeof before, &before) == 0;
  pin_to_cpu(0);
  run_loop(spec, opt, plan, group, 0, parts[0], stop, progress, out[0]);
  if (had) sched_setaffinity(0, sizeof before, &before);  // the caller's thread as it was
  for (std::thread& t : threads) t.join();
  merge_loop_records(parts, records);
  return out;
}

}  // namespace

CellResult CellRunner::run() {
  CellResult res;
  Impl& m = *impl_;
  const CellSpec& spec = m.spec;
  res.metrics.names = spec.metric_names;
  if (m.ran.exchange(true)) {
    res.fatal_error = "CellRunner::run() may be called only once";
    return res;
  }
  // Whatever ends the cell (all done, its duration, a stop, a bad spec, a failure), the
  // chain's feeder stops waiting and its pushes are refused.
  struct CloseChain {
    ChainFeed* chain;
    ~CloseChain() {
      if (chain) chain->close();
    }
  } close_chain{spec.chain.get()};
  res.fatal_error = check_spec(spec);
  if (!res.fatal_error.empty()) return res;

  const std::int64_t streams =
      spec.mode == "open" ? open_loop_stream_bound(spec) : std::int64_t{spec.concurrency};
  const std::int32_t loops = loops_for(spec, streams);
  HttpOptions opt = spec.http;
  const std::int64_t most =
      std::max<std::int64_t>(streams, static_cast<std::int64_t>(spec.warmup_bodies.size()));
  ensure_descriptors(most);
  opt.max_concurrency = static_cast<std::int32_t>((most + loops - 1) / loops);  // each loop's
  opt.keep_output = spec.keep_output;
  opt.keep_output_max_bytes = spec.keep_output_max_bytes;

  ClosedLoopPlan plan = closed_loop_plan(spec);
  CellRecords records;
  records.events.configure_spill(spec.spill_events, spec.spill_dir);
  records.requests.configure_spill(spec.spill_requests, spec.spill_dir);
  records.events.reserve(1u << 16);
  if (spec.precision > 0)
    plan.should_end = precision_check(records, spec.precision, spec.min_duration_s);
  LoopGroup group(loops, spec.mode == "open" ? 0 : spec.concurrency);
  {
    std::lock_guard<std::mutex> lock(m.group_mu);
    m.group = &group;
  }
  std::vector<LoopOut> outs;
  try {
    MetricsSampler sampler(spec, res.metrics, &m.progress);
    outs = run_loops(spec, opt, plan, group, records, m.stop, &m.progress);
    sampler.finish();
  } catch (const std::exception& e) {
    res.fatal_error = e.what();
  }
  {
    std::lock_guard<std::mutex> lock(m.group_mu);
    m.group = nullptr;
  }
  std::vector<ScheduleTimes> times;
  for (const LoopOut& o : outs) {
    if (!o.error.empty() && res.fatal_error.empty()) res.fatal_error = o.error;
    times.push_back(o.times);
    res.client_cpu_s += o.cpu_s;
    res.loop_lag_max_ms = std::max(res.loop_lag_max_ms, o.lag_ms);
  }
  if (res.fatal_error.empty()) copy_times(merge_loop_times(times), res);
  res.client_threads = loops;
  res.requests = std::move(records.requests);
  res.events = std::move(records.events);
  res.outputs = std::move(records.outputs);
  if (spec.keep_output) res.outputs.resize(res.requests.size());  // one a request, sent or not
  return res;
}

}  // namespace speedmatrix
