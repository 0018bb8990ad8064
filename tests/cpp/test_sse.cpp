// SSE parser: recorded streams of every server family replayed whole, split at
// every byte position, byte by byte and in random pieces, with LF, CRLF and CR
// line ends, must give identical events; plus table-driven edge cases.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "speedmatrix/sse.hpp"
#include "stream_fixtures.hpp"

namespace speedmatrix {
namespace {

using testing::CollectingSink;
using testing::OwnedEvent;
using testing::read_stream_file;
using testing::with_line_ends;

struct StreamCase {
  const char* file;
  std::size_t events;
  std::size_t comments;
};

const StreamCase kStreams[] = {
    {"sglang_completions.sse", 10, 0},
    {"sglang_chat_reasoning.sse", 12, 0},
    {"sglang_error_flat.sse", 2, 0},
    {"vllm_chat_continuous_usage.sse", 9, 0},
    {"vllm_completions_no_usage.sse", 6, 0},
    {"vllm_error_event.sse", 4, 0},
    {"llamacpp_chat_timings.sse", 8, 0},
    {"tgi_chat.sse", 6, 0},
    {"tgi_error_event.sse", 2, 0},
    {"trtllm_completions_crlf.sse", 6, 0},
    {"trtllm_chat_reasoning.sse", 5, 0},
    {"lmdeploy_chat.sse", 8, 0},
    {"ollama_chat.sse", 7, 0},
    {"sim_stamped_cr.sse", 5, 2},
    {"synthetic_fields.sse", 4, 0},
};

struct Parsed {
  std::vector<OwnedEvent> events;
  std::size_t comments = 0;
  bool partial = false;
  bool ok = true;
};

// Feeds `s` cut at the given ascending positions.
Parsed parse_pieces(const std::string& s, const std::vector<std::size_t>& cuts) {
  SseParser parser;
  CollectingSink sink;
  Parsed out;
  std::size_t prev = 0;
  auto feed_to = [&](std::size_t end) {
    if (parser.feed(s.data() + prev, end - prev, sink) != SseStatus::kOk) out.ok = false;
    prev = end;
  };
  for (std::size_t c : cuts) feed_to(c);
  feed_to(s.size());
  out.events = std::move(sink.events);
  out.comments = parser.comments();
  out.partial = parser.has_partial();
  EXPECT_EQ(parser.events(), out.events.size());
  return out;
}

class RecordedStream : public ::testing::TestWithParam<StreamCase> {};

TEST_P(RecordedStream, WholeFeedGivesExpectedEvents) {
  const StreamCase& c = GetParam();
  const std::string s = read_stream_file(c.file);
  ASSERT_FALSE(s.empty()) << c.file;
  Parsed whole = parse_pieces(s, {});
  EXPECT_TRUE(whole.ok);
  EXPECT_EQ(whole.events.size(), c.events);
  EXPECT_EQ(whole.comments, c.comments);
  EXPECT_FALSE(whole.partial);
  for (const OwnedEvent& e : whole.events) {
    EXPECT_EQ(e.data.find('\r'), std::string::npos) << "line end leaked into data";
  }
  // Every recorded stream of a real server ends with [DONE] or an error event.
  if (std::string(c.file) != "synthetic_fields.sse" && whole.events.back().data != "[DONE]") {
    EXPECT_NE(whole.events.back().data.find("error"), std::string::npos) << c.file;
  }
}

TEST_P(RecordedStream, EverySplitAndLineEndGivesIdenticalEvents) {
  const StreamCase& c = GetParam();
  const std::string raw = read_stream_file(c.file);
  ASSERT_FALSE(raw.empty());
  const Parsed ref = parse_pieces(raw, {});
  for (const char* eol : {"\n", "\r\n", "\r"}) {
    const std::string s = with_line_ends(raw, eol);
    const Parsed whole = parse_pieces(s, {});
    ASSERT_EQ(whole.events, ref.events) << "eol variant of " << c.file;
    for (std::size_t i = 0; i <= s.size(); ++i) {
      const Parsed split = parse_pieces(s, {i});
      ASSERT_EQ(split.events, ref.events) << c.file << " split at " << i;
      ASSERT_EQ(split.comments, ref.comments) << c.file << " split at " << i;
      ASSERT_FALSE(split.partial);
    }
    std::vector<std::size_t> every;
    for (std::size_t i = 1; i < s.size(); ++i) every.push_back(i);
    const Parsed bytewise = parse_pieces(s, every);
    ASSERT_EQ(bytewise.events, ref.events) << c.file << " byte by byte";
    ASSERT_EQ(bytewise.comments, ref.comments);
    std::mt19937 rng(12345);
    for (int round = 0; round < 200; ++round) {
      std::vector<std::size_t> cuts;
      std::uniform_int_distribution<std::size_t> pos(0, s.size());
      for (int k = 0; k < 4; ++k) cuts.push_back(pos(rng));
      std::sort(cuts.begin(), cuts.end());
      ASSERT_EQ(parse_pieces(s, cuts).events, ref.events) << c.file << " random cuts";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Streams, RecordedStream, ::testing::ValuesIn(kStreams),
                         [](const ::testing::TestParamInfo<StreamCase>& info) {
                           std::string n = info.param.file;
                           n = n.substr(0, n.find('.'));
                           return n;
                         });

// --- table-driven edge cases: input pieces -> expected events ---
struct EdgeCase {
  const char* name;
  std::vector<std::string> pieces;
  std::vector<OwnedEvent> expected;
  bool partial_at_end;
};

class SseEdge : public ::testing::TestWithParam<EdgeCase> {};

TEST_P(SseEdge, ProducesExpectedEvents) {
  const EdgeCase& c = GetParam();
  SseParser parser;
  CollectingSink sink;
  for (const std::string& p : c.pieces) ASSERT_EQ(parser.feed(p, sink), SseStatus::kOk);
  EXPECT_EQ(sink.events, c.expected);
  EXPECT_EQ(parser.has_partial(), c.partial_at_end);
}

const EdgeCase kEdges[] = {
    {"simple", {"data: x\n\n"}, {{"", "x", ""}}, false},
    {"cr_then_lf_across_feeds_is_one_line_end",
     {"data: a\r", "\ndata: b\n\n"},
     {{"", "a\nb", ""}},
     false},
    {"cr_then_cr_is_two_line_ends", {"data: a\r", "\r"}, {{"", "a", ""}}, false},
    {"cr_at_end_then_data", {"data: a\r", "data: b\r\r"}, {{"", "a\nb", ""}}, false},
    {"crlf_split_inside_blank_line", {"data: a\r\n\r", "\n"}, {{"", "a", ""}}, false},
    {"mixed_line_ends", {"data: a\r\ndata: b\rdata: c\n\n"}, {{"", "a\nb\nc", ""}}, false},
    {"multi_line_data_joined", {"data: {\"a\":\ndata: 1}\n\n"}, {{"", "{\"a\":\n1}", ""}}, false},
    {"only_one_leading_space_dropped", {"data:  x \n\n"}, {{"", " x ", ""}}, false},
    {"no_space_after_colon", {"data:x\n\n"}, {{"", "x", ""}}, false},
    {"field_without_colon_is_empty_data", {"data\n\n"}, {{"", "", ""}}, false},
    {"empty_data_line", {"data:\n\n"}, {{"", "", ""}}, false},
    {"two_empty_data_lines", {"data:\ndata:\n\n"}, {{"", "\n", ""}}, false},
    {"comment_only", {": ping\n\n"}, {}, false},
    {"comment_between_data_lines", {"data: a\n: c\ndata: b\n\n"}, {{"", "a\nb", ""}}, false},
    {"event_and_id", {"event: delta\nid: 7\ndata: x\n\n"}, {{"delta", "x", "7"}}, false},
    {"event_type_resets_id_persists",
     {"event: e\nid: 7\ndata: x\n\ndata: y\n\n"},
     {{"e", "x", "7"}, {"", "y", "7"}},
     false},
    {"event_without_data_dropped_and_type_reset",
     {"event: e\n\ndata: y\n\n"},
     {{"", "y", ""}},
     false},
    {"unknown_field_and_retry_ignored",
     {"retry: 5\nfoo: bar\ndata: x\n\n"},
     {{"", "x", ""}},
     false},
    {"field_name_is_case_sensitive", {"Data: x\ndata: y\n\n"}, {{"", "y", ""}}, false},
    {"extra_blank_lines", {"\n\n\ndata: x\n\n\n\n"}, {{"", "x", ""}}, false},
    {"colon_in_value_kept", {"data: a:b: c\n\n"}, {{"", "a:b: c", ""}}, false},
    {"unfinished_event", {"data: x\n"}, {}, true},
    {"unfinished_line", {"data: x\n\nda"}, {{"", "x", ""}}, true},
    {"pending_event_field", {"event: e\n"}, {}, true},
    {"trailing_comment_is_not_partial", {"data: x\n\n: bye\n"}, {{"", "x", ""}}, false},
    {"trailing_cr_is_not_partial", {"data: x\n\r"}, {{"", "x", ""}}, false},
    {"nul_in_id_ignored",
     {std::string("id: 1\ndata: a\n\nid: 2\0x\ndata: b\n\n", 32)},
     {{"", "a", "1"}, {"", "b", "1"}},
     false},
};

INSTANTIATE_TEST_SUITE_P(Cases, SseEdge, ::testing::ValuesIn(kEdges),
                         [](const ::testing::TestParamInfo<EdgeCase>& info) {
                           return info.param.name;
                         });

TEST(SseParser, EventTooLargeIsStickyUntilReset) {
  SseParser parser(10);
  CollectingSink sink;
  EXPECT_EQ(parser.feed("data: 0123456789\n\n", sink),
            SseStatus::kOk);  // exactly the limit
  ASSERT_EQ(sink.events.size(), 1u);
  EXPECT_EQ(parser.feed("data: 01234\ndata: 56789\n", sink),
            SseStatus::kEventTooLarge);  // 5+1+5
  EXPECT_EQ(parser.feed("\ndata: ok\n\n", sink), SseStatus::kEventTooLarge);
  EXPECT_EQ(sink.events.size(), 1u);
  parser.reset();
  EXPECT_EQ(parser.feed("data: ok\n\n", sink), SseStatus::kOk);
  ASSERT_EQ(sink.events.size(), 2u);
  EXPECT_EQ(sink.events[1].data, "ok");
}

TEST(SseParser, UnterminatedHugeLineIsBoundedNotBuffered) {
  SseParser parser(1000);
  CollectingSink sink;
  const std::string chunk(512, 'x');
  SseStatus st = SseStatus::kOk;
  int feeds = 0;
  while (st == SseStatus::kOk && feeds < 100) {
    st = parser.feed(feeds == 0 ? "data: " + chunk : chunk, sink);
    ++feeds;
  }
  EXPECT_EQ(st, SseStatus::kEventTooLarge);
  EXPECT_LE(feeds, 4);
}

TEST(SseParser, SinkCanStopParsing) {
  struct StopAfterOne : SseSink {
    int n = 0;
    bool on_event(const SseEvent&) override { return ++n < 1; }
  } sink;
  SseParser parser;
  EXPECT_EQ(parser.feed("data: a\n\ndata: b\n\n", sink), SseStatus::kStopped);
  EXPECT_EQ(sink.n, 1);
  EXPECT_EQ(parser.events(), 1u);
}

TEST(SseParser, DataIsPaddedAndBufferReusedAcrossEvents) {
  struct Check : SseSink {
    const char* first = nullptr;
    int same = 0, n = 0;
    bool on_event(const SseEvent& ev) override {
      volatile char sum = 0;  // the padding must be readable (ASan would trap otherwise)
      for (std::size_t i = 0; i < kSsePadding; ++i) sum = sum + ev.data.data()[ev.data.size() + i];
      if (first == nullptr) first = ev.data.data();
      same += ev.data.data() == first;
      ++n;
      return true;
    }
  } sink;
  SseParser parser;
  std::string big = "data: " + std::string(4000, 'a') + "\n\n";  // grows the buffer once
  ASSERT_EQ(parser.feed(big, sink), SseStatus::kOk);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(parser.feed("data: {\"x\":1}\n\n", sink), SseStatus::kOk);
  EXPECT_EQ(sink.n, 51);
  EXPECT_EQ(sink.same, 51) << "data buffer was reallocated between events";
}

TEST(SseParser, ResetClearsPartialState) {
  SseParser parser;
  CollectingSink sink;
  parser.feed("data: half", sink);
  EXPECT_TRUE(parser.has_partial());
  parser.reset();
  EXPECT_FALSE(parser.has_partial());
  parser.feed("data: new\n\n", sink);
  ASSERT_EQ(sink.events.size(), 1u);
  EXPECT_EQ(sink.events[0].data, "new");
  EXPECT_EQ(parser.events(), 1u);
}

}  // namespace
}  // namespace speedmatrix
