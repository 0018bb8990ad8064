// CellRunner end to end against the loopback server: warm-up, the closed-loop
// window and its cancellation, the /metrics sampler, stop(), fatal errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>

#include "loopback_server.hpp"
#include "speedmatrix/cell.hpp"

namespace speedmatrix {
namespace {

using testing::LoopbackServer;
using testing::RouteLog;

constexpr ns_t kMs = 1'000'000;

struct CellTest : ::testing::Test {
  RouteLog log;
  LoopbackServer server{testing::openai_routes(log)};

  CellSpec spec(const std::string& path) {
    CellSpec s;
    s.http.url = server.url(path);
    s.bodies = {R"({"prompt":"a","stream":true})", R"({"prompt":"b","stream":true})"};
    s.concurrency = 4;
    s.duration_s = 0.5;
    s.http.idle_timeout_s = 2;
    return s;
  }
  void wait_disconnects(int n) {
    for (int i = 0; i < 200 && log.disconnects.load() < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
};

TEST_F(CellTest, WarmupThenClosedLoopWindowThenCancellation) {
  CellSpec s = spec("/sse?n=5&itl_ms=20");  // ~80 ms per request
  s.warmup_bodies = {"w0", "w1", "w2", "w3"};
  CellRunner runner(s);
  const CellResult res = runner.run();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  EXPECT_FALSE(res.stopped);
  EXPECT_NE(res.warmup_start_ns, kNever);
  EXPECT_GT(res.window_start_ns, res.warmup_start_ns);
  EXPECT_EQ(res.window_end_ns - res.window_start_ns, 500 * kMs);
  EXPECT_GE(res.end_ns, res.window_end_ns);
  EXPECT_LT(res.end_ns - res.window_end_ns, 50 * kMs);

  int warm = 0, ok = 0, cancelled = 0;
  std::map<std::int32_t, ns_t> last_done_ns;  // per slot, its last window request's end
  for (const RequestRecord& r : res.requests) {
    if (r.phase == Phase::kWarmup) {
      ++warm;
      EXPECT_EQ(r.outcome, Outcome::kOk);
      EXPECT_LT(r.sent_ns - res.warmup_start_ns, 20 * kMs);  // all sent at once
      continue;
    }
    EXPECT_GE(r.sent_ns, res.ramp_start_ns);
    EXPECT_EQ(r.body, r.slot % 2);
    last_done_ns[r.slot] = std::max(last_done_ns[r.slot], r.done_ns);
    if (r.outcome == Outcome::kOk) ++ok;
    if (r.outcome == Outcome::kCancelled) {
      ++cancelled;
      EXPECT_GE(r.done_ns, res.window_end_ns);
    }
    EXPECT_NE(r.outcome, Outcome::kError) << r.error_kind << ": " << r.error_message;
  }
  EXPECT_EQ(warm, 4);
  // Every slot was busy to t0 + D: its last request was cancelled there, or had just
  // ended there (the 4 slots run in lockstep, so a round can end at the deadline, and a
  // slot freed by the last poll before it is not refilled).
  ASSERT_EQ(last_done_ns.size(), 4u);
  for (const auto& [slot, done_ns] : last_done_ns)
    EXPECT_GE(done_ns, res.window_end_ns - 5 * kMs) << "slot " << slot;
  EXPECT_GE(cancelled, 1);
  EXPECT_LE(cancelled, 4);
  EXPECT_GE(ok, 16);  // 4 slots x ~6 rounds of 80 ms in 500 ms
  EXPECT_EQ(runner.progress().completed.load(), ok);
  // The live count is of the window's tokens: the ramp's are dropped when it opens.
  std::int64_t window_tokens = 0;
  for (std::size_t e = 0; e < res.events.size(); ++e) {
    if (res.requests[static_cast<std::size_t>(res.events.request(e))].phase == Phase::kWindow &&
        res.events.t_ns(e) >= res.window_start_ns)
      window_tokens += res.events.tokens(e);
  }
  EXPECT_EQ(runner.progress().tokens.load(), window_tokens);
  // Steady state: the window opened when the last of the 4 slots streamed.
  ns_t last_first = 0;
  for (const RequestRecord& r : res.requests)
    if (r.phase == Phase::kWindow && r.scheduled_ns == res.ramp_start_ns)
      last_first = std::max(last_first, r.first_token_ns);
  EXPECT_EQ(res.window_start_ns, last_first);
  EXPECT_GT(res.window_start_ns, res.ramp_start_ns);
  EXPECT_EQ(res.stopped_by, "duration");
  EXPECT_FALSE(res.ramp_capped);
  EXPECT_EQ(runner.progress().in_flight.load(), 0);
  // Kept-alive connections: warm-up and every refill share the first four.
  EXPECT_EQ(server.connections.load(), 4);
  wait_disconnects(cancelled);
  // the cancelled streams were closed (one whose answer had all left the server by then
  // is not a disconnect mid-stream to it)
  EXPECT_GE(log.disconnects.load(), 1);
  EXPECT_LE(log.disconnects.load(), cancelled);
  EXPECT_GT(res.events.size(), static_cast<std::size_t>(ok * 5));
  EXPECT_GT(res.client_cpu_s, 0);
  EXPECT_LT(res.client_cpu_s, 0.5);
  EXPECT_GE(res.loop_lag_max_ms, 0);
}

TEST_F(CellTest, MaxRequestsEndsWhenTheLastFinishes) {
  CellSpec s = spec("/sse?n=2&itl_ms=5");
  s.concurrency = 3;
  s.duration_s = 0;
  s.max_requests = 10;
  const CellResult res = CellRunner(s).run();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  ASSERT_EQ(res.requests.size(), 10u);
  ns_t last = 0;
  for (const RequestRecord& r : res.requests) {
    EXPECT_EQ(r.outcome, Outcome::kOk);
    last = std::max(last, r.done_ns);
  }
  EXPECT_EQ(res.window_end_ns, last);
}

TEST_F(CellTest, MetricsAreSampledAndSummedOverLabels) {
  CellSpec s = spec("/sse?n=3&itl_ms=20");
  s.metrics_url = server.url("/metrics");
  s.metrics_interval_s = 0.05;
  s.metric_names = {"sglang:num_running_reqs", "sglang:num_queue_reqs", "absent"};
  const CellResult res = CellRunner(s).run();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  const MetricSamples& m = res.metrics;
  EXPECT_EQ(m.names, s.metric_names);
  EXPECT_EQ(m.failures, 0);
  ASSERT_GE(m.t_ns.size(), 5u);
  ASSERT_EQ(m.values.size(), m.t_ns.size() * 3);
  EXPECT_EQ(m.values[0], 7.0);
  EXPECT_EQ(m.values[1], 1.0);
  EXPECT_TRUE(std::isnan(m.values[2]));
  for (std::size_t i = 1; i < m.t_ns.size(); ++i) EXPECT_GT(m.t_ns[i], m.t_ns[i - 1]);
}

TEST_F(CellTest, MetricsLatestSampleIsPublishedLiveInProgress) {
  CellSpec s = spec("/sse?n=3&itl_ms=20");
  s.duration_s = 1;
  s.metrics_url = server.url("/metrics");
  s.metrics_interval_s = 0.05;
  s.metric_names = {"sglang:num_running_reqs", "sglang:token_usage", "absent"};
  s.metric_reduce = {"sum", "max", "sum"};
  CellRunner runner(s);
  CellResult res;
  std::thread t([&] { res = runner.run(); });
  // Read while the cell runs, as a display thread does.
  CellProgress::Metrics live;
  for (int i = 0; i < 400 && live.samples == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    live = runner.progress().metrics();
  }
  t.join();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  ASSERT_GT(live.samples, 0);
  EXPECT_EQ(live.names, s.metric_names);
  ASSERT_EQ(live.values.size(), 3u);
  EXPECT_EQ(live.values[0], 7.0);
  EXPECT_EQ(live.values[1], 0.75);
  EXPECT_TRUE(std::isnan(live.values[2]));
  EXPECT_NE(live.t_ns, kNever);
  // At the end: the last sample of the records, and every scrape counted.
  const CellProgress::Metrics end = runner.progress().metrics();
  ASSERT_FALSE(res.metrics.t_ns.empty());
  EXPECT_EQ(end.samples, static_cast<std::int64_t>(res.metrics.t_ns.size()));
  EXPECT_EQ(end.failures, res.metrics.failures);
  EXPECT_EQ(end.t_ns, res.metrics.t_ns.back());
  EXPECT_EQ(end.values[0], res.metrics.values[res.metrics.values.size() - 3]);
}

TEST_F(CellTest, NoMetricsUrlPublishesNoSample) {
  CellSpec s = spec("/sse?n=2&itl_ms=5");
  s.duration_s = 0.2;
  s.metric_names = {"sglang:num_running_reqs"};
  CellRunner runner(s);
  const CellResult res = runner.run();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  const CellProgress::Metrics m = runner.progress().metrics();
  EXPECT_TRUE(m.names.empty());
  EXPECT_TRUE(m.values.empty());
  EXPECT_EQ(m.samples, 0);
  EXPECT_EQ(m.t_ns, kNever);
}

TEST_F(CellTest, MetricsReduceTakesTheFullestRankOfAPoolFraction) {
  CellSpec s = spec("/sse?n=3&itl_ms=20");
  s.metrics_url = server.url("/metrics");
  s.metrics_interval_s = 0.05;
  s.metric_names = {"sglang:num_running_reqs", "sglang:token_usage", "sglang:token_usage"};
  s.metric_reduce = {"sum", "max"};  // the third (shorter list) is summed
  const CellResult res = CellRunner(s).run();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  ASSERT_GE(res.metrics.t_ns.size(), 1u);
  EXPECT_EQ(res.metrics.values[0], 7.0);
  EXPECT_EQ(res.metrics.values[1], 0.75);
  EXPECT_EQ(res.metrics.values[2], 1.0);
}

TEST_F(CellTest, UnknownMetricReduceIsAFatalErrorOfTheCell) {
  CellSpec s = spec("/sse?n=3&itl_ms=20");
  s.metrics_url = server.url("/metrics");
  s.metric_names = {"x"};
  s.metric_reduce = {"mean"};
  const CellResult res = CellRunner(s).run();
  EXPECT_NE(res.fatal_error.find("metric_reduce"), std::string::npos) << res.fatal_error;
  EXPECT_TRUE(res.requests.empty());
}

TEST_F(CellTest, MetricsFailuresAreCountedNotFatal) {
  CellSpec s = spec("/sse?n=3&itl_ms=20");
  s.duration_s = 0.3;
  s.metrics_url = "http://127.0.0.1:" + std::to_string(testing::refused_port()) + "/metrics";
  s.metrics_interval_s = 0.05;
  s.metric_names = {"x"};
  CellRunner runner(s);
  const CellResult res = runner.run();
  EXPECT_TRUE(res.fatal_error.empty());
  EXPECT_GT(res.metrics.failures, 2);
  EXPECT_TRUE(res.metrics.t_ns.empty());
  EXPECT_GT(res.requests.size(), 4u);
  EXPECT_EQ(runner.progress().metrics().failures, res.metrics.failures);
  EXPECT_EQ(runner.progress().metrics().samples, 0);
}

TEST_F(CellTest, StopFromAnotherThreadEndsEarlyAndKeepsRecords) {
  CellSpec s = spec("/sse?n=10000&itl_ms=10");
  s.duration_s = 60;
  CellRunner runner(s);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    runner.stop();
  });
  const ns_t t = now_ns();
  const CellResult res = runner.run();
  stopper.join();
  EXPECT_LT(now_ns() - t, 1'000 * kMs);
  EXPECT_TRUE(res.stopped);
  ASSERT_EQ(res.requests.size(), 4u);
  for (const RequestRecord& r : res.requests) {
    EXPECT_EQ(r.outcome, Outcome::kCancelled);
    EXPECT_GT(r.output_tokens, 5);
  }
  EXPECT_GT(res.events.size(), 20u);
}

TEST_F(CellTest, StopDuringWarmupSkipsTheWindow) {
  CellSpec s = spec("/sse?n=10000&itl_ms=10");
  s.warmup_bodies = {"w"};
  CellRunner runner(s);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    runner.stop();
  });
  const CellResult res = runner.run();
  stopper.join();
  EXPECT_TRUE(res.stopped);
  EXPECT_EQ(res.window_start_ns, kNever);
  ASSERT_EQ(res.requests.size(), 1u);
  EXPECT_EQ(res.requests[0].outcome, Outcome::kCancelled);
}

TEST_F(CellTest, RefusedEndpointFailsEveryRequestWithoutSpinning) {
  CellSpec s = spec("/");
  s.http.url = "http://127.0.0.1:" + std::to_string(testing::refused_port()) + "/v1/completions";
  s.concurrency = 2;
  s.duration_s = 0.3;
  const CellResult res = CellRunner(s).run();
  EXPECT_TRUE(res.fatal_error.empty());
  ASSERT_FALSE(res.requests.empty());
  EXPECT_LE(res.requests.size(), 2u * 8);  // one attempt per slot per 50 ms
  for (const RequestRecord& r : res.requests) {
    if (r.outcome == Outcome::kCancelled) continue;
    EXPECT_EQ(r.outcome, Outcome::kError);
    EXPECT_EQ(r.error_kind, "connect");
  }
}

// The waits of one slot's window requests: next send minus the previous end.
std::vector<double> slot_waits_s(const CellResult& res, std::int32_t slot) {
  std::vector<double> out;
  const RequestRecord* prev = nullptr;
  for (const RequestRecord& r : res.requests) {
    if (r.phase != Phase::kWindow || r.slot != slot) continue;
    if (prev && r.sent_ns != kNever)
      out.push_back(static_cast<double>(r.sent_ns - prev->done_ns) / 1e9);
    prev = &r;
  }
  return out;
}

TEST_F(CellTest, TooManyRequestsWithRetryAfterIsNotHammered) {
  CellSpec s = spec("/429?ra=1");
  s.concurrency = 4;
  s.duration_s = 1.5;
  const ns_t t = now_ns();
  const CellResult res = CellRunner(s).run();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  EXPECT_EQ(res.stopped_by, "duration");
  EXPECT_LT(now_ns() - t, 3'000 * kMs);
  // At most N x (D / 1 s + 1) requests (50 ms apart per slot before: ~120)
  EXPECT_LE(res.requests.size(), 4u * 3);
  EXPECT_LE(server.requests.load(), 4 * 3);
  for (const RequestRecord& r : res.requests) {
    if (r.outcome == Outcome::kCancelled) continue;
    EXPECT_EQ(r.error_kind, "http_429");
  }
  for (std::int32_t slot = 0; slot < 4; ++slot) {
    const std::vector<double> waits = slot_waits_s(res, slot);
    ASSERT_FALSE(waits.empty()) << slot;
    for (double w : waits) {
      EXPECT_GE(w, 0.999) << slot;
      EXPECT_LT(w, 1.3) << slot;
    }
  }
  // Each slot waited 1 s once, then waited out the window's end (~0.5 s more).
  EXPECT_GE(res.backoffs, 8);
  EXPECT_GT(res.backoff_s, 4 * 1.2);
  // No more than 4 slots' time over the window as it ran (its end is when the loop saw
  // the deadline, a little after t0 + D on a loaded machine).
  const double window_s = static_cast<double>(res.window_end_ns - res.window_start_ns) / 1e9;
  EXPECT_LE(res.backoff_s, 4 * window_s + 1e-6);
}

TEST_F(CellTest, TooManyRequestsWithoutRetryAfterBacksOffMoreEachTime) {
  CellSpec s = spec("/429");
  s.concurrency = 1;
  s.duration_s = 1.6;
  const CellResult res = CellRunner(s).run();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  const std::vector<double> waits = slot_waits_s(res, 0);
  ASSERT_GE(waits.size(), 3u);
  EXPECT_LE(res.requests.size(), 6u);  // 100, 200, 400, 800 ms: 5 sends in 1.6 s
  EXPECT_GE(waits[0], 0.099);
  for (std::size_t k = 1; k < waits.size(); ++k) EXPECT_GE(waits[k], 1.9 * waits[k - 1]) << k;
}

TEST_F(CellTest, ARefusingServerEndsTheCellWithAReason) {
  CellSpec s = spec("/");
  s.http.url = "http://127.0.0.1:" + std::to_string(testing::refused_port()) + "/v1/completions";
  s.concurrency = 2;
  s.duration_s = 60;
  s.unreachable_after_s = 1;
  const ns_t t = now_ns();
  const CellResult res = CellRunner(s).run();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  EXPECT_LT(now_ns() - t, 4'000 * kMs);  // not the 60 s window
  EXPECT_EQ(res.stopped_by, "unreachable");
  EXPECT_FALSE(res.stopped);
  EXPECT_EQ(res.stop_reason.rfind("the server refused ", 0), 0u) << res.stop_reason;
  EXPECT_NE(res.stop_reason.find("connections in a row over 1."), std::string::npos)
      << res.stop_reason;
  // Backing off to 2 s: about a dozen attempts, not 20 per slot per second.
  EXPECT_LE(res.requests.size(), 20u);
  EXPECT_GT(res.backoffs, 0);
  EXPECT_LE(res.window_end_ns, res.end_ns);
}

TEST(CellSpecCheck, FatalErrorsInsteadOfRunning) {
  CellSpec s;
  s.bodies = {"{}"};
  s.http.url = "ftp://127.0.0.1/x";
  EXPECT_NE(CellRunner(s).run().fatal_error, "");
  s.http.url = "http://127.0.0.1:1/v1/completions";
  s.bodies.clear();
  EXPECT_NE(CellRunner(s).run().fatal_error, "");
  s.bodies = {"{}"};
  s.concurrency = 0;
  EXPECT_NE(CellRunner(s).run().fatal_error, "");
  s.concurrency = 1;
  s.duration_s = 0;
  EXPECT_NE(CellRunner(s).run().fatal_error, "");
  CellRunner twice(s);
  twice.run();
  EXPECT_NE(twice.run().fatal_error.find("once"), std::string::npos);
}

}  // namespace
}  // namespace speedmatrix
