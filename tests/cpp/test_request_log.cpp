// Request records (records.hpp RequestLog): finished records past the threshold are spilled
// and read back exactly (random access, for_each, iteration), records in flight and those
// finished too recently stay in memory and writable, a spilled record cannot be changed,
// memory stays bounded whatever the number of requests, and a spill that cannot be written
// keeps every record in memory with a note (docs/RELIABILITY.md).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "speedmatrix/records.hpp"

using speedmatrix::kNever;
using speedmatrix::ns_t;
using speedmatrix::Outcome;
using speedmatrix::Phase;
using speedmatrix::RequestLog;
using speedmatrix::RequestRecord;
using speedmatrix::TokenSource;

namespace {

// Request i: every field depends on i; every 7th is an error with a long message (past the
// short-string buffer), every 5th has empty strings, request i finished at done_ns = i ms.
RequestRecord make(std::size_t i) {
  RequestRecord r;
  const auto k = static_cast<std::int64_t>(i);
  r.slot = static_cast<std::int32_t>(i % 64);
  r.body = static_cast<std::int32_t>(i % 3);
  r.phase = i < 4 ? Phase::kWarmup : Phase::kWindow;
  r.scheduled_ns = k * 1'000'000 - 500;
  r.sent_ns = r.scheduled_ns + 7;
  r.first_byte_ns = i % 11 == 0 ? kNever : r.sent_ns + 100;
  r.first_token_ns = i % 11 == 0 ? kNever : r.sent_ns + 200;
  r.first_content_ns = i % 11 == 0 || i % 3 == 0 ? kNever : r.sent_ns + 300 + k;
  r.done_ns = k * 1'000'000;
  r.http_status = i % 7 == 0 ? 503 : 200;
  r.prompt_tokens = i % 13 == 0 ? -1 : k * 3;
  r.output_tokens = k % 2000;
  r.reasoning_tokens = i % 6 == 0 ? -1 : k % 1500;
  r.cached_tokens = i % 4 == 0 ? -1 : k * 2;
  r.reasoning_deltas = static_cast<std::int32_t>(k % 1400);
  r.token_source = i % 2 ? TokenSource::kUsageContinuous : TokenSource::kNone;
  r.outcome = i % 7 == 0 ? Outcome::kError : Outcome::kOk;
  r.retries = static_cast<std::int32_t>(i % 4);
  if (i % 5 != 0) r.finish_reason = i % 2 ? "length" : "stop";
  if (i % 7 == 0) {
    r.error_kind = "http_503";
    r.error_message = "server overloaded, request " + std::to_string(i) + std::string(40, '.');
  }
  return r;
}

void expect_equal(const RequestRecord& a, const RequestRecord& b, std::size_t i) {
  EXPECT_EQ(a.slot, b.slot) << i;
  EXPECT_EQ(a.body, b.body) << i;
  EXPECT_EQ(a.phase, b.phase) << i;
  EXPECT_EQ(a.scheduled_ns, b.scheduled_ns) << i;
  EXPECT_EQ(a.sent_ns, b.sent_ns) << i;
  EXPECT_EQ(a.first_byte_ns, b.first_byte_ns) << i;
  EXPECT_EQ(a.first_token_ns, b.first_token_ns) << i;
  EXPECT_EQ(a.first_content_ns, b.first_content_ns) << i;
  EXPECT_EQ(a.done_ns, b.done_ns) << i;
  EXPECT_EQ(a.http_status, b.http_status) << i;
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens) << i;
  EXPECT_EQ(a.output_tokens, b.output_tokens) << i;
  EXPECT_EQ(a.reasoning_tokens, b.reasoning_tokens) << i;
  EXPECT_EQ(a.cached_tokens, b.cached_tokens) << i;
  EXPECT_EQ(a.reasoning_deltas, b.reasoning_deltas) << i;
  EXPECT_EQ(a.token_source, b.token_source) << i;
  EXPECT_EQ(a.outcome, b.outcome) << i;
  EXPECT_EQ(a.retries, b.retries) << i;
  EXPECT_EQ(a.finish_reason, b.finish_reason) << i;
  EXPECT_EQ(a.error_kind, b.error_kind) << i;
  EXPECT_EQ(a.error_message, b.error_message) << i;
}

// Every way of reading the log gives records 0..n-1 as make() made them.
void expect_all(const RequestLog& log, std::size_t n) {
  ASSERT_EQ(log.size(), n);
  for (std::size_t i = 0; i < n; i += 37) expect_equal(std::as_const(log)[i], make(i), i);
  std::size_t seen = 0;
  log.for_each(0, n, [&](std::size_t i, const RequestRecord& r) {
    EXPECT_EQ(i, seen);
    expect_equal(r, make(i), i);
    ++seen;
  });
  EXPECT_EQ(seen, n);
  seen = 0;
  for (const RequestRecord& r : log) expect_equal(r, make(seen), seen), ++seen;
  EXPECT_EQ(seen, n);
  // a range that starts inside the spilled part and ends in the tail
  std::size_t from = n / 3, k = from;
  log.for_each(from, n - 1, [&](std::size_t i, const RequestRecord&) { EXPECT_EQ(i, k++); });
  EXPECT_EQ(k, n - 1);
}

// Pushes n records, spilling as a loop would: after each push, what finished `lag_ms` ago.
void fill(RequestLog& log, std::size_t n, std::int64_t lag_ms = 2) {
  for (std::size_t i = 0; i < n; ++i) {
    log.push_back(make(i));
    log.spill_finished(static_cast<ns_t>(i) * 1'000'000 - lag_ms * 1'000'000);
  }
}

}  // namespace

TEST(RequestLog, SpilledRecordsReadBackExactly) {
  RequestLog log;
  log.configure_spill(100);
  fill(log, 5000);
  EXPECT_GT(log.spilled(), 4500u);
  EXPECT_EQ(log.note(), "");
  expect_all(log, 5000);
}

TEST(RequestLog, NothingSpillsBelowTheThresholdOrWhenOff) {
  RequestLog below, off;
  below.configure_spill(5000);
  off.configure_spill(0);
  fill(below, 4000);
  fill(off, 6000);
  EXPECT_EQ(below.spilled(), 0u);
  EXPECT_EQ(off.spilled(), 0u);
  expect_all(below, 4000);
  expect_all(off, 6000);
}

TEST(RequestLog, RecordsInFlightOrJustFinishedStayInMemoryAndWritable) {
  RequestLog log;
  log.configure_spill(16);
  for (std::size_t i = 0; i < 64; ++i) log.push_back(make(i));
  log[20].outcome = Outcome::kPending;  // still in flight
  log[20].done_ns = kNever;
  log.spill_finished(50 * 1'000'000);  // 0..49 finished before this
  EXPECT_EQ(log.spilled(), 20u);       // the prefix ends at the one in flight
  log[20].first_token_ns = 123;        // writable: in memory
  log[20].outcome = Outcome::kOk;
  log[20].done_ns = 20 * 1'000'000;
  EXPECT_THROW(log[19].slot = 1, std::logic_error);  // a spilled record cannot change
  EXPECT_EQ(std::as_const(log)[19].slot, make(19).slot);
  // the next try waits for threshold / 4 more records
  log.spill_finished(50 * 1'000'000);
  EXPECT_EQ(log.spilled(), 20u);
  for (std::size_t i = 64; i < 68; ++i) log.push_back(make(i));
  log.spill_finished(50 * 1'000'000);
  EXPECT_EQ(log.spilled(), 50u);  // finished before the time given, and no further
  EXPECT_EQ(std::as_const(log)[20].first_token_ns, 123);
  EXPECT_EQ(log.size(), 68u);
}

TEST(RequestLog, MemoryStaysBoundedWhateverTheNumberOfRequests) {
  RequestLog log;
  const std::size_t threshold = 512;
  log.configure_spill(threshold);
  std::size_t peak = 0;
  for (std::size_t i = 0; i < 100 * threshold; ++i) {
    log.push_back(make(i));
    log.spill_finished(static_cast<ns_t>(i) * 1'000'000 - 2'000'000'000);  // a 2 s lag
    peak = std::max(peak, log.memory_bytes());
  }
  EXPECT_GT(log.spilled(), 100 * threshold - 2000 - threshold);  // all but the lag and a tail
  // the tail: the threshold, plus what finished within the lag (2,000 records here)
  EXPECT_LE(peak, (threshold * 2 + 4096) * sizeof(RequestRecord)) << peak;
  expect_all(log, 100 * threshold);
}

TEST(RequestLog, MovesKeepEveryRecord) {
  RequestLog a;
  a.configure_spill(64);
  fill(a, 1000);
  RequestLog b(std::move(a));
  EXPECT_EQ(a.size(), 0u);
  expect_all(b, 1000);
  RequestLog c;
  c = std::move(b);
  expect_all(c, 1000);
}

TEST(RequestLog, ASpillDirectoryThatCannotBeUsedKeepsTheRecordsInMemory) {
  RequestLog log;
  log.configure_spill(100, "/nonexistent/speedmatrix-spill");
  fill(log, 3000);
  EXPECT_EQ(log.spilled(), 0u);
  EXPECT_NE(log.note().find("request records kept in memory"), std::string::npos) << log.note();
  EXPECT_NE(log.note().find("/nonexistent/speedmatrix-spill"), std::string::npos) << log.note();
  expect_all(log, 3000);
}

TEST(RequestLog, ASpillFileThatFillsUpKeepsWhatWasWrittenAndTheRestInMemory) {
  // A file size limit makes a write fail part-way (EFBIG), as a full disk does (ENOSPC).
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64 * 1024;  // 682 rows of 96 bytes
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  RequestLog log;
  log.configure_spill(200);
  fill(log, 3000);
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_GT(log.spilled(), 0u);
  EXPECT_LE(log.spilled() * sizeof(RequestLog::Row), 64u * 1024);
  EXPECT_NE(log.note().find("writing the spill file"), std::string::npos) << log.note();
  expect_all(log, 3000);
}
