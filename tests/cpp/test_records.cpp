// Event records (records.hpp): every value comes back exactly, whatever the gaps, order or
// sizes; the tail costs ~10 bytes an event; once spilled to files the columns read the same
// (random access, for_each, the mapped hand-over), memory stays bounded, and a spill that
// cannot be written keeps the events in memory with a note (docs/RELIABILITY.md).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <random>
#include <string>
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
  e.push(req, t, tok, srv);
  p.request.push_back(req);
  p.t.push_back(t);
  p.tokens.push_back(tok);
  p.server.push_back(srv);
}

template <class T, class C>
std::vector<T> vec(const C& c) {
  return std::vector<T>(c.data(), c.data() + c.size());
}

// Random access, for_each from a few starts, a copy and (last: it empties e) the hand-over.
void expect_same(EventColumns& e, const Plain& p) {
  ASSERT_EQ(e.size(), p.t.size());
  for (std::size_t i = 0; i < p.t.size(); ++i) {
    ASSERT_EQ(e.request(i), p.request[i]) << i;
    ASSERT_EQ(e.t_ns(i), p.t[i]) << i;
    ASSERT_EQ(e.tokens(i), p.tokens[i]) << i;
    ASSERT_EQ(e.server_ns(i), p.server[i]) << i;
  }
  for (std::size_t from : {std::size_t{0}, std::size_t{1}, p.t.size() / 3, p.t.size()}) {
    std::size_t next = from;
    e.for_each(from, p.t.size(), [&](std::size_t i, std::int32_t q, ns_t t, std::int32_t k) {
      ASSERT_EQ(i, next++);
      ASSERT_EQ(q, p.request[i]) << i;
      ASSERT_EQ(t, p.t[i]) << i;
      ASSERT_EQ(k, p.tokens[i]) << i;
    });
    EXPECT_EQ(next, p.t.size());
  }
  const EventColumns::Plain c = e.plain_copy();
  EXPECT_EQ(vec<std::int32_t>(c.request), p.request);
  EXPECT_EQ(vec<ns_t>(c.t_ns), p.t);
  EXPECT_EQ(vec<std::int32_t>(c.tokens), p.tokens);
  EXPECT_EQ(vec<ns_t>(c.server_ns), p.server);
  const bool spilled = e.spilled() > 0 && e.note().empty();
  EventColumns::Plain h = e.take_plain();
  EXPECT_EQ(h.t_ns.mapped(), spilled);
  EXPECT_EQ(vec<std::int32_t>(h.request), p.request);
  EXPECT_EQ(vec<ns_t>(h.t_ns), p.t);
  EXPECT_EQ(vec<std::int32_t>(h.tokens), p.tokens);
  EXPECT_EQ(vec<ns_t>(h.server_ns), p.server);
  EXPECT_EQ(e.size(), 0u);
}

// 20,000 events with 10 s gaps (new NsColumn blocks), time going back, counts that need the
// CountColumn escape (65535 and more), and server stamps that start late.
Plain fill(EventColumns& e) {
  std::mt19937_64 rng(7);
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
  return p;
}

}  // namespace

TEST(Records, RoundTripWithGapsBackwardsTimeAndLargeCounts) {
  EventColumns e;
  e.configure_spill(0);  // all in memory
  const Plain p = fill(e);
  EXPECT_EQ(e.spilled(), 0u);
  expect_same(e, p);
}

TEST(Records, SpilledColumnsReadTheSameAsUnspilled) {
  // Thresholds that cut the stream at odd places: inside NsColumn blocks, next to escaped
  // counts, before and after the stamps turn dense, and a tail left over at the end.
  for (std::size_t threshold : {std::size_t{1}, std::size_t{7}, std::size_t{4096},
                                std::size_t{5001}, std::size_t{8193}, std::size_t{19999}}) {
    SCOPED_TRACE(threshold);
    EventColumns e;
    e.configure_spill(threshold);
    const Plain p = fill(e);
    EXPECT_EQ(e.spilled(), p.t.size() / threshold * threshold);
    EXPECT_TRUE(e.note().empty()) << e.note();
    expect_same(e, p);
  }
}

TEST(Records, StampsAppearingLateKeepTheEarlierNever) {
  for (std::size_t threshold : {std::size_t{0}, std::size_t{2}}) {
    EventColumns e;
    e.configure_spill(threshold);
    Plain p;
    push(e, p, 0, 10, 1, kNever);
    push(e, p, 0, 20, 1, kNever);
    push(e, p, 1, 30, 1, 25);
    expect_same(e, p);
    EventColumns first;  // a stamp on the very first event
    first.configure_spill(threshold);
    Plain q;
    push(first, q, 0, 5, 1, 4);
    push(first, q, 0, 6, 1, kNever);
    expect_same(first, q);
  }
}

TEST(Records, ATailCostsAboutTenBytesAnEvent) {
  EventColumns e;
  e.configure_spill(0);
  e.reserve(1u << 16);
  const std::size_t n = 2'000'000;  // 80 s at 25K tok/s
  ns_t t = 0;
  for (std::size_t i = 0; i < n; ++i) {
    t += 40'000;
    e.push(static_cast<std::int32_t>(i % 1024), t, 1, kNever);
  }
  double per_event = static_cast<double>(e.memory_bytes()) / static_cast<double>(n);
  // 4 (request) + 4 (time offset) + 2 (count) = 10; no stamp column without stamps (it
  // would add 8). 2M events fill 2^21-entry vectors: growth adds ~5 % here (up to 2x).
  EXPECT_LT(per_event, 12.0) << per_event;
  EXPECT_GE(per_event, 10.0);
  EXPECT_EQ(e.t_ns(n - 1), t);
}

TEST(Records, MemoryStaysBoundedOnceEventsSpill) {
  EventColumns e;
  const std::size_t threshold = 1u << 14;
  e.configure_spill(threshold);
  e.reserve(1u << 16);
  ns_t t = 0;
  std::size_t peak = 0;
  for (std::size_t i = 0; i < 40 * threshold; ++i) {
    t += 40'000;
    e.push(static_cast<std::int32_t>(i % 1024), t, 1, kNever);
    peak = std::max(peak, e.memory_bytes());
  }
  EXPECT_EQ(e.spilled(), 40 * threshold);
  // the tail at its largest, whatever the number of events: ~10 bytes x threshold
  EXPECT_LE(peak, threshold * 21) << peak;
  EXPECT_EQ(e.t_ns(12345), 40'000 * 12346);
  EXPECT_EQ(e.t_ns(40 * threshold - 1), t);
}

TEST(Records, ASpillDirectoryThatCannotBeUsedKeepsTheEventsInMemory) {
  EventColumns e;
  e.configure_spill(1000, "/nonexistent/speedmatrix-spill");
  const Plain p = fill(e);
  EXPECT_EQ(e.spilled(), 0u);
  EXPECT_NE(e.note().find("kept in memory"), std::string::npos) << e.note();
  EXPECT_NE(e.note().find("/nonexistent/speedmatrix-spill"), std::string::npos) << e.note();
  expect_same(e, p);
}

TEST(Records, ASpillFileThatFillsUpKeepsWhatWasWrittenAndTheRestInMemory) {
  // A file size limit makes a write fail part-way (EFBIG), as a full disk does (ENOSPC).
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64 * 1024;  // 8,192 t_ns values: the second 5,000-event spill fails
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  EventColumns e;
  e.configure_spill(5000);
  const Plain p = fill(e);
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_EQ(e.spilled(), 5000u);
  EXPECT_NE(e.note().find("writing the spill file"), std::string::npos) << e.note();
  expect_same(e, p);
}
