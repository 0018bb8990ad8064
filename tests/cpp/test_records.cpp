// Compact event records (records.hpp): every value comes back exactly, whatever the gaps,
// order or sizes, and a window's events cost ~10 bytes each (docs/RELIABILITY.md).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "speedmatrix/records.hpp"

using speedmatrix::EventColumns;
using speedmatrix::kNever;
using speedmatrix::ns_t;

namespace {

struct Plain {
  std::vector<std::int32_t> request, tokens;
  std::vector<ns_t> t, server;
};

void push(EventColumns& e, Plain& p, std::int32_t req, ns_t t, std::int32_t tok, ns_t srv) {
  e.request.push_back(req);
  e.t_ns.push_back(t);
  e.tokens.push_back(tok);
  e.server_ns.push_back(srv);
  p.request.push_back(req);
  p.t.push_back(t);
  p.tokens.push_back(tok);
  p.server.push_back(srv);
}

void expect_same(const EventColumns& e, const Plain& p) {
  ASSERT_EQ(e.size(), p.t.size());
  EXPECT_EQ(e.t_ns.to_vector(), p.t);
  EXPECT_EQ(e.tokens.to_vector(), p.tokens);
  EXPECT_EQ(e.server_ns.to_vector(), p.server);
  for (std::size_t i = 0; i < p.t.size(); ++i) {
    ASSERT_EQ(e.t_ns[i], p.t[i]) << i;
    ASSERT_EQ(e.tokens[i], p.tokens[i]) << i;
    ASSERT_EQ(e.server_ns[i], p.server[i]) << i;
  }
}

}  // namespace

TEST(Records, RoundTripWithGapsBackwardsTimeAndLargeCounts) {
  std::mt19937_64 rng(7);
  EventColumns e;
  Plain p;
  ns_t t = 1'000'000'000'000;
  for (int i = 0; i < 20000; ++i) {
    std::uint64_t r = rng() % 1000;
    if (r == 0)
      t += 10'000'000'000;  // a 10 s gap: over 32 bits of ns
    else if (r == 1)
      t -= 5'000;  // time going back (never from CLOCK_MONOTONIC; still kept)
    else
      t += static_cast<ns_t>(rng() % 200'000);
    std::int32_t tok = r == 2 ? 70000 : r == 3 ? 65535 : static_cast<std::int32_t>(1 + rng() % 4);
    ns_t srv = (i > 5000 && r % 2) ? t - 100 : kNever;
    push(e, p, static_cast<std::int32_t>(rng() % 512), t, tok, srv);
  }
  expect_same(e, p);
}

TEST(Records, StampsAppearingLateKeepTheEarlierNever) {
  EventColumns e;
  Plain p;
  push(e, p, 0, 10, 1, kNever);
  push(e, p, 0, 20, 1, kNever);
  EXPECT_EQ(e.server_ns.memory_bytes(), 0u);  // nothing stored without stamps
  push(e, p, 1, 30, 1, 25);
  expect_same(e, p);
  EventColumns first;  // a stamp on the very first event
  Plain q;
  push(first, q, 0, 5, 1, 4);
  push(first, q, 0, 6, 1, kNever);
  expect_same(first, q);
}

TEST(Records, AWindowCostsAboutTenBytesAnEvent) {
  EventColumns e;
  e.reserve(1u << 16);
  const std::size_t n = 2'000'000;  // 80 s at 25K tok/s
  ns_t t = 0;
  for (std::size_t i = 0; i < n; ++i) {
    t += 40'000;
    e.request.push_back(static_cast<std::int32_t>(i % 1024));
    e.t_ns.push_back(t);
    e.tokens.push_back(1);
    e.server_ns.push_back(kNever);
  }
  double per_event = static_cast<double>(e.memory_bytes()) / static_cast<double>(n);
  // 4 (request) + 4 (time offset) + 2 (count) = 10; vector growth can add up to 2x.
  EXPECT_LT(per_event, 20.5) << per_event;
  EXPECT_GE(per_event, 10.0);
  EXPECT_EQ(e.t_ns[n - 1], t);
}
