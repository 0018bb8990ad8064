// Seed fidelity in virtual time: the `seed-h200` profile's engine model, driven
// by a fake clock through the client's closed loop (warm-up, then N streams that
// each send their next request the moment the last one finished), must land
// within 10% of the real H200's figures in tests/data/seed_report.txt, for every
// decode cell the profile must reproduce (tests/python/seed.py `reproducible`:
// average active <= 1.7 x N). Figures come from summarize_cell, as in a sweep.
// The real-time tier (tests/python/test_seed_fidelity.py) checks the same with
// the HTTP server in between; this one checks the model in milliseconds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "speedmatrix/records.hpp"
#include "speedmatrix/sim.hpp"
#include "speedmatrix/stats.hpp"

namespace sm = speedmatrix::sim;
using speedmatrix::kNever;
using speedmatrix::ns_t;

namespace {

constexpr ns_t kS = 1'000'000'000;

class FakeClock final : public speedmatrix::Clock {
 public:
  ns_t t = 0;
  ns_t now() override { return t; }
};

struct SeedCell {
  std::string label;
  int concurrency = 0;
  double total_tok_s = 0, per_request_tok_s = 0, avg_active = 0;
};

std::string trim(const std::string& s) {
  const auto a = s.find_first_not_of(' '), b = s.find_last_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

double number(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), ','), s.end());
  return std::stod(s);
}

// The seed's decode cells that the profile reproduces (seed.py `reproducible`).
std::vector<SeedCell> seed_cells() {
  std::ifstream in(SM_TEST_DATA_DIR "/seed_report.txt");
  std::vector<SeedCell> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| Sustained decode |", 0) != 0) continue;
    std::vector<std::string> f;
    std::stringstream ss(line.substr(1));
    std::string part;
    while (std::getline(ss, part, '|')) f.push_back(trim(part));
    if (f.size() < 9 || (f[3] != "Valid" && f[3] != "Requests queued")) continue;
    SeedCell c{f[1], std::stoi(f[2]), number(f[4]), number(f[5]), number(f[8])};
    if (c.avg_active <= 1.7 * c.concurrency) out.push_back(c);
  }
  return out;
}

std::int64_t label_tokens(const std::string& label) {
  return std::llround(std::stod(label.substr(0, label.size() - 1)) * 1024);
}

// One closed-loop decode cell in virtual time, as the sweep runs it: N prompts
// of `context` tokens sharing all but their last 512, a warm-up of each with one
// output token, then a window of `duration_s` in which every stream sends its
// prompt again with `max_output` tokens as soon as its last request finished.
speedmatrix::CellFigures virtual_cell(const sm::Profile& p, std::int64_t context, int n,
                                      std::int64_t max_output, double duration_s) {
  FakeClock clock;
  sm::Engine engine(p, clock);
  const std::int64_t shared = context - 512;
  std::vector<std::vector<std::uint64_t>> hashes(static_cast<std::size_t>(n));
  for (int s = 0; s < n; ++s) {
    std::vector<std::uint64_t> ids(static_cast<std::size_t>(context));
    for (std::int64_t k = 0; k < context; ++k) {
      ids[static_cast<std::size_t>(k)] =
          k < shared ? static_cast<std::uint64_t>(k) : 10'000'000ull * (s + 1) + k;
    }
    hashes[static_cast<std::size_t>(s)] = sm::block_hashes(ids, p.block_size);
  }
  // Records of the window, as the client keeps them.
  std::vector<ns_t> sent, first, done;
  std::vector<std::uint8_t> outcome, phase;
  std::vector<std::int64_t> prompt;
  std::vector<std::int32_t> ev_req, ev_tok;
  std::vector<ns_t> ev_t;
  std::unordered_map<sm::RequestId, int> row_of;  // engine id -> window row
  std::unordered_map<sm::RequestId, int> slot_of;
  std::unordered_map<sm::RequestId, std::int64_t> generated;
  sm::RequestId next_id = 1;
  auto submit = [&](int slot, std::int64_t max_tokens, bool window) {
    sm::RequestSpec spec;
    spec.id = next_id++;
    spec.prompt_tokens = context;
    spec.max_tokens = max_tokens;
    spec.block_hashes = hashes[static_cast<std::size_t>(slot)];
    engine.submit(spec);
    slot_of[spec.id] = slot;
    if (window) {
      row_of[spec.id] = static_cast<int>(sent.size());
      sent.push_back(clock.t);
      first.push_back(kNever);
      done.push_back(kNever);
      outcome.push_back(static_cast<std::uint8_t>(speedmatrix::Outcome::kCancelled));
      phase.push_back(static_cast<std::uint8_t>(speedmatrix::Phase::kWindow));
      prompt.push_back(context);
    }
  };
  std::vector<sm::Event> events;
  auto run_until = [&](ns_t limit, auto&& on_event) {
    while (true) {
      const ns_t d = engine.next_deadline();
      if (d == kNever || d > limit) break;
      clock.t = std::max(clock.t, d);
      events.clear();
      engine.advance(events);
      for (const sm::Event& e : events) on_event(e);
    }
  };
  // Warm-up: every prompt once, at once; the window starts when the last is done.
  int warm_left = n;
  for (int s = 0; s < n; ++s) submit(s, 1, false);
  run_until(1000 * kS,
            [&](const sm::Event& e) { warm_left -= e.kind == sm::EventKind::kFinished; });
  EXPECT_EQ(warm_left, 0);
  const ns_t t0 = clock.t, t1 = t0 + std::llround(duration_s * 1e9);
  for (int s = 0; s < n; ++s) submit(s, max_output, true);
  run_until(t1, [&](const sm::Event& e) {
    const auto it = row_of.find(e.id);
    if (it == row_of.end()) return;
    const auto row = static_cast<std::size_t>(it->second);
    const std::int64_t tokens = e.generated - generated[e.id];
    generated[e.id] = e.generated;
    if (first[row] == kNever) first[row] = e.t_ns;
    ev_req.push_back(it->second);
    ev_t.push_back(e.t_ns);
    ev_tok.push_back(static_cast<std::int32_t>(tokens));
    if (e.kind == sm::EventKind::kFinished) {
      done[row] = e.t_ns;
      outcome[row] = static_cast<std::uint8_t>(speedmatrix::Outcome::kOk);
      submit(slot_of[e.id], max_output, true);  // the stream's next request
    }
  });
  speedmatrix::RecordView v{sent, first, done, outcome, phase, prompt, ev_req, ev_t, ev_tok};
  return speedmatrix::summarize_cell(v, t0, t1);
}

TEST(SeedFidelity, DecodeCellsWithinTenPercentInVirtualTime) {
  const sm::Profile p =
      sm::load_profile(SM_TEST_DATA_DIR "/../../python/speedmatrix/profiles/seed-h200.json");
  const std::vector<SeedCell> cells = seed_cells();
  ASSERT_GE(cells.size(), 20u);  // the real-time test names 21
  for (const SeedCell& c : cells) {
    SCOPED_TRACE(c.label + " x " + std::to_string(c.concurrency));
    const auto f = virtual_cell(p, label_tokens(c.label), c.concurrency, 4096, 30.0);
    std::printf("%s x %d: %.1f (seed %.1f) tok/s, %.1f (seed %.1f) per request\n", c.label.c_str(),
                c.concurrency, f.total_tok_s, c.total_tok_s, f.per_request_tok_s,
                c.per_request_tok_s);
    EXPECT_NEAR(f.total_tok_s, c.total_tok_s, 0.10 * c.total_tok_s);
    EXPECT_NEAR(f.per_request_tok_s, c.per_request_tok_s, 0.10 * c.per_request_tok_s);
    EXPECT_NEAR(f.avg_active, c.concurrency, 0.02 * c.concurrency);
  }
}

// The check can fail: an engine 25% slower per decode step is out of tolerance.
TEST(SeedFidelity, ASlowerStepIsCaught) {
  sm::Profile p =
      sm::load_profile(SM_TEST_DATA_DIR "/../../python/speedmatrix/profiles/seed-h200.json");
  p.step_base_ms *= 1.25;
  int outside = 0, cells = 0;
  for (const SeedCell& c : seed_cells()) {
    const auto f = virtual_cell(p, label_tokens(c.label), c.concurrency, 4096, 30.0);
    outside += std::abs(f.total_tok_s - c.total_tok_s) > 0.10 * c.total_tok_s;
    ++cells;
  }
  EXPECT_GT(outside, cells / 2);
}

}  // namespace
