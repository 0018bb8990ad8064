// The chain feed (chain.hpp): its hand-over rules alone, then free-running sessions end to
// end against the loopback server, a feeder thread pushing each session's next turn.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loopback_server.hpp"
#include "speedmatrix/cell.hpp"
#include "speedmatrix/chain.hpp"

namespace speedmatrix {
namespace {

using testing::LoopbackServer;
using testing::RouteLog;

constexpr ns_t kMs = 1'000'000;

FinishedTurn turn_of(std::int32_t session, std::int32_t turn, std::int32_t sessions, ns_t done) {
  FinishedTurn t;
  t.session = session;
  t.turn = turn;
  t.body = turn * sessions + session;
  t.outcome = Outcome::kOk;
  t.done_ns = done;
  t.due_ns = done + 5 * kMs;
  return t;
}

TEST(ChainFeed, APushIsTakenOnlyFromASessionWaitingForItsNextTurn) {
  ChainFeed feed(2, 2, 0.005);
  EXPECT_EQ(feed.think_ns(), 5 * kMs);
  EXPECT_FALSE(feed.push(0, "early"));  // turn 0 runs: nothing is awaited yet
  EXPECT_FALSE(feed.push(7, "nobody"));
  feed.finished(turn_of(1, 0, 2, 100 * kMs));
  FinishedTurn got;
  ASSERT_TRUE(feed.next_finished(&got, 1.0));
  EXPECT_EQ(got.session, 1);
  EXPECT_EQ(got.body, 1);
  EXPECT_FALSE(feed.next_finished(&got, 0.01));  // nothing else finished: the timeout
  EXPECT_TRUE(feed.push(1, "n=3"));
  EXPECT_FALSE(feed.push(1, "twice"));  // its turn 1 is already pushed
  std::vector<ChainBody> taken;
  feed.take(taken);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].body, 1 * 2 + 1);  // turn x sessions + session
  EXPECT_EQ(taken[0].turn, 1);
  EXPECT_EQ(taken[0].text, "n=3");
  EXPECT_EQ(taken[0].due_ns, 105 * kMs);
  EXPECT_GT(taken[0].ready_ns, 0);
  const std::vector<ns_t> ready = feed.ready_ns();
  ASSERT_EQ(ready.size(), 4u);
  EXPECT_EQ(ready[3], taken[0].ready_ns);
  EXPECT_EQ(ready[0], kNever);  // first turns are given up front
  EXPECT_FALSE(feed.all_done());
  feed.finished(turn_of(1, 1, 2, 200 * kMs));  // its last turn: done
  feed.finished(turn_of(0, 0, 2, 200 * kMs));
  EXPECT_FALSE(feed.all_done());
  EXPECT_TRUE(feed.end_session(0));  // a session ended early sends no more
  EXPECT_FALSE(feed.end_session(0));
  EXPECT_FALSE(feed.push(0, "late"));
  EXPECT_TRUE(feed.all_done());
  feed.close();
  // closed: what finished is still handed out, then the wait ends at once
  ASSERT_TRUE(feed.next_finished(&got, 1.0));
  ASSERT_TRUE(feed.next_finished(&got, 1.0));
  EXPECT_FALSE(feed.next_finished(&got, 10.0));
  EXPECT_TRUE(feed.closed());
}

struct ChainCellTest : ::testing::Test {
  RouteLog log;
  LoopbackServer server{testing::openai_routes(log)};

  // Two sessions of three turns: session 0 answers 2 tokens, session 1 answers 12 (10 ms
  // apart); a feeder pushes each next turn (the same length again) as its answer arrives.
  CellSpec spec(std::shared_ptr<ChainFeed> chain) {
    CellSpec s;
    s.http.url = server.url("/sse?itl_ms=10");
    s.http.idle_timeout_s = 2;
    s.bodies = {"n=2", "n=12"};
    s.concurrency = 2;
    s.duration_s = 10;
    s.steady_window = false;
    s.keep_output = true;
    s.chain = std::move(chain);
    return s;
  }
};

// The feeder: every finished turn's answer text is kept; the next turn is pushed at once.
void feed_all(ChainFeed& feed, std::map<std::int32_t, std::string>& answers) {
  FinishedTurn t;
  while (!feed.closed() || feed.next_finished(&t, 0)) {
    if (!feed.next_finished(&t, 0.05)) continue;
    answers[t.body] = t.output.text;
    if (t.turn + 1 < feed.turns()) feed.push(t.session, t.session == 0 ? "n=2" : "n=12");
  }
}

TEST_F(ChainCellTest, SessionsRunFreeAndTheCellEndsWhenEveryTurnIsDone) {
  auto feed = std::make_shared<ChainFeed>(2, 3, 0.02);
  std::map<std::int32_t, std::string> answers;
  std::thread feeder([&] { feed_all(*feed, answers); });
  const ns_t t0 = now_ns();
  const CellResult res = CellRunner(spec(feed)).run();
  feeder.join();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  EXPECT_EQ(res.stopped_by, "requests");
  EXPECT_LT(res.end_ns - t0, 3'000 * kMs);  // not the 10 s duration
  ASSERT_EQ(res.requests.size(), 6u);
  std::map<std::int32_t, RequestRecord> by_body;
  for (const RequestRecord& r : res.requests) {
    EXPECT_EQ(r.outcome, Outcome::kOk) << r.error_kind;
    EXPECT_EQ(r.slot, r.body % 2);  // slot = session
    by_body[r.body] = r;
  }
  ASSERT_EQ(by_body.size(), 6u);  // bodies 0..5, each sent once
  const std::vector<ns_t> ready = feed->ready_ns();
  for (std::int32_t b = 2; b < 6; ++b) {
    const RequestRecord& r = by_body[b];
    const RequestRecord& before = by_body[b - 2];
    // due at the previous answer's end + the think time, sent no sooner, and no sooner
    // than its body reached the feed
    EXPECT_EQ(r.scheduled_ns, before.done_ns + 20 * kMs) << "body " << b;
    EXPECT_GE(r.sent_ns, r.scheduled_ns);
    EXPECT_GE(r.sent_ns, ready[static_cast<std::size_t>(b)]);
    EXPECT_GT(ready[static_cast<std::size_t>(b)], before.done_ns);
    // the loop sends it as soon as both are there: woken, not polling
    EXPECT_LT(r.sent_ns - std::max(r.scheduled_ns, ready[static_cast<std::size_t>(b)]), 25 * kMs);
  }
  // Free: the short session did all three turns before the long one's first answer ended
  // (lock step would have held its turn 1 until then).
  EXPECT_LT(by_body[4].sent_ns, by_body[1].done_ns);
  // the feeder got every answer's text (keep_output)
  ASSERT_EQ(answers.size(), 6u);
  EXPECT_EQ(answers[0], "w0w1");
  EXPECT_EQ(res.outputs.size(), 6u);
}

TEST_F(ChainCellTest, AFeederThatPushesNothingLeavesTheCellToItsDurationAndIsReleased) {
  auto feed = std::make_shared<ChainFeed>(2, 3, 0);
  CellSpec s = spec(feed);
  s.duration_s = 0.4;
  std::atomic<int> seen{0};
  std::thread feeder([&] {
    FinishedTurn t;
    while (!feed->closed() || feed->next_finished(&t, 0))
      if (feed->next_finished(&t, 0.05)) ++seen;
  });
  const CellResult res = CellRunner(s).run();
  feeder.join();  // close() released it
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  EXPECT_EQ(res.stopped_by, "duration");
  EXPECT_EQ(res.requests.size(), 2u);  // the first turns only
  EXPECT_EQ(seen.load(), 2);
  EXPECT_FALSE(feed->push(0, "n=2"));  // closed
}

TEST_F(ChainCellTest, EndedSessionsEndTheCellAndABadSpecIsRefused) {
  auto feed = std::make_shared<ChainFeed>(2, 3, 0);
  std::thread feeder([&] {
    FinishedTurn t;
    while (!feed->closed())
      if (feed->next_finished(&t, 0.05)) feed->end_session(t.session);  // a failed turn
  });
  const CellResult res = CellRunner(spec(feed)).run();
  feeder.join();
  EXPECT_EQ(res.stopped_by, "requests");
  EXPECT_EQ(res.requests.size(), 2u);

  CellSpec bad = spec(std::make_shared<ChainFeed>(3, 2, 0));  // 3 sessions, 2 bodies
  const CellResult refused = CellRunner(bad).run();
  EXPECT_NE(refused.fatal_error.find("CellSpec.chain"), std::string::npos);
  EXPECT_TRUE(bad.chain->closed());
}

TEST_F(ChainCellTest, AFailedTurnIsHandedOverAndItsNextTurnWaitsOutTheErrorBackoff) {
  auto feed = std::make_shared<ChainFeed>(2, 2, 0);  // no think time: the backoff decides
  CellSpec s = spec(feed);
  s.http.url = server.url("/500");
  std::vector<FinishedTurn> seen;
  std::thread feeder([&] {
    FinishedTurn t;
    while (!feed->closed() || feed->next_finished(&t, 0)) {
      if (!feed->next_finished(&t, 0.05)) continue;
      seen.push_back(t);
      if (t.turn == 0) feed->push(t.session, "n=2");  // a stand-in's turn, say
    }
  });
  const CellResult res = CellRunner(s).run();
  feeder.join();
  ASSERT_TRUE(res.fatal_error.empty()) << res.fatal_error;
  EXPECT_EQ(res.stopped_by, "requests");
  ASSERT_EQ(seen.size(), 4u);
  for (const FinishedTurn& t : seen) {
    EXPECT_EQ(t.outcome, Outcome::kError);
    EXPECT_EQ(t.error_kind, "http_500");
    // ClosedLoopPlan::error_backoff_ns (50 ms) from its send, at least
    EXPECT_GE(t.due_ns, t.sent_ns + 50 * kMs);
  }
  for (const RequestRecord& r : res.requests) {
    if (r.body >= 2) EXPECT_GE(r.sent_ns, r.scheduled_ns);
  }
}

}  // namespace
}  // namespace speedmatrix
