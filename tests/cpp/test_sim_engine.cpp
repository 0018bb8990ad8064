// The built-in engine's model against a fake clock: batching, admission, queue,
// running cap, prefix cache, abort, chunked-prefill delay, fixed mode.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

#include "speedmatrix/sim.hpp"

namespace sm = speedmatrix::sim;
using speedmatrix::ns_t;

namespace {

constexpr ns_t kMs = 1'000'000;

class FakeClock final : public speedmatrix::Clock {
 public:
  ns_t t = 0;
  ns_t now() override { return t; }
};

sm::Profile small_profile() {
  sm::Profile p;
  p.mode = "batched";
  p.context_length = 4096;
  p.kv_tokens = 4096;
  p.max_running = 8;
  p.block_size = 16;
  p.chunk_tokens = 512;
  p.step_base_ms = 10.0;
  p.step_per_seq_ms = 1.0;
  p.step_per_kv_token_ns = 0.0;
  p.prefill_per_token_us = 10.0;  // 100K tok/s
  p.frontend_overhead_ms = 0.0;
  p.frontend_per_token_us = 0.0;
  return p;
}

// small_profile in fixed mode: TTFT 50 ms, ITL 20 ms per request.
sm::Profile fixed_profile() {
  sm::Profile p = small_profile();
  p.mode = "fixed";
  p.fixed_ttft_ms = 50;
  p.fixed_itl_ms = 20;
  return p;
}

std::vector<std::uint64_t> ids_for(std::uint64_t salt, int n) {
  std::vector<std::uint64_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = salt * 100003 + i;
  return v;
}

sm::RequestSpec spec(sm::RequestId id, int prompt, int max_tokens, std::uint64_t salt,
                     int block = 16) {
  sm::RequestSpec s;
  s.id = id;
  s.prompt_tokens = prompt;
  s.max_tokens = max_tokens;
  s.block_hashes = sm::block_hashes(ids_for(salt, prompt), block);
  return s;
}

struct Harness {
  FakeClock clock;
  sm::Engine engine;
  std::vector<sm::Event> events;
  explicit Harness(sm::Profile p) : engine(std::move(p), clock) {}

  // Runs the model, deadline by deadline, up to time t.
  void run_until(ns_t t) {
    while (true) {
      ns_t d = engine.next_deadline();
      if (d == speedmatrix::kNever || d > t) break;
      clock.t = std::max(clock.t, d);
      engine.advance(events);
    }
    clock.t = std::max(clock.t, t);
    engine.advance(events);
  }
  void at(ns_t t) { run_until(t); }
  std::vector<ns_t> times(sm::RequestId id) const {
    std::vector<ns_t> out;
    for (const auto& e : events)
      if (e.id == id) out.push_back(e.t_ns);
    return out;
  }
  bool finished(sm::RequestId id) const {
    for (const auto& e : events)
      if (e.id == id && e.kind == sm::EventKind::kFinished) return true;
    return false;
  }
};

TEST(SimModel, StepAndPrefillCosts) {
  sm::Profile p = small_profile();
  p.step_per_seq2_ms = 0.5;
  p.step_per_kv_token_ns = 1000.0;  // 1 µs per KV token
  EXPECT_EQ(sm::decode_step_ns(p, 1, 0), 11'500'000);
  EXPECT_EQ(sm::decode_step_ns(p, 2, 1000), 10 * kMs + 2 * kMs + 2 * kMs + 1 * kMs);
  EXPECT_GT(sm::decode_step_ns(p, 4, 0), sm::decode_step_ns(p, 2, 0));
  // A batched surcharge (a faster one-sequence path) costs every step of two or more only.
  sm::Profile q = p;
  q.step_batched_ms = 3.0;
  EXPECT_EQ(sm::decode_step_ns(q, 1, 0), sm::decode_step_ns(p, 1, 0));
  EXPECT_EQ(sm::decode_step_ns(q, 2, 1000), sm::decode_step_ns(p, 2, 1000) + 3 * kMs);
  // A per-step context cost reads the batch's mean context: 2 x 1000 tokens cost as 1 x 1000.
  sm::Profile r = p;
  r.step_per_ctx_token_ns = 2000.0;  // 2 µs per token of the mean context
  EXPECT_EQ(sm::decode_step_ns(r, 1, 1000), sm::decode_step_ns(p, 1, 1000) + 2 * kMs);
  EXPECT_EQ(sm::decode_step_ns(r, 2, 2000), sm::decode_step_ns(p, 2, 2000) + 2 * kMs);
  EXPECT_EQ(sm::decode_step_ns(r, 0, 0), sm::decode_step_ns(p, 0, 0));
  EXPECT_EQ(sm::prefill_ns(p, 0, 100), 1 * kMs);
  p.prefill_per_token_ctx_ns = 1000.0;  // +1 ns per token per 1000 tokens of context
  // Positions 1000..1999: mean 1499.5 -> 10 µs + 1.4995 ns per token.
  EXPECT_EQ(sm::prefill_ns(p, 1000, 1000), 10'000'000 + 1'499'500);
  // Splitting a prefill into chunks costs the same in total.
  EXPECT_NEAR(static_cast<double>(sm::prefill_ns(p, 0, 600) + sm::prefill_ns(p, 600, 400)),
              static_cast<double>(sm::prefill_ns(p, 0, 1000)), 2.0);
}

TEST(SimEngine, WholeBatchSharesOneDecodeStep) {
  Harness h(small_profile());
  for (sm::RequestId id = 1; id <= 3; ++id) h.engine.submit(spec(id, 32, 5, id));
  h.at(1000 * kMs);
  // One prefill chunk of 3 x 32 tokens (0.96 ms) gives all three first tokens at once.
  for (sm::RequestId id = 1; id <= 3; ++id) {
    auto t = h.times(id);
    ASSERT_EQ(t.size(), 5u) << id;
    EXPECT_EQ(t[0], 960'000);
    EXPECT_TRUE(h.finished(id));
  }
  // Every later token of the three leaves at the same instant, one step apart.
  auto a = h.times(1), b = h.times(2), c = h.times(3);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  for (std::size_t k = 1; k < a.size(); ++k) {
    std::int64_t kv = 3 * (32 + static_cast<std::int64_t>(k));
    EXPECT_EQ(a[k] - a[k - 1], sm::decode_step_ns(h.engine.profile(), 3, kv)) << k;
  }
  // The trace records each step with its batch and KV tokens.
  const auto& tr = h.engine.trace();
  ASSERT_EQ(tr.size(), 4u);
  EXPECT_EQ(tr[0].batch, 3);
  EXPECT_EQ(tr[0].kv_tokens, 3 * 33);
  EXPECT_EQ(tr[0].t_ns, a[1]);
  EXPECT_EQ(tr[0].step_ns, 13 * kMs);
  EXPECT_EQ(h.engine.state().generation_tokens_total, 15);
}

TEST(SimEngine, LaterArrivalJoinsAtTheNextIteration) {
  Harness h(small_profile());
  h.engine.submit(spec(1, 16, 100, 1));
  h.at(5 * kMs);  // request 1 is decoding; its first step ends at 0.16 + 11 ms
  h.engine.submit(spec(2, 16, 100, 2));
  h.at(200 * kMs);
  auto t1 = h.times(1), t2 = h.times(2);
  // Request 2's prefill runs at the start of the iteration after its arrival.
  EXPECT_EQ(t2[0], t1[1] + 160'000);
  // It decodes from the iteration after its prefill; from then on both leave together.
  EXPECT_EQ(t2[1], t1[3]);
  EXPECT_EQ(t2[2], t1[4]);
}

TEST(SimEngine, AdmissionByKvPoolAndFifoQueue) {
  sm::Profile p = small_profile();
  p.max_running = 100;
  Harness h(p);
  // Each needs 500 + 500 = 1000 KV tokens: 4 fit into 4096, the 5th waits.
  for (sm::RequestId id = 1; id <= 5; ++id) h.engine.submit(spec(id, 500, 500, id));
  h.at(1 * kMs);
  auto st = h.engine.state();
  EXPECT_EQ(st.running, 4);
  EXPECT_EQ(st.waiting, 1);
  EXPECT_EQ(st.kv_reserved_tokens, 4000);
  EXPECT_TRUE(h.times(5).empty());
  // When the first four finish, the fifth is admitted.
  h.at(60'000 * kMs);
  EXPECT_TRUE(h.finished(5));
  ns_t last_of_first = h.times(1).back();
  EXPECT_GE(h.times(5).front(), last_of_first);
  st = h.engine.state();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.kv_reserved_tokens, 0);
}

TEST(SimEngine, HeadOfLineBlocksSmallerRequestsBehind) {
  sm::Profile p = small_profile();
  p.max_running = 100;
  Harness h(p);
  h.engine.submit(spec(1, 1000, 2000, 1));  // 3000 of 4096
  h.engine.submit(spec(2, 1000, 1000, 2));  // 2000: does not fit, waits
  h.engine.submit(spec(3, 16, 16, 3));      // would fit, but FIFO keeps it behind 2
  h.at(1 * kMs);
  auto st = h.engine.state();
  EXPECT_EQ(st.running, 1);
  EXPECT_EQ(st.waiting, 2);
}

TEST(SimEngine, RunningCap) {
  sm::Profile p = small_profile();
  p.max_running = 2;
  Harness h(p);
  for (sm::RequestId id = 1; id <= 3; ++id) h.engine.submit(spec(id, 16, 10, id));
  h.at(2 * kMs);
  auto st = h.engine.state();
  EXPECT_EQ(st.running, 2);
  EXPECT_EQ(st.waiting, 1);
  h.at(10'000 * kMs);
  EXPECT_TRUE(h.finished(3));
  EXPECT_GE(h.times(3).front(), h.times(1).back());
}

TEST(SimEngine, RejectsTooLongRequests) {
  FakeClock c;
  sm::Engine e(small_profile(), c);
  EXPECT_EQ(e.validate(100, 100), "");
  EXPECT_NE(e.validate(4000, 100).find("context length"), std::string::npos);
  EXPECT_NE(e.validate(0, 10), "");
  EXPECT_NE(e.validate(10, 0), "");
}

TEST(SimEngine, PrefixCacheSkipsCachedPrefill) {
  sm::Profile p = small_profile();
  Harness h(p);
  h.engine.submit(spec(1, 1024, 1, 42));
  h.at(100 * kMs);
  ASSERT_TRUE(h.finished(1));
  ns_t cold = h.times(1)[0];
  EXPECT_EQ(cold, sm::prefill_ns(p, 0, 512) + sm::prefill_ns(p, 512, 512));  // two chunks
  h.clock.t = 1000 * kMs;
  h.engine.submit(spec(2, 1024, 1, 42));  // the same prompt
  h.at(1100 * kMs);
  ASSERT_TRUE(h.finished(2));
  ns_t warm = h.times(2)[0] - 1000 * kMs;
  EXPECT_EQ(warm, sm::prefill_ns(p, 1023, 1));  // only the last token is recomputed
  EXPECT_LT(warm * 100, cold);
  auto st = h.engine.state();
  EXPECT_EQ(st.cache_hit_tokens, 1023);
  EXPECT_EQ(st.cache_query_tokens, 2048);
  EXPECT_EQ(st.prefill_tokens_total, 1025);
  EXPECT_EQ(st.kv_cached_tokens, 1024);  // evictable now that both are done
  EXPECT_EQ(h.events.back().cached_tokens, 1023);
  // A prompt sharing only the first 256 tokens reuses those 16 blocks.
  auto s3 = spec(3, 1024, 1, 42);
  auto other = sm::block_hashes(ids_for(7, 1024), 16);
  auto ids = ids_for(42, 256);
  auto tail = ids_for(7, 768);
  ids.insert(ids.end(), tail.begin(), tail.end());
  s3.block_hashes = sm::block_hashes(ids, 16);
  h.clock.t = 2000 * kMs;
  h.engine.submit(s3);
  h.at(2100 * kMs);
  EXPECT_EQ(h.events.back().cached_tokens, 256);
  (void)other;
  // Flushing drops the cache: the same prompt is cold again.
  EXPECT_GT(h.engine.flush_cache(), 0);
  EXPECT_EQ(h.engine.state().kv_cached_tokens, 0);
  h.clock.t = 3000 * kMs;
  h.engine.submit(spec(4, 1024, 1, 42));
  h.at(3100 * kMs);
  EXPECT_EQ(h.events.back().cached_tokens, 0);
}

TEST(SimEngine, AnswerBlocksStayCachedForTheNextTurn) {
  // A conversation: turn 2's prompt is turn 1's prompt (512), its answer (32 generated
  // tokens) and a new message (64). The engine cached the answer's blocks too, so turn 2
  // finds 544 tokens: the previous prompt and answer, as vLLM and SGLang keep them.
  Harness h(small_profile());
  const auto prompt = ids_for(42, 512), answer = ids_for(43, 32), message = ids_for(44, 64);
  auto first = spec(1, 512, 32, 42);
  auto whole = prompt;
  whole.insert(whole.end(), answer.begin(), answer.end());
  auto chain = sm::block_hashes(whole, 16);
  first.output_block_hashes.assign(chain.begin() + 32, chain.end());
  h.engine.submit(first);
  h.at(2000 * kMs);
  ASSERT_TRUE(h.finished(1));
  EXPECT_EQ(h.engine.state().kv_cached_tokens, 544);
  whole.insert(whole.end(), message.begin(), message.end());
  sm::RequestSpec next = spec(2, 608, 1, 0);
  next.block_hashes = sm::block_hashes(whole, 16);
  h.clock.t = 3000 * kMs;
  h.engine.submit(next);
  h.at(3100 * kMs);
  ASSERT_TRUE(h.finished(2));
  EXPECT_EQ(h.events.back().cached_tokens, 544);
}

TEST(SimEngine, CacheIsLruWithinFreePool) {
  sm::Profile p = small_profile();
  p.kv_tokens = 2048;
  Harness h(p);
  h.engine.submit(spec(1, 1024, 1, 1));
  h.at(100 * kMs);
  h.engine.submit(spec(2, 1024, 1, 2));
  h.at(200 * kMs);
  // Admitting prompt 2 (1025 tokens reserved) evicted one block of prompt 1.
  EXPECT_EQ(h.engine.state().kv_cached_tokens, 2048 - 16);
  // A third prompt needs 1025 tokens: the least recently used blocks (prompt 1) go.
  h.engine.submit(spec(3, 1024, 1, 3));
  h.at(300 * kMs);
  auto st = h.engine.state();
  EXPECT_LE(st.kv_cached_tokens + st.kv_reserved_tokens, 2048);
  h.engine.submit(spec(4, 1024, 1, 2));  // prompt 2 is still cached (partly at least)
  h.at(400 * kMs);
  EXPECT_GT(h.events.back().cached_tokens, 0);
  h.engine.submit(spec(5, 1024, 1, 1));  // prompt 1 was evicted first
  h.at(500 * kMs);
  EXPECT_EQ(h.events.back().cached_tokens, 0);
}

TEST(SimEngine, AbortFreesKvAtOnce) {
  sm::Profile p = small_profile();
  p.max_running = 100;
  Harness h(p);
  for (sm::RequestId id = 1; id <= 5; ++id) h.engine.submit(spec(id, 500, 500, id));
  h.at(50 * kMs);
  EXPECT_EQ(h.engine.state().waiting, 1);
  h.engine.abort(2);
  auto st = h.engine.state();
  EXPECT_EQ(st.kv_reserved_tokens, 3000);
  EXPECT_EQ(st.requests_aborted, 1);
  std::size_t before = h.times(2).size();
  h.at(100 * kMs);
  // The waiting request is admitted at the next iteration; the aborted one sends nothing more.
  EXPECT_EQ(h.engine.state().waiting, 0);
  EXPECT_EQ(h.engine.state().running, 4);
  EXPECT_FALSE(h.times(5).empty());
  EXPECT_EQ(h.times(2).size(), before);
  // Aborting a waiting or unknown request is fine too.
  h.engine.abort(12345);
  h.engine.submit(spec(6, 3000, 500, 6));
  h.at(101 * kMs);
  EXPECT_EQ(h.engine.state().waiting, 1);
  h.engine.abort(6);
  EXPECT_EQ(h.engine.state().waiting, 0);
}

TEST(SimEngine, LongPrefillDelaysTheBatchStep) {
  sm::Profile p = small_profile();
  p.kv_tokens = 100000;
  p.context_length = 100000;
  Harness h(p);
  h.engine.submit(spec(1, 16, 200, 1));
  h.at(50 * kMs);
  h.engine.submit(spec(2, 2048, 10, 2));  // 4 chunks of 512: 5.12 ms each
  h.at(500 * kMs);
  auto t1 = h.times(1);
  std::map<ns_t, int> gaps;
  for (std::size_t k = 1; k < t1.size(); ++k) gaps[t1[k] - t1[k - 1]]++;
  ns_t chunk = sm::prefill_ns(p, 0, 512);
  EXPECT_EQ(chunk, 5'120'000);
  // Four gaps carry a prefill chunk on top of the 11 ms single-sequence step.
  int delayed = 0;
  for (auto& [g, n] : gaps)
    if (g > 16 * kMs) delayed += n;
  EXPECT_EQ(delayed, 4);
  bool saw = false;
  for (const auto& r : h.engine.trace())
    if (r.prefill_tokens == 512) {
      saw = true;
      EXPECT_GE(r.prefill_ns, chunk);
    }
  EXPECT_TRUE(saw);
  // Request 2's first token comes at the end of its fourth chunk.
  EXPECT_FALSE(h.times(2).empty());
}

TEST(SimEngine, FreePrefillWarmsTheCacheAtNoCost) {
  sm::Profile p = small_profile();
  p.frontend_overhead_ms = 5.0;
  Harness h(p);
  auto warm = spec(1, 1024, 1, 9);
  warm.free_prefill = true;
  h.engine.submit(warm);
  h.at(100 * kMs);
  EXPECT_EQ(h.times(1)[0], 0);  // no front-end, no prefill time
  h.clock.t = 1000 * kMs;
  h.engine.submit(spec(2, 1024, 1, 9));
  h.at(1100 * kMs);
  EXPECT_EQ(h.events.back().cached_tokens, 1023);
}

TEST(SimEngine, FrontEndIsSerial) {
  sm::Profile p = small_profile();
  p.frontend_overhead_ms = 5.0;
  p.frontend_per_token_us = 100.0;  // 1.6 ms per 16-token prompt
  p.prefill_per_token_us = 0.0;
  Harness h(p);
  for (sm::RequestId id = 1; id <= 3; ++id) h.engine.submit(spec(id, 16, 1, id));
  h.at(100 * kMs);
  EXPECT_EQ(h.times(1)[0], 6'600'000);
  EXPECT_EQ(h.times(2)[0], 8'200'000);
  EXPECT_EQ(h.times(3)[0], 9'800'000);
}

TEST(SimEngine, AbortInTheFrontEndGivesBackItsTime) {
  sm::Profile p = small_profile();
  p.frontend_overhead_ms = 5.0;
  p.frontend_per_token_us = 1000.0;  // 16 ms per 16-token prompt
  p.prefill_per_token_us = 0.0;
  {
    // 1: 5-21 ms, 2: 21-37, 3: 37-53. Aborting 2 before it starts moves 3 up.
    Harness h(p);
    for (sm::RequestId id = 1; id <= 3; ++id) h.engine.submit(spec(id, 16, 1, id));
    h.at(10 * kMs);
    h.engine.abort(2);
    h.at(200 * kMs);
    EXPECT_EQ(h.times(1)[0], 21 * kMs);
    EXPECT_TRUE(h.times(2).empty());
    EXPECT_EQ(h.times(3)[0], 37 * kMs);
  }
  {
    // At 25 ms, 2 is being processed and 3 waits: aborting both frees the front-end
    // at once, so a request arriving then starts after its own overhead (30 ms).
    Harness h(p);
    for (sm::RequestId id = 1; id <= 3; ++id) h.engine.submit(spec(id, 16, 1, id));
    h.at(25 * kMs);
    h.engine.abort(2);
    h.engine.abort(3);
    h.engine.submit(spec(4, 16, 1, 4));
    h.at(200 * kMs);
    EXPECT_EQ(h.times(4)[0], 46 * kMs);  // not 69 ms, behind the aborted work
  }
}

TEST(SimEngine, DeadlinesAreAbsoluteWhateverTheCallerLatency) {
  Harness h(small_profile());
  h.engine.submit(spec(1, 16, 50, 1));
  // Advance with a late, irregular caller: model times do not drift.
  std::vector<ns_t> pokes = {3, 17, 40, 41, 90, 300, 301, 700};
  for (ns_t ms : pokes) {
    h.clock.t = ms * kMs;
    h.engine.advance(h.events);
  }
  h.at(2000 * kMs);
  auto t = h.times(1);
  ASSERT_EQ(t.size(), 50u);
  for (std::size_t k = 1; k < t.size(); ++k)
    EXPECT_EQ(t[k] - t[k - 1],
              sm::decode_step_ns(h.engine.profile(), 1, 16 + static_cast<std::int64_t>(k)));
}

TEST(SimEngine, FixedModeIsExact) {
  Harness h(fixed_profile());
  h.clock.t = 7 * kMs;
  h.engine.submit(spec(1, 100, 5, 1));
  h.clock.t = 12 * kMs;
  for (sm::RequestId id = 2; id <= 65; ++id) h.engine.submit(spec(id, 100, 5, id));
  h.clock.t = 70 * kMs;  // late poke
  h.engine.advance(h.events);
  h.at(1000 * kMs);
  auto t = h.times(1);
  ASSERT_EQ(t.size(), 5u);
  for (std::size_t k = 0; k < t.size(); ++k)
    EXPECT_EQ(t[k], 7 * kMs + 50 * kMs + static_cast<ns_t>(k) * 20 * kMs);
  for (sm::RequestId id = 2; id <= 65; ++id) {
    auto u = h.times(id);
    ASSERT_EQ(u.size(), 5u);
    EXPECT_EQ(u[0], 62 * kMs);
    EXPECT_EQ(u[4], 142 * kMs);
  }
  EXPECT_EQ(h.engine.state().running, 0);
  // Abort stops a fixed-mode request too.
  h.engine.submit(spec(100, 10, 100, 1));
  h.at(1100 * kMs);
  h.engine.abort(100);
  std::size_t n = h.times(100).size();
  h.at(5000 * kMs);
  EXPECT_EQ(h.times(100).size(), n);
  EXPECT_EQ(h.engine.next_deadline() == speedmatrix::kNever || h.engine.next_deadline() > 0, true);
}

TEST(SimEngine, EosEndsARequestBeforeMaxTokens) {
  Harness h(small_profile());
  sm::RequestSpec eos = spec(1, 32, 10, 1);
  eos.eos_at = 4;                             // the model ends its answer after 4 tokens
  sm::RequestSpec full = spec(2, 32, 10, 2);  // eos_at 0: ignore_eos, runs to max_tokens
  sm::RequestSpec late = spec(3, 32, 10, 3);
  late.eos_at = 50;  // EOS would come after max_tokens: length wins
  EXPECT_EQ(sm::output_tokens(eos), 4);
  EXPECT_EQ(sm::output_tokens(full), 10);
  EXPECT_EQ(sm::output_tokens(late), 10);
  h.engine.submit(eos);
  h.engine.submit(full);
  h.engine.submit(late);
  h.at(1 * kMs);
  // Admission reserves max_tokens whatever the EOS: the engine cannot know it in advance.
  EXPECT_EQ(h.engine.state().kv_reserved_tokens, 3 * (32 + 10));
  h.at(10'000 * kMs);
  ASSERT_EQ(h.times(1).size(), 4u);
  EXPECT_TRUE(h.finished(1));
  EXPECT_EQ(h.times(2).size(), 10u);
  EXPECT_EQ(h.times(3).size(), 10u);
  // The stopped request left the batch: later steps carry the other two only.
  EXPECT_EQ(h.engine.trace().front().batch, 3);
  EXPECT_EQ(h.engine.trace().back().batch, 2);
  auto st = h.engine.state();
  EXPECT_EQ(st.requests_finished, 3);
  EXPECT_EQ(st.requests_stopped, 1);
  EXPECT_EQ(st.generation_tokens_total, 24);
  EXPECT_EQ(st.kv_reserved_tokens, 0);
}

TEST(SimEngine, EosInFixedMode) {
  Harness h(fixed_profile());
  sm::RequestSpec s = spec(1, 10, 100, 1);
  s.eos_at = 3;
  h.engine.submit(s);
  h.at(10'000 * kMs);
  EXPECT_EQ(h.times(1), (std::vector<ns_t>{50 * kMs, 70 * kMs, 90 * kMs}));
  EXPECT_TRUE(h.finished(1));
  EXPECT_EQ(h.engine.state().requests_stopped, 1);
}

TEST(SimProfile, ParsesOverridesAndRejectsUnknownFields) {
  auto p = sm::parse_profile(R"({"name":"x","mode":"fixed","fixed_itl_ms":20,"description":"d"})",
                             {"fixed_itl_ms=12.5", "model=\"m\"", "flavour=vllm"});
  EXPECT_EQ(p.name, "x");
  EXPECT_EQ(p.mode, "fixed");
  EXPECT_DOUBLE_EQ(p.fixed_itl_ms, 12.5);
  EXPECT_EQ(p.model, "m");
  EXPECT_EQ(p.flavour, "vllm");
  EXPECT_THROW(sm::parse_profile(R"({"bogus":1})"), std::runtime_error);
  EXPECT_THROW(sm::parse_profile(R"({"flavour":"tgi"})"), std::runtime_error);
  EXPECT_THROW(sm::parse_profile(R"({"kv_tokens":"lots"})"), std::runtime_error);
  EXPECT_THROW(sm::parse_profile("{}", {"noequals"}), std::runtime_error);
  auto again = sm::parse_profile(sm::profile_to_json(p));
  EXPECT_DOUBLE_EQ(again.fixed_itl_ms, 12.5);
  // eos_after: absent = 0 (never), round-trips, and cannot be negative.
  EXPECT_EQ(p.eos_after, 0);
  EXPECT_EQ(
      sm::parse_profile(sm::profile_to_json(sm::parse_profile("{}", {"eos_after=7"}))).eos_after,
      7);
  EXPECT_THROW(sm::parse_profile(R"({"eos_after":-1})"), std::runtime_error);
  EXPECT_THROW(sm::parse_profile("{}", {"step_base_ms=-5"}), std::runtime_error);
  EXPECT_THROW(sm::parse_profile("{}", {"fixed_itl_ms=1e300"}), std::runtime_error);
}

TEST(SimVocab, IdsAndWordsRoundTrip) {
  for (std::uint64_t id : {0ull, 1ull, 25ull, 26ull, 701ull, 12345ull, 151935ull}) {
    std::string w = sm::token_word(id);
    EXPECT_EQ(sm::word_token(w.data(), w.size(), 151936), id) << w;
  }
  EXPECT_EQ(sm::token_word(0), "a");
  EXPECT_EQ(sm::token_word(26), "aa");
  std::string hello = "Hello,";
  auto h = sm::word_token(hello.data(), hello.size(), 1000);
  EXPECT_LT(h, 1000u);
  EXPECT_EQ(h, sm::word_token(hello.data(), hello.size(), 1000));
  // Block hashes chain: equal prefixes give equal leading hashes.
  std::vector<std::uint64_t> a = ids_for(1, 64), b = a;
  b[40] = 999;
  auto ha = sm::block_hashes(a, 16), hb = sm::block_hashes(b, 16);
  ASSERT_EQ(ha.size(), 4u);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_EQ(ha[1], hb[1]);
  EXPECT_NE(ha[2], hb[2]);
  EXPECT_NE(ha[3], hb[3]);
  EXPECT_EQ(sm::block_hashes(ids_for(1, 15), 16).size(), 0u);
}

}  // namespace
