// The closed loop against a fake clock and a fake transport: requests take
// scripted durations; nothing sleeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

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
    if (const ns_t first = ttft(rec); first != kNever) {
      next_token[id] = clock.t + first;
      if (const ns_t quiet = stall_after(rec); quiet != kNever) {
        stall_at[id] = clock.t + first + quiet;  // no token from then on, and no end
        ends[id] = kNoDeadline;
      }
    }
    max_in_flight = std::max<std::int32_t>(max_in_flight, static_cast<std::int32_t>(ends.size()));
  }
  void cancel(std::int32_t id) override {
    ASSERT_TRUE(ends.count(id)) << "cancel of a request not in flight: " << id;
    ends.erase(id);
    next_token.erase(id);
    RequestRecord& rec = records.requests[static_cast<std::size_t>(id)];
    rec.outcome = Outcome::kCancelled;
    rec.done_ns = clock.t;
    ++cancels;
  }
  void poll(ns_t deadline, std::vector<std::int32_t>& finished) override {
    ++polls;
    ns_t next = deadline;
    for (auto& [id, end] : ends) next = std::min(next, end);
    for (auto& [id, t] : next_token) next = std::min(next, t);
    if (next == kNoDeadline) {  // nothing would ever happen: a scheduler bug
      ADD_FAILURE() << "poll without deadline or work";
      return;
    }
    clock.t = std::max(clock.t, next);
    // one token per itl from the first, until the end or the stall
    for (auto it = next_token.begin(); it != next_token.end();) {
      const std::int32_t id = it->first;
      RequestRecord& rec = records.requests[static_cast<std::size_t>(id)];
      const ns_t stop_at = stall_at.count(id) ? stall_at[id] : ends[id];
      while (it->second <= clock.t && it->second < stop_at) {
        if (rec.first_token_ns == kNever) rec.first_token_ns = it->second;
        records.events.push(id, it->second, 1, -1);
        it->second += itl;
      }
      it = it->second >= stop_at ? next_token.erase(it) : std::next(it);
    }
    for (auto it = ends.begin(); it != ends.end();) {
      if (it->second <= clock.t) {
        RequestRecord& rec = records.requests[static_cast<std::size_t>(it->first)];
        rec.done_ns = clock.t;
        rec.outcome = outcome(rec);
        if (rec.outcome == Outcome::kError) {
          rec.error_kind = error_kind(rec);
          if (const ns_t ra = retry_after(rec); ra != kNever) {
            if (records.retry_after_ns.size() <= static_cast<std::size_t>(it->first))
              records.retry_after_ns.resize(static_cast<std::size_t>(it->first) + 1, kNever);
            records.retry_after_ns[static_cast<std::size_t>(it->first)] = ra;
          }
        }
        finished.push_back(it->first);
        next_token.erase(it->first);
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
  // A failed request's error kind, and the Retry-After its answer carried (kNever: none).
  std::function<std::string(const RequestRecord&)> error_kind = [](const RequestRecord&) {
    return std::string("connect");
  };
  std::function<ns_t(const RequestRecord&)> retry_after = [](const RequestRecord&) {
    return kNever;
  };
  // Streaming: the first token ttft after the send (kNever: none), then one per
  // itl; stall_after: no token from that long after the first on, and no end.
  std::function<ns_t(const RequestRecord&)> ttft = [](const RequestRecord&) { return kNever; };
  ns_t itl = 10 * kMs;
  std::function<ns_t(const RequestRecord&)> stall_after = [](const RequestRecord&) {
    return kNever;
  };
  std::function<void()> on_poll;
  std::map<std::int32_t, ns_t> ends, next_token, stall_at;
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
  transport.duration = [](const RequestRecord&) { return 1 * kMs; };  // fails at once
  transport.outcome = [](const RequestRecord&) { return Outcome::kError; };
  transport.error_kind = [](const RequestRecord&) { return std::string("http_500"); };
  const ScheduleTimes t = run();
  const auto w = window();
  // Sent at 0, 101, 302 and 703 ms: 100 ms doubled per failure from each end, not one
  // attempt per ms (nor, as before, one every error_backoff_ns: 20).
  ASSERT_EQ(w.size(), 4u);
  const ns_t sent_ms[] = {0, 101, 302, 703};
  for (std::size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ((w[i]->sent_ns - w[0]->sent_ns) / kMs, sent_ms[i]) << i;
    EXPECT_EQ(w[i]->scheduled_ns, w[i]->sent_ns);
  }
  EXPECT_EQ(progress.errors.load(), 4);
  EXPECT_EQ(t.backoffs, 4);  // the last one runs past the window's end
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

// --- steady-state window, stalls, early end, warm-up retries ---------------

TEST(SteadyWindowOpen, Table) {
  constexpr ns_t N = kNever, S = 1'000 * kMs;  // ramp start at 0, settle 1 s, cap 10 s
  struct Row {
    std::vector<ns_t> first;
    ns_t now;
    ns_t want;
    bool capped;
  } rows[] = {
      {{100 * kMs, 300 * kMs, 200 * kMs}, 300 * kMs, 300 * kMs, false},  // all stream
      {{100 * kMs, N, 200 * kMs}, 500 * kMs, N, false},                  // waiting
      {{100 * kMs, N, 200 * kMs}, 1'199 * kMs, N, false},                // settle not over
      {{100 * kMs, N, 200 * kMs}, 1'200 * kMs, 200 * kMs, false},        // plateau at 2 of 3
      // slow admissions (800 ms apart): the settle is twice the longest wait
      {{800 * kMs, N, 1'600 * kMs}, 3'000 * kMs, N, false},
      {{800 * kMs, N, 1'600 * kMs}, 3'200 * kMs, 1'600 * kMs, false},
      {{N, N, N}, 9'999 * kMs, N, false},  // nothing yet
      {{N, N, N}, 10 * S, 10 * S, true},   // the cap
      {{-5 * kMs, N}, 2 * S, 0, false},    // a first token stamped before the ramp counts at it
  };
  for (const Row& r : rows) {
    bool capped = false;
    EXPECT_EQ(steady_window_open(r.first, 0, r.now, S, 10 * S, &capped), r.want) << r.now;
    EXPECT_EQ(capped, r.capped) << r.now;
  }
}

TEST(StallRule, Table) {
  const double nan = std::nan("");
  struct Row {
    StreamSilence s;  // silent, own mean gap (0: one token so far), first token's wait
    double median_ms;
    ns_t min;
    double factor;
    bool stalled;
  } rows[] = {
      {{2'001 * kMs, 10 * kMs, 50 * kMs}, 10, 2'000 * kMs, 25, true},   // max(2 s, 250 ms)
      {{2'000 * kMs, 10 * kMs, 50 * kMs}, 10, 2'000 * kMs, 25, false},  // at the limit
      {{4'000 * kMs, 0, 50 * kMs}, 200, 2'000 * kMs, 25, false},        // 25 x 200 ms = 5 s
      {{5'001 * kMs, 0, 50 * kMs}, 200, 2'000 * kMs, 25, true},         //
      {{3'000 * kMs, 0, 50 * kMs}, nan, 2'000 * kMs, 25, true},         // no gaps: the minimum
      {{99'000 * kMs, 10 * kMs, 50 * kMs}, 10, 0, 25, false},           // off
      // A server at 3 s a token: its own pace sets the limit, not the 2 s minimum.
      {{2'900 * kMs, 0, 3'000 * kMs}, nan, 2'000 * kMs, 25, false},            // 2 x 3 s first wait
      {{6'001 * kMs, 0, 3'000 * kMs}, nan, 2'000 * kMs, 25, true},             // ... and past it
      {{30'000 * kMs, 3'000 * kMs, 3'000 * kMs}, 10, 2'000 * kMs, 25, false},  // 25 x 3 s
      {{75'001 * kMs, 3'000 * kMs, 3'000 * kMs}, 10, 2'000 * kMs, 25, true},   // stopped
  };
  for (const Row& r : rows)
    EXPECT_EQ(is_stalled(r.s, r.median_ms, r.min, r.factor), r.stalled) << r.s.silent_ns;
  EXPECT_EQ(stall_limit_ns({0, 3'000 * kMs, 3'000 * kMs}, nan, 2'000 * kMs, 25), 75'000 * kMs);
  EXPECT_EQ(stall_limit_ns({0, 0, 0}, nan, 0, 25), kNoDeadline);
}

TEST(StallRule, ASilenceEveryStreamSharesIsTheServersPauseNotAStall) {
  const ns_t lim = 2'000 * kMs, cap = 10'000 * kMs;
  // streams at the cell's pace (10 ms a token, first token after 50 ms), silent this long
  auto silent = [](std::vector<ns_t> ms) {
    std::vector<StreamSilence> out;
    for (ns_t t : ms) out.push_back({t * kMs, 10 * kMs, 50 * kMs});
    return out;
  };
  struct Row {
    std::vector<StreamSilence> streams;
    std::size_t in_flight;
    std::vector<bool> cut;
  } rows[] = {
      {silent({3'000, 10, 20}), 3, {true, false, false}},  // the others still stream
      {silent({3'000, 2'500, 20}), 3, {true, true, false}},
      {silent({3'000, 2'500, 4'000}), 3, {false, false, false}},  // all wait
      {silent({3'000}), 2, {false}},  // the other request is in its prefill: the server's pause
      {silent({3'000}), 1, {true}},   // alone (N = 1): its silence is its own
      {silent({11'000, 2'500}), 2, {true, true}},  // past the cap: a hung server
      {{}, 0, {}},
  };
  for (const Row& r : rows)
    EXPECT_EQ(stalled_streams(r.streams, r.in_flight, 10, lim, 25, cap), r.cut)
        << r.streams.size() << " streaming of " << r.in_flight;
  // no cap (0): a shared silence is cut like any other
  EXPECT_EQ(stalled_streams(silent({3'000, 2'500}), 2, 10, lim, 25, 0),
            (std::vector<bool>{true, true}));
}

// A server at 3 s a token (first token 3 s after the send, then one every 3 s) under the
// default rule (2 s minimum, factor 25): its streams are measured, not cut before their
// second token as they were; one that stops is cut at 25 x its own 3 s pace.
TEST_F(Fixture, AUniformlySlowServerIsJudgedByItsOwnPace) {
  plan.bodies = {"b"};
  plan.concurrency = 1;
  plan.duration_ns = 200'000 * kMs;
  plan.stall_min_ns = 2'000 * kMs;
  plan.stall_gap_factor = 25;
  transport.itl = 3'000 * kMs;
  transport.ttft = [](const RequestRecord&) { return 3'000 * kMs; };
  transport.duration = [](const RequestRecord&) { return 31'000 * kMs; };  // 10 tokens
  // the third request stops after 4 tokens (9 s after its first)
  int n = 0;
  transport.stall_after = [&](const RequestRecord&) { return n++ == 2 ? 10'000 * kMs : kNever; };
  const ScheduleTimes t = run();
  EXPECT_EQ(t.stalls, 1);
  const auto w = window();
  ASSERT_GE(w.size(), 4u);
  EXPECT_EQ(w[0]->outcome, Outcome::kOk);
  EXPECT_EQ(w[1]->outcome, Outcome::kOk);
  ASSERT_EQ(w[2]->outcome, Outcome::kError);
  EXPECT_EQ(w[2]->error_kind, "stall");
  // its last token came at send + 3 s + 9 s; the limit is 25 x 3 s = 75 s (the cell's
  // median, read from log buckets 4.4 % wide, may add up to that); ticks of 100 ms
  const ns_t last = w[2]->sent_ns + 12'000 * kMs;
  EXPECT_GT(w[2]->done_ns - last, 75'000 * kMs);
  EXPECT_LE(w[2]->done_ns - last, 78'400 * kMs);
  EXPECT_NE(w[2]->error_message.find("own pace 25 x 3000.0 ms"), std::string::npos)
      << w[2]->error_message;
}

TEST_F(Fixture, SteadyWindowOpensWhenEverySlotStreams) {
  plan.bodies = {"b"};
  plan.concurrency = 4;
  plan.duration_ns = 1'000 * kMs;
  plan.steady_window = true;
  transport.duration = [](const RequestRecord&) { return 10'000 * kMs; };
  transport.ttft = [](const RequestRecord& r) { return (r.slot + 1) * 200 * kMs; };
  const ns_t start = clock.t;
  const ScheduleTimes t = run();
  EXPECT_EQ(t.ramp_start_ns, start);
  EXPECT_EQ(t.window_start_ns, start + 800 * kMs);  // the last slot's first token
  EXPECT_EQ(t.window_end_ns, start + 1'800 * kMs);
  EXPECT_FALSE(t.ramp_capped);
  EXPECT_EQ(t.stopped_by, StopReason::kDuration);
  EXPECT_EQ(progress.window_start_ns.load(), t.window_start_ns);
  // The live count restarts at t0 with the tokens since t0: the four read at
  // 0.8 s (the fake transport counts none itself; the ramp's 30 are dropped).
  EXPECT_EQ(progress.tokens.load(), 4);
  for (const RequestRecord* r : window()) EXPECT_EQ(r->sent_ns, start);
}

TEST_F(Fixture, QueuedServerOpensAtItsPlateau) {
  plan.bodies = {"b"};
  plan.concurrency = 4;
  plan.duration_ns = 1'000 * kMs;
  plan.steady_window = true;
  plan.plateau_settle_ns = 1'000 * kMs;
  transport.duration = [](const RequestRecord&) { return 100'000 * kMs; };
  // the server runs two; the other two wait (no token) for longer than the cell
  transport.ttft = [](const RequestRecord& r) {
    return r.slot < 2 ? (100 + 50 * r.slot) * kMs : kNever;
  };
  const ns_t start = clock.t;
  const ScheduleTimes t = run();
  EXPECT_EQ(t.window_start_ns, start + 150 * kMs);  // the plateau began at the 2nd stream
  EXPECT_EQ(t.window_end_ns, start + 1'150 * kMs);
  EXPECT_FALSE(t.ramp_capped);
}

TEST_F(Fixture, RampCapOpensTheWindowAndSaysSo) {
  plan.bodies = {"b"};
  plan.concurrency = 2;
  plan.duration_ns = 500 * kMs;
  plan.steady_window = true;
  plan.ramp_cap_ns = 2'000 * kMs;
  transport.duration = [](const RequestRecord&) { return 100'000 * kMs; };
  const ns_t start = clock.t;
  const ScheduleTimes t = run();
  EXPECT_TRUE(t.ramp_capped);
  EXPECT_EQ(t.window_start_ns, start + 2'000 * kMs);
  EXPECT_EQ(t.window_end_ns, start + 2'500 * kMs);
  EXPECT_EQ(transport.cancels, 2);
}

TEST_F(Fixture, AWaveOfFailuresDoesNotWaitForTheRampCap) {
  plan.bodies = {"b"};
  plan.concurrency = 2;
  plan.duration_ns = 300 * kMs;
  plan.steady_window = true;
  plan.ramp_cap_ns = 100'000 * kMs;
  transport.duration = [](const RequestRecord&) { return 1 * kMs; };
  transport.outcome = [](const RequestRecord&) { return Outcome::kError; };
  const ns_t start = clock.t;
  const ScheduleTimes t = run();
  EXPECT_FALSE(t.ramp_capped);
  EXPECT_EQ(t.window_start_ns, start + 1 * kMs);
  EXPECT_EQ(t.window_end_ns, start + 301 * kMs);
}

struct StallCase : Fixture {
  void check();
};

TEST_F(StallCase, StalledStreamIsCancelledCountedAndItsSlotRefilled) { check(); }

// The stall rule reads the events incrementally; spilled to disk (records.hpp), a tick's new
// events are read back from the files: the same cut at the same time.
TEST_F(StallCase, TheStallRuleReadsSpilledEvents) {
  records.events.configure_spill(7);
  check();
  EXPECT_GT(records.events.spilled(), 500u);
}

void StallCase::check() {
  plan.bodies = {"b"};
  plan.concurrency = 2;
  plan.duration_ns = 5'000 * kMs;
  plan.steady_window = true;
  plan.stall_min_ns = 2'000 * kMs;
  plan.stall_gap_factor = 25;
  transport.itl = 10 * kMs;
  transport.duration = [](const RequestRecord&) { return 100'000 * kMs; };
  transport.ttft = [](const RequestRecord&) { return 50 * kMs; };
  // slot 1's first request goes silent 500 ms after its first token
  int slot1 = 0;
  transport.stall_after = [&](const RequestRecord& r) {
    return r.slot == 1 && slot1++ == 0 ? 500 * kMs : kNever;
  };
  const ns_t start = clock.t;
  const ScheduleTimes t = run();
  EXPECT_EQ(t.stalls, 1);
  EXPECT_EQ(progress.errors.load(), 1);
  const RequestRecord* stalled = nullptr;
  const RequestRecord* refill = nullptr;
  for (const RequestRecord* r : window()) {
    if (r->slot != 1) continue;
    if (r->outcome == Outcome::kError)
      stalled = r;
    else if (stalled && !refill)
      refill = r;
  }
  ASSERT_NE(stalled, nullptr);
  ASSERT_NE(refill, nullptr);
  EXPECT_EQ(stalled->error_kind, "stall");
  EXPECT_NE(stalled->error_message.find("no token for"), std::string::npos);
  // last token at 50 + 490 ms; the limit is max(2 s, 25 x 10 ms) = 2 s; ticks of 100 ms
  const ns_t last = start + 540 * kMs;
  EXPECT_GT(stalled->done_ns - last, 2'000 * kMs);
  EXPECT_LE(stalled->done_ns - last, 2'100 * kMs);
  EXPECT_EQ(refill->sent_ns, stalled->done_ns);  // refilled at once, N stays in flight
  EXPECT_NEAR(t.stall_median_gap_ms, 10.0, 0.5);
  EXPECT_EQ(t.window_end_ns, t.window_start_ns + 5'000 * kMs);
}

TEST_F(Fixture, ShouldEndIsAskedAfterTheMinimumAndEndsTheWindow) {
  plan.bodies = {"b"};
  plan.concurrency = 2;
  plan.duration_ns = 30'000 * kMs;
  plan.min_duration_ns = 2'000 * kMs;
  plan.check_interval_ns = 1'000 * kMs;
  transport.duration = [](const RequestRecord&) { return 300 * kMs; };
  std::vector<ns_t> asked;
  plan.should_end = [&](ns_t t0, ns_t now) {
    asked.push_back(now - t0);
    return now - t0 >= 3'000 * kMs;
  };
  const ScheduleTimes t = run();
  EXPECT_EQ(asked, (std::vector<ns_t>{2'000 * kMs, 3'000 * kMs}));
  EXPECT_EQ(t.stopped_by, StopReason::kPrecision);
  EXPECT_EQ(t.window_end_ns, t.window_start_ns + 3'000 * kMs);
  EXPECT_EQ(transport.cancels, 2);
}

TEST_F(Fixture, ACostlyCheckIsAskedLessOften) {
  // The check's cost grows with the window (it reads every event): here 100 ms per second
  // of window. Spaced 4x its cost after it ends, it never takes more than a fifth of the time.
  plan.bodies = {"b"};
  plan.concurrency = 2;
  plan.duration_ns = 60'000 * kMs;
  plan.min_duration_ns = 1'000 * kMs;
  plan.check_interval_ns = 1'000 * kMs;
  transport.duration = [](const RequestRecord&) { return 300 * kMs; };
  std::vector<ns_t> asked;
  ns_t busy = 0;
  plan.should_end = [&](ns_t t0, ns_t now) {
    asked.push_back(now - t0);
    const ns_t cost = (now - t0) / 10;
    clock.t += cost;
    busy += cost;
    return false;
  };
  const ScheduleTimes t = run();
  EXPECT_EQ(t.stopped_by, StopReason::kDuration);
  ASSERT_GE(asked.size(), 5u);
  EXPECT_EQ(asked[0], 1'000 * kMs);
  EXPECT_EQ(asked[1], 2'000 * kMs);  // 100 ms cost: the interval still rules
  for (std::size_t i = 1; i < asked.size(); ++i) {
    const ns_t cost = asked[i - 1] / 10;
    EXPECT_GE(asked[i] - asked[i - 1], std::max<ns_t>(1'000 * kMs, 5 * cost)) << i;
  }
  // a fifth of every whole cycle (a check and the wait after it); the last may be cut short
  EXPECT_LE(busy - asked.back() / 10, (t.window_end_ns - t.window_start_ns) / 5);
  EXPECT_LT(asked.size(), 20u);  // a check every second would be 59
}

TEST_F(Fixture, FailedWarmupRequestIsRetriedOnce) {
  plan.warmup_bodies = {"w0", "w1"};
  plan.warmup_retries = 1;
  plan.warmup_timeout_ns = 1'000 * kMs;
  plan.bodies = {"b"};
  plan.duration_ns = 100 * kMs;
  // w1 hangs past the timeout the first time, answers the second time
  int w1 = 0;
  transport.duration = [&](const RequestRecord& r) {
    if (r.phase == Phase::kWarmup && r.slot == 1 && w1++ == 0) return 10'000 * kMs;
    return 50 * kMs;
  };
  const ns_t start = clock.t;
  const ScheduleTimes t = run();
  EXPECT_EQ(t.warmup_retried, 1);
  ASSERT_GE(records.requests.size(), 3u);
  EXPECT_EQ(records.requests[1].outcome, Outcome::kCancelled);
  EXPECT_EQ(records.requests[2].phase, Phase::kWarmup);
  EXPECT_EQ(records.requests[2].body, 1);
  EXPECT_EQ(records.requests[2].sent_ns, start + 1'000 * kMs);
  EXPECT_EQ(records.requests[2].outcome, Outcome::kOk);
  EXPECT_EQ(t.window_start_ns, start + 1'050 * kMs);
  EXPECT_EQ(progress.warmup_total.load(), 2);
  EXPECT_EQ(progress.warmup_done.load(), 2);
}

// --- backoff: 429 / Retry-After and failed connections ------------------------

// The slot waits of one slot: its next send minus its previous request's end.
std::vector<ns_t> slot_waits_ms(const std::vector<const RequestRecord*>& w, std::int32_t slot) {
  std::vector<ns_t> out;
  const RequestRecord* prev = nullptr;
  for (const RequestRecord* r : w) {
    if (r->slot != slot) continue;
    if (prev) out.push_back((r->sent_ns - prev->done_ns) / kMs);
    prev = r;
  }
  return out;
}

TEST(BackoffTable, WaitsFollowThePolicy) {
  auto rec = [](Outcome o, const char* kind) {
    RequestRecord r;
    r.outcome = o;
    r.error_kind = kind;
    r.sent_ns = 0;
    r.done_ns = 1;
    if (o != Outcome::kError || std::string(kind).rfind("http_", 0) == 0) r.first_byte_ns = 1;
    return r;
  };
  const ns_t s = 1'000 * kMs;
  Backoff b;
  // Retry-After is honoured up to 10 s; a 503 only with one; other errors never.
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "http_429"), 1 * s), 1 * s);
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "http_429"), 30 * s), 10 * s);
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "http_503"), 3 * s), 3 * s);
  // Any other error: 100 ms doubled per such error since the last success (a 503
  // without Retry-After is one; a Retry-After on a 500 is not honoured).
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "http_503"), kNever), 100 * kMs);
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "http_500"), 3 * s), 200 * kMs);
  // Without Retry-After: 100 ms doubled per 429 since the last success (two so far).
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "http_429"), kNever), 400 * kMs);
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "http_429"), kNever), 800 * kMs);
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "http_429"), kNever), 1'600 * kMs);
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "http_429"), kNever), 2'000 * kMs);
  EXPECT_EQ(b.rate_limited_in_a_row(), 6);
  EXPECT_EQ(b.on_finished(rec(Outcome::kOk, ""), kNever), 0);
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "http_429"), kNever), 100 * kMs);
  // Failed connections: 50 ms doubled per failure in a row, at most 2 s; any
  // other ending resets the run.
  const ns_t connect_ms[] = {50, 100, 200, 400, 800, 1'600, 2'000, 2'000};
  for (ns_t want : connect_ms)
    EXPECT_EQ(b.on_finished(rec(Outcome::kError, "connect"), kNever), want * kMs);
  EXPECT_EQ(b.connect_failures_in_a_row(), 8);
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "http_500"), kNever), 100 * kMs);
  EXPECT_EQ(b.connect_failures_in_a_row(), 0);
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "connect_timeout"), kNever), 50 * kMs);
  // A cancellation before any answer says nothing about the server.
  RequestRecord cancelled;
  cancelled.outcome = Outcome::kCancelled;
  EXPECT_EQ(b.on_finished(cancelled, kNever), 0);
  EXPECT_EQ(b.connect_failures_in_a_row(), 1);
  // Other errors go on doubling to 2 s; a stall (the client's cut) neither waits nor
  // counts; a success resets.
  const ns_t error_ms[] = {200, 400, 800, 1'600, 2'000, 2'000};
  for (ns_t want : error_ms) {
    EXPECT_EQ(b.on_finished(rec(Outcome::kError, "stall"), kNever), 0);
    EXPECT_EQ(b.on_finished(rec(Outcome::kError, "bad_stream"), kNever), want * kMs);
  }
  EXPECT_EQ(b.on_finished(rec(Outcome::kOk, ""), kNever), 0);
  EXPECT_EQ(b.on_finished(rec(Outcome::kError, "http_500"), kNever), 100 * kMs);
}

TEST(BackoffTable, GivesUpAfterEnoughFailuresOverEnoughTimeAndSaysWhy) {
  BackoffPolicy p;
  p.give_up_failures = 3;
  p.give_up_ns = 1'000 * kMs;
  Backoff b(p);
  RequestRecord r;
  r.outcome = Outcome::kError;
  r.error_kind = "connect";
  r.error_message = "Couldn't connect to server";
  for (int k = 0; k < 3; ++k) {
    r.sent_ns = k * 600 * kMs;
    r.done_ns = r.sent_ns + kMs;
    b.on_finished(r, kNever);
    EXPECT_EQ(b.give_up(r.done_ns), k == 2) << k;  // 3 failures, and 1.2 s since the first
  }
  EXPECT_EQ(b.give_up_reason(1'201 * kMs),
            "the server refused 3 connections in a row over 1.2 s (Couldn't connect to server)");
  r.error_kind = "connect_timeout";
  b.on_finished(r, kNever);
  EXPECT_NE(b.give_up_reason(1'201 * kMs).find("did not accept 4 connections"), std::string::npos);
  // Many failures in a short time are not enough: the server may be restarting.
  Backoff quick(p);
  for (int k = 0; k < 50; ++k) {
    r.sent_ns = k * kMs;
    quick.on_finished(r, kNever);
  }
  EXPECT_FALSE(quick.give_up(50 * kMs));
}

TEST_F(Fixture, RateLimitedSlotsWaitTheRetryAfterOnTheLoopsTimers) {
  plan.bodies = {"b"};
  plan.concurrency = 2;
  plan.duration_ns = 3'500 * kMs;
  transport.duration = [](const RequestRecord&) { return 1 * kMs; };
  transport.outcome = [](const RequestRecord&) { return Outcome::kError; };
  transport.error_kind = [](const RequestRecord&) { return std::string("http_429"); };
  transport.retry_after = [](const RequestRecord&) { return 1'000 * kMs; };
  const ns_t start = clock.t;
  const ScheduleTimes t = run();
  const auto w = window();
  // Each slot sends at 0, 1.001, 2.002 and 3.003 s: N x (D / 1 s + 1) at most, not
  // one every error_backoff_ns (70 per slot).
  EXPECT_EQ(w.size(), 8u);
  for (std::int32_t slot = 0; slot < 2; ++slot) {
    EXPECT_EQ(slot_waits_ms(w, slot), (std::vector<ns_t>{1'000, 1'000, 1'000})) << slot;
  }
  for (const RequestRecord* r : w) EXPECT_EQ(r->scheduled_ns, r->sent_ns);
  EXPECT_EQ(t.stopped_by, StopReason::kDuration);
  EXPECT_EQ(t.window_end_ns, start + 3'500 * kMs);
  // 8 waits: 6 whole, and the last of each slot cut by the window's end (3.004 -> 3.5 s).
  EXPECT_EQ(t.backoffs, 8);
  EXPECT_EQ(t.backoff_ns, 2 * (3 * 1'000 + 496) * kMs);
}

TEST_F(Fixture, RateLimitedWithoutRetryAfterBacksOffMoreAndASuccessResets) {
  plan.bodies = {"b"};
  plan.concurrency = 1;
  plan.duration_ns = 10'000 * kMs;
  transport.duration = [](const RequestRecord&) { return 1 * kMs; };
  int n = 0;
  // requests 0..6 are refused with 429, 7 succeeds, the rest are 429 again
  transport.outcome = [&](const RequestRecord&) {
    return n++ == 7 ? Outcome::kOk : Outcome::kError;
  };
  transport.error_kind = [](const RequestRecord&) { return std::string("http_429"); };
  run();
  const auto w = window();
  ASSERT_GE(w.size(), 12u);
  const std::vector<ns_t> waits = slot_waits_ms(w, 0);
  const std::vector<ns_t> want = {100, 200, 400, 800, 1'600, 2'000, 2'000, 0, 100, 200, 400};
  EXPECT_EQ(std::vector<ns_t>(waits.begin(), waits.begin() + 11), want);
}

TEST_F(Fixture, A503IsDelayedOnlyWhenItSaysHowLong) {
  plan.bodies = {"b"};
  plan.concurrency = 1;
  plan.duration_ns = 2'000 * kMs;
  plan.error_backoff_ns = 50 * kMs;
  transport.duration = [](const RequestRecord&) { return 1 * kMs; };
  transport.outcome = [](const RequestRecord&) { return Outcome::kError; };
  transport.error_kind = [](const RequestRecord&) { return std::string("http_503"); };
  int n = 0;
  transport.retry_after = [&](const RequestRecord&) { return n++ == 0 ? 700 * kMs : kNever; };
  const ScheduleTimes t = run();
  const std::vector<ns_t> waits = slot_waits_ms(window(), 0);
  // 700 ms as asked, then as any other error: 100 ms doubled per error (ends at 702, 803,
  // 1,004 and 1,405 ms; the last wait is cut by the window's end at 2 s)
  EXPECT_EQ(waits, (std::vector<ns_t>{700, 100, 200, 400}));
  EXPECT_EQ(t.backoffs, 5);
  EXPECT_EQ(t.backoff_ns, (700 + 100 + 200 + 400 + 595) * kMs);
}

TEST_F(Fixture, AnyOtherErrorBacksOffAsA429AndASuccessResets) {
  plan.bodies = {"b"};
  plan.concurrency = 1;
  plan.duration_ns = 10'000 * kMs;
  transport.duration = [](const RequestRecord&) { return 1 * kMs; };
  int n = 0;
  // requests 0..3 end in a 500 at once, 4 succeeds, the rest fail again
  transport.outcome = [&](const RequestRecord&) {
    return n++ == 4 ? Outcome::kOk : Outcome::kError;
  };
  transport.error_kind = [](const RequestRecord&) { return std::string("http_500"); };
  run();
  const std::vector<ns_t> waits = slot_waits_ms(window(), 0);
  ASSERT_GE(waits.size(), 7u);
  const std::vector<ns_t> want = {100, 200, 400, 800, 0, 100, 200};
  EXPECT_EQ(std::vector<ns_t>(waits.begin(), waits.begin() + 7), want);
}

TEST_F(Fixture, RefusedConnectionsBackOffThenTheCellEndsSayingWhy) {
  plan.bodies = {"b"};
  plan.concurrency = 4;
  plan.duration_ns = 60'000 * kMs;
  plan.backoff.give_up_failures = 5;
  plan.backoff.give_up_ns = 3'000 * kMs;
  transport.duration = [](const RequestRecord&) { return 1 * kMs; };  // refused at once
  transport.outcome = [](const RequestRecord&) { return Outcome::kError; };
  const ns_t start = clock.t;
  const ScheduleTimes t = run();
  EXPECT_EQ(t.stopped_by, StopReason::kUnreachable);
  EXPECT_FALSE(t.stopped);
  EXPECT_GE(t.window_end_ns, start + 3'000 * kMs);
  EXPECT_LT(t.window_end_ns, start + 5'100 * kMs);  // the next failure after 3 s, 2 s apart at most
  EXPECT_NE(t.stop_reason.find("the server refused "), std::string::npos) << t.stop_reason;
  EXPECT_NE(t.stop_reason.find(" connections in a row over "), std::string::npos);
  const auto w = window();
  // 4 slots backing off to 2 s: a few dozen attempts, not 20 per slot per second (~240).
  EXPECT_LE(w.size(), 40u);
  EXPECT_GE(t.backoffs, static_cast<std::int64_t>(w.size()) - 4);
  EXPECT_GT(t.backoff_ns, 4 * 2'000 * kMs);
  for (const RequestRecord* r : w) EXPECT_NE(r->outcome, Outcome::kPending);
}

TEST_F(Fixture, AServerThatAnswersAgainResetsTheConnectBackoff) {
  plan.bodies = {"b"};
  plan.concurrency = 1;
  plan.duration_ns = 5'000 * kMs;
  transport.duration = [](const RequestRecord&) { return 1 * kMs; };
  int n = 0;
  transport.outcome = [&](const RequestRecord&) {
    return n++ == 4 ? Outcome::kOk : Outcome::kError;  // the 5th connects and succeeds
  };
  const ScheduleTimes t = run();
  const std::vector<ns_t> waits = slot_waits_ms(window(), 0);
  ASSERT_GE(waits.size(), 7u);
  const std::vector<ns_t> want = {50, 100, 200, 400, 0, 50, 100};
  EXPECT_EQ(std::vector<ns_t>(waits.begin(), waits.begin() + 7), want);
  EXPECT_EQ(t.stopped_by, StopReason::kDuration);
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

// Request records spilled while the loop runs (records.hpp RequestLog, here past 16 in
// memory) are the records of a loop that keeps them all: the loop reads and changes only
// records in flight or finished within kRequestSpillLag_ns, which stay in memory.
TEST(SpilledRequests, TheLoopMakesTheSameRecordsWhetherOrNotTheySpill) {
  auto run_with = [](std::size_t threshold) {
    FakeClock clock;
    auto records = std::make_unique<CellRecords>();
    records->requests.configure_spill(threshold);
    FakeTransport transport{clock, *records};
    transport.ttft = [](const RequestRecord&) { return 20 * kMs; };
    transport.duration = [](const RequestRecord& r) { return (60 + 10 * (r.slot % 3)) * kMs; };
    transport.outcome = [](const RequestRecord& r) {
      return r.scheduled_ns % 7 == 0 ? Outcome::kError : Outcome::kOk;
    };
    std::atomic<bool> stop{false};
    CellProgress progress;
    ClosedLoopPlan plan;
    plan.bodies = {"A", "B"};
    plan.concurrency = 4;
    plan.duration_ns = 20'000 * kMs;
    plan.stall_min_ns = 2'000 * kMs;
    const ScheduleTimes t = run_closed_loop(plan, transport, clock, *records, stop, &progress);
    EXPECT_EQ(t.stopped_by, StopReason::kDuration);
    return records;
  };
  const auto kept = run_with(0);
  const auto spilled = run_with(16);
  EXPECT_EQ(kept->requests.spilled(), 0u);
  EXPECT_GT(spilled->requests.spilled(), 900u);  // ~1,100 requests, all but the last 2 s
  ASSERT_EQ(kept->requests.size(), spilled->requests.size());
  ASSERT_EQ(kept->events.size(), spilled->events.size());
  std::size_t errors = 0;
  spilled->requests.for_each(0, spilled->requests.size(),
                             [&](std::size_t i, const RequestRecord& b) {
                               const RequestRecord& a = std::as_const(kept->requests)[i];
                               EXPECT_EQ(a.slot, b.slot) << i;
                               EXPECT_EQ(a.body, b.body) << i;
                               EXPECT_EQ(a.sent_ns, b.sent_ns) << i;
                               EXPECT_EQ(a.first_token_ns, b.first_token_ns) << i;
                               EXPECT_EQ(a.done_ns, b.done_ns) << i;
                               EXPECT_EQ(a.outcome, b.outcome) << i;
                               EXPECT_EQ(a.error_kind, b.error_kind) << i;
                               errors += b.outcome == Outcome::kError;
                             });
  EXPECT_GT(errors, 0u);
}

}  // namespace
}  // namespace speedmatrix
