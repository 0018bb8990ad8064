// The libcurl engine against an in-test loopback server: token timing, every
// error kind it can produce on 127.0.0.1, cancellation, uploads, reuse.
#include <gtest/gtest.h>

#include <thread>

#include "loopback_server.hpp"
#include "speedmatrix/cell.hpp"
#include "speedmatrix/http.hpp"

namespace speedmatrix {
namespace {

using testing::LoopbackServer;
using testing::RouteLog;

constexpr ns_t kMs = 1'000'000;

struct Engine {
  CellRecords records;
  std::unique_ptr<CurlTransport> transport;
  std::vector<std::int32_t> finished;

  explicit Engine(HttpOptions o) {
    transport = std::make_unique<CurlTransport>(std::move(o), records);
  }

  std::int32_t add(std::string_view body) {
    RequestRecord r;
    r.scheduled_ns = now_ns();
    records.requests.push_back(r);
    const auto id = static_cast<std::int32_t>(records.requests.size() - 1);
    transport->start(id, body);
    return id;
  }
  // Polls until `count` requests finished or `timeout` passed.
  void wait_finished(std::size_t count, ns_t timeout = 5'000 * kMs) {
    const ns_t until = now_ns() + timeout;
    while (finished.size() < count && now_ns() < until) transport->poll(until, finished);
  }
  const RequestRecord& rec(std::int32_t id) const {
    return records.requests[static_cast<std::size_t>(id)];
  }
};

struct HttpTest : ::testing::Test {
  RouteLog log;
  LoopbackServer server{testing::openai_routes(log)};

  HttpOptions options(const std::string& path) {
    HttpOptions o;
    o.url = server.url(path);
    o.server_stamps = true;
    o.idle_timeout_s = 2;
    return o;
  }
  // Runs one request to `path`; returns its record.
  RequestRecord one(const std::string& path, HttpOptions o) {
    Engine e(std::move(o));
    const auto id = e.add(R"({"prompt":"hi","stream":true})");
    e.wait_finished(1);
    EXPECT_EQ(e.finished.size(), 1u) << path;
    return e.rec(id);
  }
  RequestRecord one(const std::string& path) { return one(path, options(path)); }
  // Streams one request on `e` to the end; it must finish OK.
  const RequestRecord& stream_ok(Engine& e) {
    const auto id = e.add(R"({"prompt":"hi","stream":true})");
    e.wait_finished(1);
    EXPECT_EQ(e.finished.size(), 1u);
    const RequestRecord& r = e.rec(id);
    EXPECT_EQ(r.outcome, Outcome::kOk) << r.error_kind << ": " << r.error_message;
    return r;
  }
};

TEST_F(HttpTest, StreamsTokensStampedAtTheirArrival) {
  Engine e(options("/sse?n=6&itl_ms=30&ttft_ms=20"));
  const auto id = e.add(R"({"prompt":"hi","stream":true})");
  e.wait_finished(1);
  ASSERT_EQ(e.finished.size(), 1u);
  const RequestRecord& r = e.rec(id);
  EXPECT_EQ(r.outcome, Outcome::kOk) << r.error_kind << ": " << r.error_message;
  EXPECT_EQ(r.http_status, 200);
  EXPECT_EQ(r.output_tokens, 6);
  EXPECT_EQ(r.prompt_tokens, 7);
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.token_source, TokenSource::kUsageFinal);

  const EventColumns& ev = e.records.events;
  ASSERT_EQ(ev.size(), 6u);
  std::vector<ns_t> sent;
  {
    std::lock_guard<std::mutex> lock(log.mu);
    sent = log.sent_ns;
  }
  ASSERT_EQ(sent.size(), 6u);
  for (std::size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev.request(i), id);
    EXPECT_EQ(ev.tokens(i), 1);
    EXPECT_EQ(ev.server_ns(i), sent[i]);  // the engine's stamp is passed through
    const ns_t delay = ev.t_ns(i) - sent[i];
    EXPECT_GE(delay, 0);
    EXPECT_LT(delay, 30 * kMs) << "event "
                               << i;  // loopback: well under a ms unless the box is busy
    if (i) {
      // The engine paced its events (its own stamps); each client stamp follows its event
      // (the delay bound above), so the client's gaps are the engine's to within that bound:
      // a busy box may shorten one gap by delaying the event before it, never merge two.
      const ns_t sent_gap = sent[i] - sent[i - 1];
      EXPECT_GE(sent_gap, 30 * kMs);
      const ns_t gap = ev.t_ns(i) - ev.t_ns(i - 1);
      EXPECT_GT(gap, 0);
      EXPECT_LT(gap > sent_gap ? gap - sent_gap : sent_gap - gap, 30 * kMs) << "event " << i;
    }
  }
  EXPECT_LE(r.sent_ns, r.first_byte_ns);
  EXPECT_LE(r.first_byte_ns, r.first_token_ns);
  EXPECT_EQ(r.first_token_ns, ev.t_ns(0));
  EXPECT_GE(r.first_token_ns - r.sent_ns, 20 * kMs);  // ttft_ms
  EXPECT_GE(r.done_ns, ev.t_ns(5));
}

TEST_F(HttpTest, StampsAreDroppedUnlessAsked) {
  HttpOptions o = options("/sse?n=2&itl_ms=1");
  o.server_stamps = false;
  Engine e(o);
  e.add("{}");
  e.wait_finished(1);
  ASSERT_EQ(e.records.events.size(), 2u);
  EXPECT_EQ(e.records.events.server_ns(0), kNever);
}

TEST_F(HttpTest, EventsOfOneSocketReadShareOneStamp) {
  // Four tokens, each its own HTTP chunk, leave the server in one write: they
  // arrive in one read and must carry that read's time, not four clock reads
  // taken as each chunk is parsed (which would make three ~0 gaps).
  Engine e(options("/burst?n=4"));
  const RequestRecord& r = stream_ok(e);
  EXPECT_EQ(r.output_tokens, 4);
  const EventColumns& ev = e.records.events;
  ASSERT_EQ(ev.size(), 4u);
  for (std::size_t i = 1; i < ev.size(); ++i) EXPECT_EQ(ev.t_ns(i), ev.t_ns(0)) << "event " << i;
  EXPECT_EQ(r.first_token_ns, ev.t_ns(0));
}

TEST_F(HttpTest, StreamWithoutChunkedEncodingEndsAtClose) {
  Engine e(options("/unchunked?n=3&itl_ms=5"));
  EXPECT_EQ(stream_ok(e).output_tokens, 3);
  ASSERT_EQ(e.records.events.size(), 3u);
  EXPECT_GT(e.records.events.t_ns(2), e.records.events.t_ns(0));
}

TEST_F(HttpTest, MalformedChunkFramingIsItsOwnKind) {
  const RequestRecord r = one("/badchunk");
  EXPECT_EQ(r.outcome, Outcome::kError);
  EXPECT_EQ(r.error_kind, "bad_chunking");
  EXPECT_NE(r.error_message.find("not hexadecimal"), std::string::npos) << r.error_message;
}

TEST_F(HttpTest, RefusedConnection) {
  HttpOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(testing::refused_port()) + "/v1/completions";
  const RequestRecord r = one("refused", o);
  EXPECT_EQ(r.outcome, Outcome::kError);
  EXPECT_EQ(r.error_kind, "connect");
  EXPECT_FALSE(r.error_message.empty());
  EXPECT_EQ(r.first_byte_ns, kNever);
  EXPECT_NE(r.done_ns, kNever);
}

TEST_F(HttpTest, HttpErrorCarriesTheServersMessage) {
  const RequestRecord r = one("/500");
  EXPECT_EQ(r.outcome, Outcome::kError);
  EXPECT_EQ(r.error_kind, "http_500");
  EXPECT_EQ(r.http_status, 500);
  EXPECT_NE(r.error_message.find("engine overloaded"), std::string::npos) << r.error_message;
}

TEST_F(HttpTest, TooManyRequestsKeepsItsRetryAfter) {
  Engine e(options("/429?ra=2"));
  const auto told = e.add("{}");
  e.wait_finished(1);
  ASSERT_EQ(e.finished.size(), 1u);
  EXPECT_EQ(e.rec(told).error_kind, "http_429");
  EXPECT_EQ(e.records.retry_after(told), 2'000 * kMs);
  EXPECT_NE(e.rec(told).error_message.find("(Retry-After 2000 ms)"), std::string::npos)
      << e.rec(told).error_message;
  // Without the header: nothing recorded (and nothing left over from the answer before).
  Engine bare(options("/429"));
  const auto plain = bare.add("{}");
  bare.wait_finished(1);
  EXPECT_EQ(bare.rec(plain).error_kind, "http_429");
  EXPECT_EQ(bare.records.retry_after(plain), kNever);
  EXPECT_EQ(one("/503?ra=Thu,+01+Jan+1970+00:00:00+GMT").error_kind, "http_503");
}

TEST(RetryAfter, DeltaSecondsOrAnHttpDate) {
  const ns_t s = 1'000 * kMs;
  const std::int64_t date_s = 1445412480;  // Wed, 21 Oct 2015 07:28:00 GMT
  struct Case {
    const char* value;
    std::int64_t now_s;
    ns_t want;
  } cases[] = {
      {"1", 0, 1 * s},
      {" 120\r\n", 0, 120 * s},
      {"0", 0, 0},
      {"99999999999999999999999", 0, 365LL * 24 * 3600 * s},  // capped, no overflow
      {"Wed, 21 Oct 2015 07:28:00 GMT", date_s - 30, 30 * s},
      {"Wed, 21 Oct 2015 07:28:00 GMT", date_s + 30, 0},  // already past
      {"", 0, kNever},
      {"soon", 0, kNever},
      {"-5", 0, kNever},
      {"1.5", 0, kNever},
  };
  for (const Case& c : cases) EXPECT_EQ(parse_retry_after(c.value, c.now_s), c.want) << c.value;
}

TEST_F(HttpTest, UnknownRouteIs404) { EXPECT_EQ(one("/nope").error_kind, "http_404"); }

TEST_F(HttpTest, JsonAnswerIsNotSse) {
  const RequestRecord r = one("/json");
  EXPECT_EQ(r.error_kind, "not_sse");
  EXPECT_EQ(r.http_status, 200);
}

TEST_F(HttpTest, MalformedEvent) {
  const RequestRecord r = one("/malformed");
  EXPECT_EQ(r.error_kind, "malformed_event");
  EXPECT_EQ(r.output_tokens, 1);  // the good event before it still counts
}

TEST_F(HttpTest, StreamWithoutDoneIsIncomplete) {
  const RequestRecord r = one("/nodone");
  EXPECT_EQ(r.error_kind, "incomplete_stream");
  EXPECT_EQ(r.output_tokens, 2);
}

TEST_F(HttpTest, ResetMidStream) {
  const RequestRecord r = one("/reset");
  EXPECT_EQ(r.error_kind, "connection_reset") << r.error_message;
  EXPECT_NE(r.first_token_ns, kNever);
}

TEST_F(HttpTest, ErrorEventInsideTheStream) {
  const RequestRecord r = one("/error_event");
  EXPECT_EQ(r.error_kind, "stream_error");
  EXPECT_NE(r.error_message.find("out of KV cache"), std::string::npos) << r.error_message;
}

TEST_F(HttpTest, EventOverTheLimit) {
  HttpOptions o = options("/big?n=5000");
  o.max_event_bytes = 1000;
  EXPECT_EQ(one("/big", o).error_kind, "event_too_large");
  o.max_event_bytes = 100'000;
  EXPECT_EQ(one("/big", o).outcome, Outcome::kOk);
}

TEST_F(HttpTest, SilenceLongerThanTheIdleTimeoutIsAStall) {
  HttpOptions o = options("/stall");
  o.idle_timeout_s = 0.2;
  const RequestRecord r = one("/stall", o);
  EXPECT_EQ(r.error_kind, "stall");
  const ns_t since_token = r.done_ns - r.first_token_ns;
  EXPECT_GE(since_token, 200 * kMs);
  EXPECT_LT(since_token, 600 * kMs);
  // The stalled connection was closed: the server's handler sees it go.
  for (int i = 0; i < 100 && log.disconnects.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(log.disconnects.load(), 1);
}

TEST_F(HttpTest, CancelClosesTheConnection) {
  Engine e(options("/sse?n=1000&itl_ms=10"));
  const auto id = e.add("{}");
  e.transport->poll(now_ns() + 100 * kMs, e.finished);
  EXPECT_TRUE(e.finished.empty());
  const ns_t before = now_ns();
  e.transport->cancel(id);
  const RequestRecord& r = e.rec(id);
  EXPECT_EQ(r.outcome, Outcome::kCancelled);
  EXPECT_GE(r.done_ns, before);
  EXPECT_GT(r.output_tokens, 3);
  EXPECT_TRUE(r.error_kind.empty());
  for (int i = 0; i < 100 && log.disconnects.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(log.disconnects.load(), 1);
}

TEST_F(HttpTest, LargeBodyIsUploadedWhole) {
  std::string body = R"({"prompt":")" + std::string(4u << 20, 'a') + R"("})";
  const ns_t t = now_ns();
  Engine e(options("/upload"));
  const auto id = e.add(body);
  e.wait_finished(1);
  EXPECT_EQ(e.rec(id).outcome, Outcome::kOk) << e.rec(id).error_message;
  EXPECT_LT(now_ns() - t, 2'000 * kMs);  // no 100-continue wait
  std::lock_guard<std::mutex> lock(server.last_mu);
  EXPECT_EQ(server.last.body.size(), body.size());
  EXPECT_EQ(server.last.body, body);
}

TEST_F(HttpTest, BearerTokenAndHeadersAreSentButNeverReported) {
  HttpOptions o = options("/500");
  o.api_key = "sk-secret-123";
  o.headers = {"X-Trace: abc"};
  const RequestRecord r = one("/500", o);
  {
    std::lock_guard<std::mutex> lock(server.last_mu);
    EXPECT_EQ(server.last.headers["authorization"], "Bearer sk-secret-123");
    EXPECT_EQ(server.last.headers["x-trace"], "abc");
    EXPECT_EQ(server.last.headers["content-type"], "application/json");
    EXPECT_EQ(server.last.headers.count("expect"), 0u);
  }
  EXPECT_EQ(r.error_message.find("sk-secret"), std::string::npos);
}

TEST_F(HttpTest, SequentialRequestsReuseOneConnection) {
  Engine e(options("/sse?n=2&itl_ms=1"));
  for (int i = 0; i < 20; ++i) {
    const auto id = e.add("{}");
    e.wait_finished(static_cast<std::size_t>(i + 1));
    ASSERT_EQ(e.rec(id).outcome, Outcome::kOk);
  }
  EXPECT_EQ(server.connections.load(), 1);
  EXPECT_EQ(e.transport->connections_opened(), 1);
  for (const auto& r : e.records.requests) EXPECT_EQ(r.retries, 0);
}

// llama.cpp's server (cpp-httplib) gives up a kept-alive connection after its
// keep-alive timeout; a request that crosses that moment is read and the
// connection closed without an answer. Each such request must succeed on a new
// connection, however many times it happens to one transfer slot, and be
// counted as retried, never as a server failure.
TEST_F(HttpTest, RequestsDroppedOnReusedConnectionsAreRetriedOnFreshOnes) {
  server.drop_reused = true;
  Engine e(options("/sse?n=2&itl_ms=1"));
  constexpr int kRequests = 12;
  for (int i = 0; i < kRequests; ++i) {
    const auto id = e.add("{}");
    e.wait_finished(static_cast<std::size_t>(i + 1));
    const RequestRecord& r = e.rec(id);
    ASSERT_EQ(r.outcome, Outcome::kOk)
        << "request " << i << ": " << r.error_kind << ": " << r.error_message;
    EXPECT_EQ(r.output_tokens, 2);
    EXPECT_EQ(r.retries, i == 0 ? 0 : 1) << "request " << i;
  }
  // Every request after the first met a dropped connection once.
  EXPECT_EQ(server.dropped.load(), kRequests - 1);
  EXPECT_EQ(server.connections.load(), kRequests);
}

TEST_F(HttpTest, HundredsOfConcurrentStreamsEachGetAConnection) {
  HttpOptions o = options("/sse?n=5&itl_ms=20");
  o.max_concurrency = 300;
  Engine e(o);
  for (int i = 0; i < 300; ++i) e.add("{}");
  e.wait_finished(300);
  ASSERT_EQ(e.finished.size(), 300u);
  for (const auto& r : e.records.requests)
    ASSERT_EQ(r.outcome, Outcome::kOk) << r.error_kind << " " << r.error_message;
  EXPECT_EQ(server.connections.load(), 300);
  EXPECT_EQ(e.records.events.size(), 1500u);
  // A second round reuses all of them.
  for (int i = 0; i < 300; ++i) e.add("{}");
  e.wait_finished(600);
  EXPECT_EQ(server.connections.load(), 300);
}

TEST(HttpUrl, RejectsWhatCannotWork) {
  EXPECT_EQ(check_url("http://127.0.0.1:1/v1/completions"), "");
  EXPECT_NE(check_url("ftp://127.0.0.1/x"), "");
  EXPECT_NE(check_url("not a url"), "");
  CellRecords r;
  HttpOptions o;
  o.url = "gopher://x";
  EXPECT_THROW(CurlTransport(o, r), std::invalid_argument);
}

TEST_F(HttpTest, GetterReadsMetricsAndReportsFailures) {
  HttpGetter g({}, "", 1.0);
  std::string body, err;
  ASSERT_TRUE(g.get(server.url("/metrics"), &body, &err)) << err;
  EXPECT_NE(body.find("sglang:num_running_reqs"), std::string::npos);
  EXPECT_FALSE(g.get(server.url("/nope"), &body, &err));
  EXPECT_EQ(err, "HTTP 404");
  EXPECT_FALSE(g.get("http://127.0.0.1:" + std::to_string(testing::refused_port()) + "/metrics",
                     &body, &err));
}

}  // namespace
}  // namespace speedmatrix
