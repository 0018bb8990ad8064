// The open loop and its pacers against a fake clock and a fake transport:
// requests take scripted durations; nothing sleeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "speedmatrix/cell.hpp"
#include "speedmatrix/open_loop.hpp"
#include "speedmatrix/scheduler.hpp"

namespace speedmatrix {
namespace {

constexpr ns_t kMs = 1'000'000;
constexpr ns_t kStart = 1'000 * kMs;

class FakeClock final : public Clock {
 public:
  ns_t now() override { return t; }
  ns_t t = kStart;
};

// Each request lasts duration(record) ns, then ends kOk.
class FakeTransport final : public Transport {
 public:
  FakeTransport(FakeClock& c, CellRecords& r) : clock(c), records(r) {}
  void start(std::int32_t id, std::string_view) override {
    RequestRecord& rec = records.requests[static_cast<std::size_t>(id)];
    rec.sent_ns = clock.t;
    ends[id] = clock.t + duration(rec);
    max_in_flight = std::max<std::int32_t>(max_in_flight, static_cast<std::int32_t>(ends.size()));
  }
  void cancel(std::int32_t id) override {
    ASSERT_TRUE(ends.count(id)) << "cancel of a request not in flight: " << id;
    ends.erase(id);
    RequestRecord& rec = records.requests[static_cast<std::size_t>(id)];
    rec.outcome = Outcome::kCancelled;
    rec.done_ns = clock.t;
    ++cancels;
  }
  void poll(ns_t deadline, std::vector<std::int32_t>& finished) override {
    ns_t next = deadline;
    for (auto& [id, end] : ends) next = std::min(next, end);
    if (next == kNoDeadline) {
      ADD_FAILURE() << "poll without deadline or work";
      return;
    }
    clock.t = std::max(clock.t, next);
    for (auto it = ends.begin(); it != ends.end();) {
      if (it->second <= clock.t) {
        RequestRecord& rec = records.requests[static_cast<std::size_t>(it->first)];
        rec.done_ns = clock.t;
        rec.error_kind = fail_kind(rec);
        rec.outcome = rec.error_kind.empty() ? Outcome::kOk : Outcome::kError;
        finished.push_back(it->first);
        it = ends.erase(it);
      } else {
        ++it;
      }
    }
  }
  void wake() noexcept override {}

  FakeClock& clock;
  CellRecords& records;
  std::function<ns_t(const RequestRecord&)> duration = [](const RequestRecord&) {
    return 100 * kMs;
  };
  // "" = the request ends kOk; else it fails with this error kind
  std::function<std::string(const RequestRecord&)> fail_kind = [](const RequestRecord&) {
    return std::string();
  };
  std::map<std::int32_t, ns_t> ends;
  std::int32_t max_in_flight = 0;
  int cancels = 0;
};

struct OpenLoopTest : ::testing::Test {
  FakeClock clock;
  CellRecords records;
  FakeTransport transport{clock, records};
  std::atomic<bool> stop{false};
  CellProgress progress;
  OpenLoopPlan plan;

  ScheduleTimes run(Pacer& p) {
    return run_open_loop(plan, p, transport, clock, records, stop, &progress);
  }
  std::vector<const RequestRecord*> window() const {
    std::vector<const RequestRecord*> w;
    for (const auto& r : records.requests)
      if (r.phase == Phase::kWindow) w.push_back(&r);
    return w;
  }
};

// Gaps of a pacer's first n arrivals.
std::vector<double> gaps_s(Pacer& p, int n) {
  std::vector<double> g;
  ns_t last = p.due_ns(0);
  for (int k = 1; k < n; ++k) {
    const ns_t t = p.due_ns(k);
    g.push_back(static_cast<double>(t - last) / 1e9);
    last = t;
  }
  return g;
}

struct Moments {
  double mean, cv;
};
Moments moments(const std::vector<double>& x) {
  double s = 0, ss = 0;
  for (double v : x) s += v;
  const double m = s / static_cast<double>(x.size());
  for (double v : x) ss += (v - m) * (v - m);
  return {m, std::sqrt(ss / static_cast<double>(x.size() - 1)) / m};
}

struct PacerCase {
  std::string arrival;
  double rate, shape, cv;
};

TEST(PacerTable, MeanRateAndCoefficientOfVariation) {
  const PacerCase cases[] = {
      {"constant", 512, 1, 0},
      {"poisson", 0.5, 1, 1},
      {"poisson", 100, 1, 1},
      {"gamma", 10, 1, 1},
      {"gamma", 10, 0.25, 2},
      {"gamma", 10, 4, 0.5},
      {"gamma", 2000, 0.5, std::sqrt(2.0)},
  };
  for (const PacerCase& c : cases) {
    SCOPED_TRACE(c.arrival + " rate " + std::to_string(c.rate) + " shape " +
                 std::to_string(c.shape));
    std::string why;
    auto p = make_pacer(c.arrival, c.rate, c.shape, 7, &why);
    ASSERT_TRUE(p) << why;
    EXPECT_EQ(make_pacer(c.arrival, c.rate, c.shape, 7, &why)->due_ns(0), 0);  // due at once
    const Moments m = moments(gaps_s(*p, 40'000));
    EXPECT_NEAR(1.0 / m.mean, c.rate, c.rate * 0.03);
    EXPECT_NEAR(m.cv, c.cv, 0.05 * std::max(c.cv, 1.0));
  }
}

TEST(PacerTable, ReproducibleBySeedAndDifferentAcrossSeeds) {
  for (const std::string arrival : {"poisson", "gamma"}) {
    std::string why;
    auto a = make_pacer(arrival, 50, 0.5, 123, &why);
    auto b = make_pacer(arrival, 50, 0.5, 123, &why);
    auto c = make_pacer(arrival, 50, 0.5, 124, &why);
    int differ = 0;
    for (int k = 0; k < 1000; ++k) {
      const ns_t t = a->due_ns(k);
      EXPECT_EQ(t, b->due_ns(k)) << arrival << " k=" << k;
      differ += t != c->due_ns(k);
    }
    EXPECT_GT(differ, 990) << arrival;
  }
}

TEST(PacerTable, BadArgumentsAreRefusedWithAReason) {
  const struct {
    std::string arrival;
    double rate, shape;
    std::string says;
  } cases[] = {
      {"poisson", 0, 1, "rate_per_s"},
      {"poisson", -1, 1, "rate_per_s"},
      {"constant", NAN, 1, "rate_per_s"},
      {"gamma", 1, 0, "gamma_shape"},
      {"uniform", 1, 1, "not constant, poisson or gamma"},
  };
  for (const auto& c : cases) {
    std::string why;
    EXPECT_EQ(make_pacer(c.arrival, c.rate, c.shape, 1, &why), nullptr) << c.arrival;
    EXPECT_NE(why.find(c.says), std::string::npos) << why;
  }
}

TEST(SchedulePacer, GivesTheListedTimesThenEnds) {
  std::string why;
  auto pacer = make_schedule_pacer({0, 5 * kMs, 5 * kMs, 40 * kMs}, &why);
  ASSERT_NE(pacer, nullptr) << why;
  EXPECT_EQ(pacer->due_ns(0), 0);
  EXPECT_EQ(pacer->due_ns(1), 5 * kMs);
  EXPECT_EQ(pacer->due_ns(2), 5 * kMs);
  EXPECT_EQ(pacer->due_ns(3), 40 * kMs);
  EXPECT_EQ(pacer->due_ns(4), kNever);
}

TEST(SchedulePacer, BadSchedulesAreRefusedWithAReason) {
  const struct {
    std::vector<ns_t> times;
    std::string says;
  } cases[] = {
      {{}, "empty"},
      {{-1}, "schedule_ns[0]"},
      {{0, 10, 9}, "schedule_ns[2]"},
  };
  for (const auto& c : cases) {
    std::string why;
    EXPECT_EQ(make_schedule_pacer(c.times, &why), nullptr) << c.says;
    EXPECT_NE(why.find(c.says), std::string::npos) << why;
  }
}

TEST(SchedulePacer, ASpecWithASchedulePacesByItAndIsChecked) {
  CellSpec spec;
  spec.mode = "open";
  spec.duration_s = 1;
  spec.rate_per_s = 0;  // unused with a schedule
  spec.schedule_ns = {0, 10 * kMs, 30 * kMs};
  EXPECT_EQ(check_open_loop(spec), "");
  EXPECT_EQ(open_loop_stream_bound(spec), 3);
  spec.schedule_ns = {0, 10 * kMs, 5 * kMs};
  EXPECT_NE(check_open_loop(spec).find("schedule_ns[2]"), std::string::npos);
  spec.schedule_ns.clear();
  EXPECT_NE(check_open_loop(spec).find("rate_per_s"), std::string::npos);
}

TEST_F(OpenLoopTest, SendsOnScheduleAndWaitsForTheWindowToFinish) {
  plan.bodies = {"A", "B", "C"};
  plan.duration_ns = 1'000 * kMs;
  ConstantPacer pacer(10);  // every 100 ms: 10 arrivals in [t0, t0 + 1 s)
  transport.duration = [](const RequestRecord&) { return 250 * kMs; };
  const ScheduleTimes t = run(pacer);
  const auto w = window();
  ASSERT_EQ(w.size(), 10u);
  for (std::size_t k = 0; k < w.size(); ++k) {
    EXPECT_EQ(w[k]->slot, static_cast<std::int32_t>(k));
    EXPECT_EQ(w[k]->body, static_cast<std::int32_t>(k % 3));
    EXPECT_EQ(w[k]->scheduled_ns, kStart + static_cast<ns_t>(k) * 100 * kMs);
    EXPECT_EQ(w[k]->sent_ns, w[k]->scheduled_ns);
    EXPECT_EQ(w[k]->outcome, Outcome::kOk);  // the last, sent at 900 ms, finishes in the drain
  }
  EXPECT_EQ(t.window_start_ns, kStart);
  EXPECT_EQ(t.window_end_ns, kStart + 1'000 * kMs);
  EXPECT_EQ(t.end_ns, kStart + 1'150 * kMs);
  EXPECT_EQ(transport.max_in_flight, 3);  // 250 ms requests every 100 ms
  EXPECT_EQ(transport.cancels, 0);
  EXPECT_EQ(progress.completed.load(), 10);
  EXPECT_EQ(progress.in_flight.load(), 0);
}

TEST_F(OpenLoopTest, ASlowServerMakesRequestsPileUpInsteadOfDelayingSends) {
  plan.bodies = {"x"};
  plan.duration_ns = 1'000 * kMs;
  plan.drain_timeout_ns = 100'000 * kMs;
  ConstantPacer pacer(20);  // 20 arrivals, every 50 ms
  transport.duration = [](const RequestRecord&) { return 5'000 * kMs; };  // far slower
  run(pacer);
  const auto w = window();
  ASSERT_EQ(w.size(), 20u);
  EXPECT_EQ(transport.max_in_flight, 20);
  for (const RequestRecord* r : w) EXPECT_EQ(r->sent_ns, r->scheduled_ns);
}

// Past 32 records in memory, those finished 2 s ago are spilled (records.hpp RequestLog)
// while the loop runs; gated arrivals wait as pending records and are never spilled; every
// record reads back as sent.
TEST_F(OpenLoopTest, RequestRecordsSpillWhileTheLoopRunsAndReadBackWhole) {
  records.requests.configure_spill(32);
  plan.bodies = {"x", "y"};
  plan.duration_ns = 20'000 * kMs;
  plan.max_concurrency = 8;
  ConstantPacer pacer(50);  // 1,000 arrivals, every 20 ms
  transport.duration = [](const RequestRecord& r) { return (100 + 37 * (r.slot % 5)) * kMs; };
  const ScheduleTimes t = run(pacer);
  EXPECT_EQ(t.stopped_by, StopReason::kDuration);
  ASSERT_EQ(records.requests.size(), 1000u);
  EXPECT_GT(records.requests.spilled(), 800u);
  std::size_t k = 0;
  records.requests.for_each(0, 1000, [&](std::size_t i, const RequestRecord& r) {
    EXPECT_EQ(r.slot, static_cast<std::int32_t>(i));
    EXPECT_EQ(r.body, static_cast<std::int32_t>(i % 2));
    EXPECT_EQ(r.scheduled_ns, kStart + static_cast<ns_t>(i) * 20 * kMs);
    EXPECT_GE(r.sent_ns, r.scheduled_ns);  // the gate may hold it
    EXPECT_EQ(r.done_ns, r.sent_ns + (100 + 37 * (r.slot % 5)) * kMs);
    EXPECT_EQ(r.outcome, Outcome::kOk);
    ++k;
  });
  EXPECT_EQ(k, 1000u);
  EXPECT_EQ(progress.completed.load(), 1000);
}

TEST_F(OpenLoopTest, TheGateQueuesArrivalsAndKeepsTheirScheduledTimes) {
  plan.bodies = {"x"};
  plan.duration_ns = 1'000 * kMs;
  plan.max_concurrency = 2;
  ConstantPacer pacer(10);
  transport.duration = [](const RequestRecord&) { return 300 * kMs; };
  const ScheduleTimes t = run(pacer);
  const auto w = window();
  ASSERT_EQ(w.size(), 10u);
  EXPECT_EQ(transport.max_in_flight, 2);
  // Two in flight, each 300 ms: sends at 0,100 | 300,400 | 600,700 | 900,1000 | 1200,1300.
  const ns_t sent_ms[] = {0, 100, 300, 400, 600, 700, 900, 1000, 1200, 1300};
  for (std::size_t k = 0; k < w.size(); ++k) {
    EXPECT_EQ(w[k]->scheduled_ns, kStart + static_cast<ns_t>(k) * 100 * kMs) << k;
    EXPECT_EQ(w[k]->sent_ns, kStart + sent_ms[k] * kMs) << k;  // gate wait = sent - scheduled
    EXPECT_EQ(w[k]->outcome, Outcome::kOk) << k;
  }
  EXPECT_EQ(t.end_ns, kStart + 1'600 * kMs);
}

TEST_F(OpenLoopTest, TheDrainBoundCancelsInFlightAndRecordsUnsentArrivals) {
  plan.bodies = {"x"};
  plan.duration_ns = 1'000 * kMs;
  plan.max_concurrency = 1;
  plan.drain_timeout_ns = 500 * kMs;
  ConstantPacer pacer(5);  // arrivals at 0, 200, ..., 800 ms
  transport.duration = [](const RequestRecord&) { return 600 * kMs; };
  const ScheduleTimes t = run(pacer);
  const auto w = window();
  ASSERT_EQ(w.size(), 5u);
  // Sent at 0, 600, 1200 (cancelled at the bound, 1500); arrivals 3 and 4 never sent.
  EXPECT_EQ(w[0]->outcome, Outcome::kOk);
  EXPECT_EQ(w[1]->outcome, Outcome::kOk);
  EXPECT_EQ(w[2]->outcome, Outcome::kCancelled);
  EXPECT_EQ(w[2]->sent_ns, kStart + 1'200 * kMs);
  for (int k = 3; k < 5; ++k) {
    EXPECT_EQ(w[k]->outcome, Outcome::kCancelled);
    EXPECT_EQ(w[k]->sent_ns, kNever);
    EXPECT_EQ(w[k]->done_ns, kStart + 1'500 * kMs);
  }
  EXPECT_EQ(transport.cancels, 1);
  EXPECT_EQ(t.end_ns, kStart + 1'500 * kMs);
}

TEST_F(OpenLoopTest, ALateLoopSendsEveryDueArrivalAtOnceWithItsOwnSchedule) {
  plan.bodies = {"x"};
  plan.duration_ns = 1'000 * kMs;
  ConstantPacer pacer(100);  // every 10 ms
  // A 95 ms request; the fake's poll jumps straight to the next event, so
  // simulate a loop that overslept by starting the clock late after t0.
  transport.duration = [](const RequestRecord&) { return 5 * kMs; };
  struct LateClock final : public Clock {
    FakeClock& c;
    int reads = 0;
    explicit LateClock(FakeClock& f) : c(f) {}
    ns_t now() override {
      if (++reads == 2) c.t += 35 * kMs;  // the read after t0 finds the loop 35 ms late
      return c.t;
    }
  } late(clock);
  run_open_loop(plan, pacer, transport, late, records, stop, &progress);
  const auto w = window();
  ASSERT_EQ(w.size(), 100u);
  for (int k = 0; k < 4; ++k) {  // due at 0..30 ms, all sent at 35 ms
    EXPECT_EQ(w[k]->scheduled_ns, kStart + k * 10 * kMs);
    EXPECT_EQ(w[k]->sent_ns, kStart + 35 * kMs);
  }
  EXPECT_EQ(w[4]->sent_ns, w[4]->scheduled_ns);
}

TEST_F(OpenLoopTest, WarmupRunsFirstAndStopEndsEarly) {
  plan.warmup_bodies = {"w0", "w1"};
  plan.bodies = {"x"};
  plan.duration_ns = 10'000 * kMs;
  ConstantPacer pacer(10);
  transport.duration = [&](const RequestRecord& r) {
    if (r.phase == Phase::kWarmup) return 200 * kMs;
    if (clock.t >= kStart + 200 * kMs + 450 * kMs) stop = true;
    return 1'000 * kMs;
  };
  const ScheduleTimes t = run(pacer);
  EXPECT_EQ(t.warmup_start_ns, kStart);
  EXPECT_EQ(t.window_start_ns, kStart + 200 * kMs);
  EXPECT_TRUE(t.stopped);
  EXPECT_EQ(t.stopped_by, StopReason::kStop);  // says why, as the closed loop does
  const auto w = window();
  ASSERT_EQ(w.size(), 6u);  // 0..500 ms: the one at 500 ms sets the stop as it is sent
  for (const RequestRecord* r : w) EXPECT_EQ(r->outcome, Outcome::kCancelled);
  EXPECT_EQ(progress.completed.load(), 0);
}

TEST_F(OpenLoopTest, RateLimitedArrivalsKeepTheirScheduleAndAreNotRetried) {
  plan.bodies = {"x"};
  plan.duration_ns = 1'000 * kMs;
  ConstantPacer pacer(20);
  transport.duration = [](const RequestRecord&) { return 1 * kMs; };
  transport.fail_kind = [](const RequestRecord&) { return std::string("http_429"); };
  const ScheduleTimes t = run(pacer);
  const auto w = window();
  ASSERT_EQ(w.size(), 20u);  // one request per arrival: none retried, none delayed
  for (const RequestRecord* r : w) {
    EXPECT_EQ(r->sent_ns, r->scheduled_ns);
    EXPECT_EQ(r->error_kind, "http_429");
  }
  EXPECT_EQ(t.backoffs, 0);
  EXPECT_EQ(t.stopped_by, StopReason::kDuration);
}

TEST_F(OpenLoopTest, ARefusingServerEndsTheCellOnScheduleWithAReason) {
  plan.bodies = {"x"};
  plan.duration_ns = 60'000 * kMs;
  plan.backoff.give_up_ns = 1'000 * kMs;
  ConstantPacer pacer(10);
  transport.duration = [](const RequestRecord&) { return 1 * kMs; };
  transport.fail_kind = [](const RequestRecord&) { return std::string("connect"); };
  const ScheduleTimes t = run(pacer);
  EXPECT_EQ(t.stopped_by, StopReason::kUnreachable);
  EXPECT_EQ(t.window_end_ns, kStart + 1'001 * kMs);  // the failure sent at 1 s, refused 1 ms later
  EXPECT_EQ(t.stop_reason.rfind("the server refused 11 connections in a row over 1.0 s", 0), 0u)
      << t.stop_reason;
  const auto w = window();
  ASSERT_EQ(w.size(), 11u);  // arrivals at 0, 100, ..., 1000 ms kept their schedule
  for (const RequestRecord* r : w) EXPECT_EQ(r->sent_ns, r->scheduled_ns);
}

TEST(OpenLoopSpec, CheckSaysWhatIsWrong) {
  CellSpec s;
  s.mode = "open";
  s.rate_per_s = 2;
  EXPECT_EQ(check_open_loop(s), "");
  s.arrival = "gamma";
  s.gamma_shape = -1;
  EXPECT_NE(check_open_loop(s).find("gamma_shape"), std::string::npos);
  s.gamma_shape = 2;
  s.duration_s = 0;
  EXPECT_NE(check_open_loop(s).find("duration_s"), std::string::npos);
  s.duration_s = 5;
  s.max_concurrency = -3;
  EXPECT_NE(check_open_loop(s).find("max_concurrency"), std::string::npos);
  s.max_concurrency = 0;
  s.mode = "half";
  EXPECT_NE(check_open_loop(s).find("not closed or open"), std::string::npos);
  s.mode = "open";
  s.rate_per_s = 100;
  s.duration_s = 10;
  EXPECT_GE(open_loop_stream_bound(s), 1000);
  s.max_concurrency = 8;
  EXPECT_EQ(open_loop_stream_bound(s), 8);
}

}  // namespace
}  // namespace speedmatrix
