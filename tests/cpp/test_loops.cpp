// Many event loops for one cell (loops.hpp): the dealing, the shared window and budget,
// the exact merge of the loops' records, and CellRunner with client_threads > 1 against
// the loopback server.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "loopback_server.hpp"
#include "speedmatrix/cell.hpp"
#include "speedmatrix/loops.hpp"

namespace speedmatrix {
namespace {

using testing::LoopbackServer;
using testing::RouteLog;

constexpr ns_t kMs = 1'000'000;

TEST(LoopGroup, DealsSlotsRoundRobin) {
  const LoopGroup g(3, 7);
  EXPECT_EQ(g.share(0, 7), 3);  // 0, 3, 6
  EXPECT_EQ(g.share(1, 7), 2);  // 1, 4
  EXPECT_EQ(g.share(2, 7), 2);  // 2, 5
  EXPECT_EQ(g.share(2, 2), 0);
  EXPECT_EQ(g.share(3, 7), 0);
  const LoopGroup one(1, 5);
  EXPECT_EQ(one.share(0, 5), 5);
}

TEST(LoopGroup, AutoThreadsFollowTheStreamsAndLeaveACore) {
  struct Row {
    std::int32_t asked;
    std::int64_t streams;
    std::int32_t cores, want;
  };
  for (const Row& r :
       {Row{0, 1, 16, 1}, Row{0, 256, 16, 1}, Row{0, 257, 16, 2}, Row{0, 4096, 16, 15},
        Row{0, 4096, 2, 1}, Row{0, 4096, 1, 1}, Row{3, 1, 2, 3}, Row{5000, 1, 2, 1024}})
    EXPECT_EQ(auto_client_threads(r.asked, r.streams, r.cores), r.want)
        << r.asked << " " << r.streams << " " << r.cores;
}

TEST(LoopGroup, TheWindowOpensOverEverySlotOfEveryLoop) {
  LoopGroup g(2, 4);
  bool capped = true;
  g.note_first_token(0, 100);
  g.note_first_token(1, 150);
  g.note_first_token(2, 120);
  EXPECT_EQ(g.open_window(0, 200, 10'000, 0, &capped), kNever);  // slot 3 has not streamed
  g.note_first_token(3, 300);
  g.note_first_token(3, 999);  // a second report of a slot is ignored
  EXPECT_EQ(g.open_window(0, 310, 10'000, 0, &capped), 300);
  EXPECT_FALSE(capped);
  EXPECT_EQ(g.t0(), 300);
  EXPECT_EQ(g.open_window(0, 5'000, 10'000, 0, &capped), 300);  // once found, fixed
}

TEST(LoopGroup, AWholeWaveOfFailuresOpensTheWindowAtOnce) {
  LoopGroup g(2, 2);
  g.note_ramp_failure();
  EXPECT_EQ(g.open_window(0, 50, 10'000, 0, nullptr), kNever);
  g.note_ramp_failure();
  EXPECT_EQ(g.open_window(0, 60, 10'000, 0, nullptr), 60);
}

TEST(LoopGroup, TheBudgetIsSpentOnceAcrossThreads) {
  LoopGroup g(4, 4);
  std::atomic<int> taken{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&] {
      for (int k = 0; k < 1000; ++k)
        if (g.take_request(1234)) ++taken;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(taken.load(), 1234);
  EXPECT_FALSE(g.budget_left(1234));
  EXPECT_TRUE(g.take_request(0));  // unbounded
}

TEST(LoopGroup, TheBarrierReturnsOneStartAndAStopOrAbortFreesIt) {
  LoopGroup g(3, 3);
  SystemClock clock;
  std::atomic<bool> stop{false};
  std::vector<ns_t> got(3);
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i) ts.emplace_back([&, i] { got[i] = g.arrive(clock, stop); });
  for (auto& t : ts) t.join();
  EXPECT_NE(got[0], kNever);
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[1], got[2]);

  LoopGroup h(2, 2);
  std::thread waiter([&] { got[0] = h.arrive(clock, stop); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  h.abort("loop 1 could not start");
  waiter.join();
  EXPECT_EQ(got[0], kNever);
  EXPECT_TRUE(h.aborted());
  h.abort("a second reason");
  EXPECT_EQ(h.abort_reason(), "loop 1 could not start");
}

TEST(DealtPacer, TheLoopsTogetherRunTheOneSchedule) {
  std::string why;
  auto global = make_pacer("poisson", 500, 1, 7, &why);
  ASSERT_TRUE(global) << why;
  std::vector<ns_t> want;
  for (std::int64_t k = 0; k < 300; ++k) want.push_back(global->due_ns(k));
  std::vector<ns_t> got(300, kNever);
  for (std::int32_t i = 0; i < 3; ++i) {
    DealtPacer p(make_pacer("poisson", 500, 1, 7, &why), i, 3);
    for (std::int64_t k = 0; p.global_index(k) < 300; ++k)
      got[static_cast<std::size_t>(p.global_index(k))] = p.due_ns(k);
  }
  EXPECT_EQ(got, want);
  DealtPacer bounded(std::make_unique<ConstantPacer>(10.0, 5), 1, 2);  // global 1, 3, then none
  EXPECT_EQ(bounded.due_ns(0), 100 * kMs);
  EXPECT_EQ(bounded.due_ns(1), 300 * kMs);
  EXPECT_EQ(bounded.due_ns(2), kNever);
}

RequestRecord record(Phase phase, std::int32_t slot, ns_t sent) {
  RequestRecord r;
  r.phase = phase;
  r.slot = r.body = slot;
  r.sent_ns = sent;
  r.done_ns = sent == kNever ? 50 : sent + 10;
  r.outcome = Outcome::kOk;
  return r;
}

TEST(MergeLoopRecords, OrdersByPhaseAndSendAndRenumbersTheEvents) {
  std::vector<CellRecords> parts(2);
  // loop 0: warm-up slot 0 at 5, window slots 0 at 20 and 2 at 40
  parts[0].requests.push_back(record(Phase::kWarmup, 0, 5));
  parts[0].requests.push_back(record(Phase::kWindow, 0, 20));
  parts[0].requests.push_back(record(Phase::kWindow, 2, 40));
  parts[0].events.push(1, 25, 1, kNever);
  parts[0].events.push(2, 45, 2, 44);
  // loop 1: warm-up slot 1 at 6, window slot 1 at 20 (a tie with loop 0), slot 3 never sent
  parts[1].requests.push_back(record(Phase::kWarmup, 1, 6));
  parts[1].requests.push_back(record(Phase::kWindow, 1, 20));
  parts[1].requests.push_back(record(Phase::kWindow, 3, kNever));
  parts[1].events.push(1, 22, 3, kNever);
  parts[1].events.push(1, 45, 4, kNever);
  CellRecords out;
  merge_loop_records(parts, out);
  ASSERT_EQ(out.requests.size(), 6u);
  const std::vector<std::int32_t> slots = {0, 1, 0, 1, 2, 3};
  const std::vector<Phase> phases = {Phase::kWarmup, Phase::kWarmup, Phase::kWindow,
                                     Phase::kWindow, Phase::kWindow, Phase::kWindow};
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(out.requests[i].slot, slots[i]) << i;
    EXPECT_EQ(out.requests[i].phase, phases[i]) << i;
  }
  ASSERT_EQ(out.events.size(), 4u);
  // by time, a tie (45) in loop order; request ids renumbered
  EXPECT_EQ(out.events.t_ns(0), 22);
  EXPECT_EQ(out.events.request(0), 3);
  EXPECT_EQ(out.events.tokens(0), 3);
  EXPECT_EQ(out.events.t_ns(1), 25);
  EXPECT_EQ(out.events.request(1), 2);
  EXPECT_EQ(out.events.t_ns(2), 45);
  EXPECT_EQ(out.events.request(2), 4);
  EXPECT_EQ(out.events.server_ns(2), 44);
  EXPECT_EQ(out.events.request(3), 3);
  EXPECT_TRUE(parts.empty());
}

TEST(MergeLoopTimes, SumsCountsAndKeepsTheStopThatEndedTheCell) {
  std::vector<ScheduleTimes> parts(2);
  for (ScheduleTimes& p : parts) {
    p.ramp_start_ns = 100;
    p.window_start_ns = 200;
  }
  parts[0].warmup_start_ns = 12;
  parts[1].warmup_start_ns = 10;
  parts[0].window_end_ns = 900;
  parts[1].window_end_ns = 950;
  parts[0].end_ns = 1'000;
  parts[1].end_ns = 990;
  parts[0].stalls = 2;
  parts[1].stalls = 3;
  parts[1].backoffs = 1;
  parts[1].backoff_ns = 70;
  parts[1].stopped_by = StopReason::kUnreachable;
  parts[1].stop_reason = "the server refused 5 connections";
  ScheduleTimes m = merge_loop_times(parts);
  EXPECT_EQ(m.warmup_start_ns, 10);
  EXPECT_EQ(m.window_start_ns, 200);
  EXPECT_EQ(m.window_end_ns, 950);
  EXPECT_EQ(m.end_ns, 1'000);
  EXPECT_EQ(m.stalls, 5);
  EXPECT_EQ(m.backoffs, 1);
  EXPECT_EQ(m.backoff_ns, 70);
  EXPECT_EQ(m.stopped_by, StopReason::kUnreachable);
  EXPECT_EQ(m.stop_reason, "the server refused 5 connections");
  parts[0].stopped_by = StopReason::kStop;
  m = merge_loop_times(parts);
  EXPECT_TRUE(m.stopped);
  EXPECT_EQ(m.stopped_by, StopReason::kStop);
}

struct LoopsCell : ::testing::Test {
  RouteLog log;
  LoopbackServer server{testing::openai_routes(log)};

  CellSpec spec(const std::string& path) {
    CellSpec s;
    s.http.url = server.url(path);
    s.bodies = {R"({"prompt":"a","stream":true})", R"({"prompt":"b","stream":true})",
                R"({"prompt":"c","stream":true})"};
    s.concurrency = 5;
    s.duration_s = 0.5;
    s.http.idle_timeout_s = 2;
    s.client_threads = 2;
    return s;
  }
};

// The merged records read as one loop's would: send order, every slot with its own body,
// events in time order each inside its request.
void expect_one_loops_records(const CellResult& res, std::int32_t slots) {
  std::set<std::int32_t> seen;
  ns_t last_sent = 0;
  Phase last_phase = Phase::kWarmup;
  for (const RequestRecord& r : res.requests) {
    if (r.phase == last_phase) EXPECT_GE(r.sent_ns, last_sent);
    EXPECT_GE(static_cast<int>(r.phase), static_cast<int>(last_phase));
    last_phase = r.phase;
    last_sent = r.sent_ns;
    if (r.phase != Phase::kWindow) continue;
    EXPECT_EQ(r.body, r.slot % 3);
    EXPECT_NE(r.outcome, Outcome::kError) << r.error_message;
    seen.insert(r.slot);
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(slots));
  ns_t last_t = 0;
  for (std::size_t e = 0; e < res.events.size(); ++e) {
    const ns_t t = res.events.t_ns(e);
    EXPECT_GE(t, last_t);
    last_t = t;
    const RequestRecord& r = res.requests[static_cast<std::size_t>(res.events.request(e))];
    EXPECT_GE(t, r.sent_ns);
    EXPECT_LE(t, r.done_ns);
  }
}

TEST_F(LoopsCell, TwoLoopsRunTheClosedLoopAsOne) {
  CellSpec s = spec("/sse?n=5&itl_ms=20");
  s.warmup_bodies = {"w0", "w1", "w2"};
  CellRunner runner(s);
  const CellResult res = runner.run();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  EXPECT_EQ(res.client_threads, 2);
  EXPECT_EQ(res.stopped_by, "duration");
  EXPECT_EQ(res.window_end_ns - res.window_start_ns, 500 * kMs);
  EXPECT_GT(res.window_start_ns, res.ramp_start_ns);
  std::set<std::int32_t> warm;
  for (const RequestRecord& r : res.requests)
    if (r.phase == Phase::kWarmup) warm.insert(r.slot);
  EXPECT_EQ(warm, (std::set<std::int32_t>{0, 1, 2}));
  expect_one_loops_records(res, 5);
  // The window opened when the last of the 5 slots (over both loops) streamed.
  ns_t last_first = 0;
  for (const RequestRecord& r : res.requests)
    if (r.phase == Phase::kWindow && r.scheduled_ns == res.ramp_start_ns)
      last_first = std::max(last_first, r.first_token_ns);
  EXPECT_EQ(res.window_start_ns, last_first);
  EXPECT_EQ(runner.progress().in_flight.load(), 0);
  std::int64_t window_tokens = 0;
  for (std::size_t e = 0; e < res.events.size(); ++e) {
    if (res.requests[static_cast<std::size_t>(res.events.request(e))].phase == Phase::kWindow &&
        res.events.t_ns(e) >= res.window_start_ns)
      window_tokens += res.events.tokens(e);
  }
  EXPECT_EQ(runner.progress().tokens.load(), window_tokens);
  EXPECT_GT(res.client_cpu_s, 0);
}

TEST_F(LoopsCell, TheRequestBudgetIsTheCellsNotEachLoops) {
  CellSpec s = spec("/sse?n=2&itl_ms=5");
  s.duration_s = 0;
  s.max_requests = 11;
  s.client_threads = 3;
  const CellResult res = CellRunner(s).run();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  EXPECT_EQ(res.client_threads, 3);
  ASSERT_EQ(res.requests.size(), 11u);
  ns_t last = 0;
  for (const RequestRecord& r : res.requests) {
    EXPECT_EQ(r.outcome, Outcome::kOk);
    last = std::max(last, r.done_ns);
  }
  EXPECT_EQ(res.window_end_ns, last);
  EXPECT_EQ(res.stopped_by, "requests");
}

TEST_F(LoopsCell, TheOpenLoopDealsTheOneScheduleAndSharesT0) {
  CellSpec s = spec("/sse?n=2&itl_ms=5");
  s.mode = "open";
  s.arrival = "constant";
  s.rate_per_s = 100;
  s.client_threads = 3;
  const CellResult res = CellRunner(s).run();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  EXPECT_EQ(res.client_threads, 3);
  std::vector<ns_t> due(50, kNever);
  for (const RequestRecord& r : res.requests) {
    ASSERT_GE(r.slot, 0);
    ASSERT_LT(r.slot, 50);
    due[static_cast<std::size_t>(r.slot)] = r.scheduled_ns;
    EXPECT_EQ(r.body, r.slot % 3);
    EXPECT_EQ(r.outcome, Outcome::kOk);
  }
  for (std::size_t k = 0; k < due.size(); ++k)  // arrival k due at t0 + k x 10 ms
    EXPECT_EQ(due[k], res.window_start_ns + static_cast<ns_t>(k) * 10 * kMs) << k;
  expect_one_loops_records(res, 50);
}

TEST_F(LoopsCell, AStopEndsEveryLoop) {
  CellSpec s = spec("/sse?n=10000&itl_ms=10");
  s.duration_s = 60;
  s.client_threads = 2;
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
  EXPECT_EQ(res.stopped_by, "stop");
  ASSERT_EQ(res.requests.size(), 5u);
  for (const RequestRecord& r : res.requests) EXPECT_EQ(r.outcome, Outcome::kCancelled);
}

TEST_F(LoopsCell, ARefusingServerEndsEveryLoopWithTheReason) {
  CellSpec s = spec("/");
  s.http.url = "http://127.0.0.1:" + std::to_string(testing::refused_port()) + "/v1/completions";
  s.duration_s = 30;
  s.unreachable_after_s = 0.3;
  const ns_t t = now_ns();
  const CellResult res = CellRunner(s).run();
  EXPECT_LT(now_ns() - t, 10'000 * kMs);
  EXPECT_EQ(res.stopped_by, "unreachable");
  EXPECT_NE(res.stop_reason.find("refused"), std::string::npos) << res.stop_reason;
}

TEST_F(LoopsCell, APrecisionStopAndFewerSlotsThanLoopsLimitTheLoops) {
  CellSpec s = spec("/sse?n=3&itl_ms=5");
  s.duration_s = 0.3;
  s.precision = 0.5;
  s.min_duration_s = 0.1;
  EXPECT_EQ(CellRunner(s).run().client_threads, 1);
  CellSpec few = spec("/sse?n=3&itl_ms=5");
  few.duration_s = 0.2;
  few.concurrency = 2;
  few.client_threads = 8;
  const CellResult res = CellRunner(few).run();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  EXPECT_EQ(res.client_threads, 2);
  expect_one_loops_records(res, 2);
}

}  // namespace
}  // namespace speedmatrix
