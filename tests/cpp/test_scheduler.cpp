// The closed loop against a fake clock and a fake transport: requests take
// scripted durations; nothing sleeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>

#include "speedmatrix/cell.hpp"
#include "speedmatrix/scheduler.hpp"

namespace speedmatrix {
namespace {

constexpr ns_t kMs = 1'000'000;

class FakeClock final : public Clock {
 public:
  ns_t now() override { return t; }
  ns_t t = 1'000 * kMs;
};

// Each request lasts duration(record) ns and then ends with outcome(record).
class FakeTransport final : public Transport {
 public:
  FakeTransport(FakeClock& c, CellRecords& r) : clock(c), records(r) {}

  void start(std::int32_t id, std::string_view body) override {
    RequestRecord& rec = records.requests[static_cast<std::size_t>(id)];
    rec.sent_ns = clock.t;
    bodies_seen.emplace_back(body);
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
    ++polls;
    ns_t next = deadline;
    for (auto& [id, end] : ends) next = std::min(next, end);
    if (next == kNoDeadline) {  // nothing would ever happen: a scheduler bug
      ADD_FAILURE() << "poll without deadline or work";
      return;
    }
    clock.t = std::max(clock.t, next);
    for (auto it = ends.begin(); it != ends.end();) {
      if (it->second <= clock.t) {
        RequestRecord& rec = records.requests[static_cast<std::size_t>(it->first)];
        rec.done_ns = clock.t;
        rec.outcome = outcome(rec);
        if (rec.outcome == Outcome::kError) rec.error_kind = "connect";
        finished.push_back(it->first);
        it = ends.erase(it);
      } else {
        ++it;
      }
    }
    if (on_poll) on_poll();
  }
  void wake() noexcept override {}

  FakeClock& clock;
  CellRecords& records;
  std::function<ns_t(const RequestRecord&)> duration = [](const RequestRecord&) {
    return 100 * kMs;
  };
  std::function<Outcome(const RequestRecord&)> outcome = [](const RequestRecord&) {
    return Outcome::kOk;
  };
  std::function<void()> on_poll;
  std::map<std::int32_t, ns_t> ends;
  std::vector<std::string> bodies_seen;
  std::int32_t max_in_flight = 0;
  int cancels = 0;
  int polls = 0;
};

struct Fixture : ::testing::Test {
  FakeClock clock;
  CellRecords records;
  FakeTransport transport{clock, records};
  std::atomic<bool> stop{false};
  CellProgress progress;
  ClosedLoopPlan plan;

  ScheduleTimes run() { return run_closed_loop(plan, transport, clock, records, stop, &progress); }
  std::vector<const RequestRecord*> window() const {
    std::vector<const RequestRecord*> w;
    for (const auto& r : records.requests)
      if (r.phase == Phase::kWindow) w.push_back(&r);
    return w;
  }
};

TEST_F(Fixture, ClosedLoopRefillsEachSlotWithItsBodyAndCancelsAtTheEnd) {
  plan.bodies = {"A", "B", "C"};
  plan.concurrency = 4;
  plan.duration_ns = 1'050 * kMs;  // 10 full rounds of 100 ms, the 11th cut at 50 ms
  const ns_t start = clock.t;
  const ScheduleTimes t = run();

  EXPECT_EQ(t.warmup_start_ns, kNever);
  EXPECT_EQ(t.window_start_ns, start);
  EXPECT_EQ(t.window_end_ns, start + 1'050 * kMs);
  EXPECT_FALSE(t.stopped);
  const auto w = window();
  ASSERT_EQ(w.size(), 44u);  // 4 slots x 11 requests
  EXPECT_EQ(transport.max_in_flight, 4);
  EXPECT_EQ(transport.cancels, 4);
  int ok = 0, cancelled = 0;
  for (const RequestRecord* r : w) {
    EXPECT_EQ(r->body, r->slot % 3);  // slot k always sends bodies[k % 3]
    EXPECT_EQ(r->scheduled_ns, r->sent_ns);
    if (r->outcome == Outcome::kOk) ++ok;
    if (r->outcome == Outcome::kCancelled) {
      ++cancelled;
      EXPECT_EQ(r->done_ns, start + 1'050 * kMs);  // cancelled at t0 + D
    }
  }
  EXPECT_EQ(ok, 40);
  EXPECT_EQ(cancelled, 4);
  EXPECT_EQ(progress.completed.load(), 40);
  EXPECT_EQ(progress.in_flight.load(), 0);
  EXPECT_EQ(progress.window_start_ns.load(), start);
  EXPECT_EQ(transport.bodies_seen[3], "A");  // slot 3 -> bodies[0]
}

TEST_F(Fixture, RefillIsImmediateAndKeepsTheSlot) {
  plan.bodies = {"x"};
  plan.concurrency = 2;
  plan.duration_ns = 1'000 * kMs;
  // Slot 0 requests take 30 ms, slot 1 requests 70 ms.
  transport.duration = [](const RequestRecord& r) { return (r.slot == 0 ? 30 : 70) * kMs; };
  run();
  std::map<int, std::vector<const RequestRecord*>> by_slot;
  for (const RequestRecord* r : window()) by_slot[r->slot].push_back(r);
  ASSERT_EQ(by_slot[0].size(), 34u);  // ceil(1000 / 30)
  ASSERT_EQ(by_slot[1].size(), 15u);  // ceil(1000 / 70)
  for (auto& [slot, rs] : by_slot) {
    for (std::size_t i = 1; i < rs.size(); ++i) EXPECT_EQ(rs[i]->sent_ns, rs[i - 1]->done_ns);
  }
}

TEST_F(Fixture, WarmupSendsAllAtOnceThenTheWindowStarts) {
  plan.warmup_bodies = {"w0", "w1", "w2"};
  plan.bodies = {"b"};
  plan.concurrency = 1;
  plan.duration_ns = 200 * kMs;
  transport.duration = [](const RequestRecord& r) {
    return r.phase == Phase::kWarmup ? (r.slot + 1) * 100 * kMs : 100 * kMs;
  };
  const ns_t start = clock.t;
  const ScheduleTimes t = run();
  EXPECT_EQ(t.warmup_start_ns, start);
  EXPECT_EQ(t.window_start_ns, start + 300 * kMs);  // after the slowest warm-up request
  ASSERT_GE(records.requests.size(), 5u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(records.requests[i].phase, Phase::kWarmup);
    EXPECT_EQ(records.requests[i].sent_ns, start);
    EXPECT_EQ(records.requests[i].outcome, Outcome::kOk);
  }
  EXPECT_EQ(records.requests[3].phase, Phase::kWindow);
  EXPECT_EQ(records.requests[3].sent_ns, t.window_start_ns);
  EXPECT_EQ(progress.completed.load(), 2);  // warm-up requests are not counted
}

TEST_F(Fixture, WarmupTimeoutCancelsTheRest) {
  plan.warmup_bodies = {"fast", "slow"};
  plan.warmup_timeout_ns = 500 * kMs;
  plan.bodies = {"b"};
  plan.duration_ns = 100 * kMs;
  transport.duration = [](const RequestRecord& r) {
    return r.phase == Phase::kWarmup && r.slot == 1 ? 10'000 * kMs : 50 * kMs;
  };
  const ns_t start = clock.t;
  const ScheduleTimes t = run();
  EXPECT_EQ(records.requests[0].outcome, Outcome::kOk);
  EXPECT_EQ(records.requests[1].outcome, Outcome::kCancelled);
  EXPECT_EQ(records.requests[1].done_ns, start + 500 * kMs);
  EXPECT_EQ(t.window_start_ns, start + 500 * kMs);
}

TEST_F(Fixture, MaxRequestsEndsTheWindowWhenTheLastFinishes) {
  plan.bodies = {"b"};
  plan.concurrency = 3;
  plan.duration_ns = 0;
  plan.max_requests = 7;
  const ns_t start = clock.t;
  const ScheduleTimes t = run();
  const auto w = window();
  ASSERT_EQ(w.size(), 7u);
  for (const RequestRecord* r : w) EXPECT_EQ(r->outcome, Outcome::kOk);
  EXPECT_EQ(transport.cancels, 0);
  EXPECT_EQ(t.window_end_ns, start + 300 * kMs);  // rounds at 0, 100, 200 ms
}

TEST_F(Fixture, StopEndsEarlyAndCancelsInFlight) {
  plan.bodies = {"b"};
  plan.concurrency = 2;
  plan.duration_ns = 10'000 * kMs;
  transport.duration = [](const RequestRecord& r) { return (r.slot == 0 ? 100 : 5'000) * kMs; };
  transport.on_poll = [&] {
    if (clock.t >= 1'000 * kMs + 250 * kMs) stop = true;
  };
  const ScheduleTimes t = run();
  EXPECT_TRUE(t.stopped);
  EXPECT_EQ(t.window_end_ns, 1'000 * kMs + 300 * kMs);
  EXPECT_EQ(transport.cancels, 1);  // slot 1's long request; slot 0 is not refilled
  EXPECT_EQ(records.requests.back().outcome, Outcome::kOk);
}

TEST_F(Fixture, FailingSlotsBackOffInsteadOfSpinning) {
  plan.bodies = {"b"};
  plan.concurrency = 1;
  plan.duration_ns = 1'000 * kMs;
  plan.error_backoff_ns = 50 * kMs;
  transport.duration = [](const RequestRecord&) { return 1 * kMs; };  // refused at once
  transport.outcome = [](const RequestRecord&) { return Outcome::kError; };
  run();
  const auto w = window();
  EXPECT_EQ(w.size(), 20u);  // one attempt per 50 ms, not one per ms
  for (std::size_t i = 1; i < w.size(); ++i) {
    EXPECT_EQ(w[i]->sent_ns - w[i - 1]->sent_ns, 50 * kMs);
    EXPECT_EQ(w[i]->scheduled_ns, w[i]->sent_ns);
  }
  EXPECT_EQ(progress.errors.load(), 20);
}

TEST_F(Fixture, ManySlotsAllStartAtT0) {
  plan.bodies = {"a", "b"};
  plan.concurrency = 1024;
  plan.duration_ns = 150 * kMs;
  const ScheduleTimes t = run();
  EXPECT_EQ(transport.max_in_flight, 1024);
  std::int64_t at_t0 = 0;
  for (const RequestRecord* r : window()) at_t0 += r->sent_ns == t.window_start_ns;
  EXPECT_EQ(at_t0, 1024);
  EXPECT_EQ(transport.cancels, 1024);
}

TEST(Pacer, ConstantIsEvenlySpacedAndBounded) {
  ConstantPacer p(4.0, 3);
  const ns_t expected[] = {0, 250'000'000, 500'000'000, kNever};
  for (int k = 0; k < 4; ++k) EXPECT_EQ(p.due_ns(k), expected[k]) << k;
  EXPECT_EQ(ConstantPacer(0).due_ns(0), kNever);
}

TEST(Pacer, PoissonHasTheAskedRateAndIsReproducible) {
  PoissonPacer a(100.0, 42), b(100.0, 42);
  ns_t last = 0;
  for (int k = 0; k < 20'000; ++k) {
    const ns_t t = a.due_ns(k);
    EXPECT_EQ(t, b.due_ns(k));
    EXPECT_GE(t, last);
    last = t;
  }
  // 20k arrivals at 100/s take ~200 s (the sd of the sum is ~1.4 s).
  EXPECT_NEAR(static_cast<double>(last) / 1e9, 200.0, 6.0);
  EXPECT_EQ(PoissonPacer(10.0, 1, 5).due_ns(5), kNever);
}

}  // namespace
}  // namespace speedmatrix
