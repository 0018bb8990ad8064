// OpenAI stream decoder: every recorded server stream decoded event by event
// against hand-written expectations (tokens per event, first token, usage,
// finish reason, errors), broken payloads, token-source transitions, and the
// non-stream error bodies of each server family.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "speedmatrix/openai.hpp"
#include "speedmatrix/sse.hpp"
#include "stream_fixtures.hpp"

namespace speedmatrix {
namespace {

using testing::read_stream_file;

// Decodes the events straight from the parser's buffer (the padded hot path).
struct DecodingSink : SseSink {
  explicit DecodingSink(ApiKind api) : dec(api) {}
  bool on_event(const SseEvent& ev) override {
    results.push_back(dec.decode(ev.data));
    return true;
  }
  OpenAIStreamDecoder dec;
  std::vector<ChunkResult> results;
};

constexpr int kDoneMark = -1;   // expected "tokens" entry for a [DONE] event
constexpr int kErrorMark = -2;  // ... for an error event

struct StreamExpect {
  const char* file;
  ApiKind api;
  std::vector<int> tokens;  // per event: tokens, or kDoneMark / kErrorMark
  int first_token_event;    // index of the event with first_token, -1 none
  std::int64_t output_tokens;
  std::int64_t prompt_tokens;
  TokenSource source;
  const char* finish_reason;
  const char* error_type;  // "" when no error event
  const char* error_contains;
  std::vector<std::int64_t> server_ns = {};  // per event when given
};

const StreamExpect kStreams[] = {
    {"sglang_completions.sse",
     ApiKind::kCompletions,
     {1, 1, 1, 1, 1, 1, 1, 0, 0, kDoneMark},
     0,
     7,
     12,
     TokenSource::kUsageFinal,
     "length",
     "",
     ""},
    {"sglang_chat_reasoning.sse",
     ApiKind::kChat,
     {0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, kDoneMark},
     1,
     12,
     9,
     TokenSource::kUsageFinal,
     "stop",
     "",
     ""},
    {"vllm_chat_continuous_usage.sse",
     ApiKind::kChat,
     {0, 1, 2, 1, 2, 3, 1, 0, kDoneMark},
     1,
     10,
     20,
     TokenSource::kUsageContinuous,
     "length",
     "",
     ""},
    {"vllm_completions_no_usage.sse",
     ApiKind::kCompletions,
     {1, 1, 1, 1, 1, kDoneMark},
     0,
     5,
     -1,
     TokenSource::kChunks,
     "length",
     "",
     ""},
    {"llamacpp_chat_timings.sse",
     ApiKind::kChat,
     {0, 1, 1, 1, 1, 1, 0, kDoneMark},
     1,
     6,
     15,
     TokenSource::kUsageFinal,
     "length",
     "",
     ""},
    {"tgi_chat.sse",
     ApiKind::kChat,
     {1, 1, 1, 1, 1, kDoneMark},
     0,
     5,
     10,
     TokenSource::kUsageFinal,
     "length",
     "",
     ""},
    {"trtllm_completions_crlf.sse",
     ApiKind::kCompletions,
     {1, 1, 1, 1, 0, kDoneMark},
     0,
     4,
     7,
     TokenSource::kUsageFinal,
     "length",
     "",
     ""},
    {"trtllm_chat_reasoning.sse",
     ApiKind::kChat,
     {0, 1, 1, 1, kDoneMark},
     1,
     3,
     -1,
     TokenSource::kChunks,
     "stop",
     "",
     ""},
    {"lmdeploy_chat.sse",
     ApiKind::kChat,
     {0, 1, 1, 1, 1, 0, 0, kDoneMark},
     1,
     5,
     30,
     TokenSource::kUsageFinal,
     "length",
     "",
     ""},
    {"ollama_chat.sse",
     ApiKind::kChat,
     {1, 1, 1, 1, 0, 0, kDoneMark},
     0,
     6,
     11,
     TokenSource::kUsageFinal,
     "stop",
     "",
     ""},
    {"vllm_error_event.sse",
     ApiKind::kCompletions,
     {1, 1, kErrorMark, kDoneMark},
     0,
     2,
     -1,
     TokenSource::kChunks,
     "",
     "BadRequestError",
     "maximum model length of 8192"},
    {"sglang_error_flat.sse",
     ApiKind::kCompletions,
     {1, kErrorMark},
     0,
     1,
     -1,
     TokenSource::kChunks,
     "",
     "InternalServerError",
     "KV cache pool is full"},
    {"tgi_error_event.sse",
     ApiKind::kChat,
     {1, kErrorMark},
     0,
     1,
     -1,
     TokenSource::kChunks,
     "",
     "generation",
     "CUDA out of memory"},
    {"sim_stamped_cr.sse",
     ApiKind::kCompletions,
     {1, 1, 1, 0, kDoneMark},
     0,
     4,
     4,
     TokenSource::kUsageFinal,
     "length",
     "",
     "",
     {1000000000, 1020000000, 1040000000, -1, -1}},
};

class DecodeStream : public ::testing::TestWithParam<StreamExpect> {};

TEST_P(DecodeStream, MatchesExpectations) {
  const StreamExpect& x = GetParam();
  const std::string s = read_stream_file(x.file);
  ASSERT_FALSE(s.empty()) << x.file;
  DecodingSink sink(x.api);
  SseParser parser;
  ASSERT_EQ(parser.feed(s, sink), SseStatus::kOk);
  ASSERT_EQ(sink.results.size(), x.tokens.size());
  int first = -1, firsts = 0;
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < x.tokens.size(); ++i) {
    const ChunkResult& r = sink.results[i];
    SCOPED_TRACE("event " + std::to_string(i));
    if (x.tokens[i] == kDoneMark) {
      EXPECT_EQ(r.kind, ChunkKind::kDone);
    } else if (x.tokens[i] == kErrorMark) {
      EXPECT_EQ(r.kind, ChunkKind::kError);
      EXPECT_EQ(r.tokens, 0);
    } else {
      EXPECT_EQ(r.kind, ChunkKind::kData);
      EXPECT_EQ(r.tokens, x.tokens[i]);
    }
    if (r.first_token) {
      first = static_cast<int>(i);
      ++firsts;
      EXPECT_TRUE(r.has_text);
    }
    if (!x.server_ns.empty())
      EXPECT_EQ(r.server_ns, x.server_ns[i]);
    else
      EXPECT_EQ(r.server_ns, -1);
    sum += r.tokens;
  }
  const StreamSummary& sm = sink.dec.summary();
  EXPECT_EQ(first, x.first_token_event);
  EXPECT_LE(firsts, 1);
  EXPECT_EQ(sm.chunk_tokens, sum);
  EXPECT_EQ(sm.output_tokens, x.output_tokens);
  EXPECT_EQ(sm.prompt_tokens, x.prompt_tokens);
  EXPECT_EQ(sm.source, x.source);
  EXPECT_EQ(sm.finish_reason, x.finish_reason);
  EXPECT_EQ(sm.error_type, x.error_type);
  EXPECT_NE(sm.error_message.find(x.error_contains), std::string::npos) << sm.error_message;
  EXPECT_EQ(sm.done, x.tokens.back() == kDoneMark);
  // The same stream through the copying entry point gives the same results.
  OpenAIStreamDecoder copy(x.api);
  struct CopySink : SseSink {
    OpenAIStreamDecoder* d;
    std::vector<std::int32_t> tokens;
    bool on_event(const SseEvent& ev) override {
      tokens.push_back(d->decode_copy(std::string(ev.data)).tokens);
      return true;
    }
  } cs;
  cs.d = &copy;
  SseParser p2;
  p2.feed(s, cs);
  EXPECT_EQ(copy.summary().output_tokens, sm.output_tokens);
  EXPECT_EQ(copy.summary().chunk_tokens, sm.chunk_tokens);
}

INSTANTIATE_TEST_SUITE_P(Families, DecodeStream, ::testing::ValuesIn(kStreams),
                         [](const ::testing::TestParamInfo<StreamExpect>& info) {
                           std::string n = info.param.file;
                           return n.substr(0, n.find('.'));
                         });

// --- single payloads, including broken ones ---
struct PayloadCase {
  const char* name;
  std::string data;
  ChunkKind kind;
  int tokens;
  bool has_text;
  bool finished;
};

const PayloadCase kPayloads[] = {
    {"empty", "", ChunkKind::kMalformed, 0, false, false},
    {"not_json", "hello world", ChunkKind::kMalformed, 0, false, false},
    {"open_brace", "{", ChunkKind::kMalformed, 0, false, false},
    {"truncated", R"({"choices":[{"text":"a"})", ChunkKind::kMalformed, 0, false, false},
    {"truncated_string", R"({"choices":[{"text":"a)", ChunkKind::kMalformed, 0, false, false},
    {"array_top", "[1,2]", ChunkKind::kMalformed, 0, false, false},
    {"string_top", R"("x")", ChunkKind::kMalformed, 0, false, false},
    {"choices_object", R"({"choices":{}})", ChunkKind::kMalformed, 0, false, false},
    {"choice_not_object", R"({"choices":[1]})", ChunkKind::kMalformed, 0, false, false},
    {"text_number", R"({"choices":[{"text":5}]})", ChunkKind::kMalformed, 0, false, false},
    {"content_array", R"({"choices":[{"delta":{"content":["x"]}}]})", ChunkKind::kMalformed, 0,
     false, false},
    {"delta_string", R"({"choices":[{"delta":"x"}]})", ChunkKind::kMalformed, 0, false, false},
    {"usage_string_count", R"({"choices":[],"usage":{"completion_tokens":"7"}})",
     ChunkKind::kMalformed, 0, false, false},
    {"finish_reason_number", R"({"choices":[{"text":"a","finish_reason":1}]})",
     ChunkKind::kMalformed, 0, false, false},
    {"trailing_junk", R"({"choices":[{"text":"a"}]} junk)", ChunkKind::kMalformed, 0, false, false},
    {"stamp_string", R"({"sm_t_ns":"x","choices":[]})", ChunkKind::kMalformed, 0, false, false},
    {"done_with_junk", "[DONE]x", ChunkKind::kMalformed, 0, false, false},
    {"done_spaces", " [DONE] ", ChunkKind::kDone, 0, false, false},
    {"empty_object", "{}", ChunkKind::kData, 0, false, false},
    {"empty_choices", R"({"choices":[]})", ChunkKind::kData, 0, false, false},
    {"escaped_text", R"({"choices":[{"text":"\"q\""}]})", ChunkKind::kData, 1, true, false},
    {"unicode_escape_text", R"({"choices":[{"text":"\u00e9"}]})", ChunkKind::kData, 1, true, false},
    {"whitespace_json", " {\n \"choices\" : [ { \"text\" : \"a\" } ] }\n", ChunkKind::kData, 1,
     true, false},
    {"only_first_choice_counts", R"({"choices":[{"text":""},{"text":"b"}]})", ChunkKind::kData, 0,
     false, false},
    {"null_error_is_no_error", R"({"error":null,"choices":[{"text":"a"}]})", ChunkKind::kData, 1,
     true, false},
    {"null_content_role_only", R"({"choices":[{"delta":{"role":"assistant","content":null}}]})",
     ChunkKind::kData, 0, false, false},
    {"reasoning_content", R"({"choices":[{"delta":{"reasoning_content":"r"}}]})", ChunkKind::kData,
     1, true, false},
    {"reasoning", R"({"choices":[{"delta":{"content":"","reasoning":"r"}}]})", ChunkKind::kData, 1,
     true, false},
    {"tool_call_arguments",
     R"({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]})",
     ChunkKind::kData, 1, true, false},
    {"empty_tool_calls", R"({"choices":[{"delta":{"tool_calls":[]}}]})", ChunkKind::kData, 0, false,
     false},
    {"finish_with_text", R"({"choices":[{"text":"a","finish_reason":"stop"}]})", ChunkKind::kData,
     1, true, true},
    {"finish_null", R"({"choices":[{"text":"a","finish_reason":null}]})", ChunkKind::kData, 1, true,
     false},
    {"error_object", R"({"error":{"message":"boom","code":500}})", ChunkKind::kError, 0, false,
     false},
    {"flat_error", R"({"object":"error","message":"m","type":"t","code":400})", ChunkKind::kError,
     0, false, false},
    {"error_string", R"({"error":"oops","error_type":"overloaded"})", ChunkKind::kError, 0, false,
     false},
};

class DecodePayload : public ::testing::TestWithParam<PayloadCase> {};

TEST_P(DecodePayload, Classifies) {
  const PayloadCase& c = GetParam();
  OpenAIStreamDecoder dec(ApiKind::kChat);
  const ChunkResult r = dec.decode_copy(c.data);
  EXPECT_EQ(r.kind, c.kind);
  EXPECT_EQ(r.tokens, c.tokens);
  EXPECT_EQ(r.has_text, c.has_text);
  EXPECT_EQ(r.first_token, c.has_text);
  EXPECT_EQ(r.finished, c.finished);
  if (c.kind == ChunkKind::kMalformed) {
    EXPECT_EQ(dec.summary().error_type, "malformed_event");
    EXPECT_FALSE(dec.summary().error_message.empty());
    EXPECT_EQ(dec.summary().error_message.find('\n'), std::string::npos);
  }
  if (c.kind == ChunkKind::kError) EXPECT_FALSE(dec.summary().error_message.empty());
}

INSTANTIATE_TEST_SUITE_P(Payloads, DecodePayload, ::testing::ValuesIn(kPayloads),
                         [](const ::testing::TestParamInfo<PayloadCase>& info) {
                           return info.param.name;
                         });

TEST(Decoder, ErrorTypeAndMessageOfEachShape) {
  struct Case {
    const char* data;
    const char* type;
    const char* message;
  } cases[] = {
      {R"({"error":{"message":"boom","code":500}})", "500", "boom"},
      {R"({"error":{"object":"error","message":"bad","type":"BadRequestError","code":400}})",
       "BadRequestError", "bad"},
      {R"({"object":"error","message":"m","type":"t","code":400})", "t", "m"},
      {R"({"error":"oops\nmore","error_type":"overloaded"})", "overloaded", "oops more"},
  };
  for (const Case& c : cases) {
    OpenAIStreamDecoder dec;
    EXPECT_EQ(dec.decode_copy(c.data).kind, ChunkKind::kError) << c.data;
    EXPECT_EQ(dec.summary().error_type, c.type) << c.data;
    EXPECT_EQ(dec.summary().error_message, c.message) << c.data;
  }
}

std::vector<int> decode_all(OpenAIStreamDecoder& dec, const std::vector<std::string>& payloads) {
  std::vector<int> tokens;
  for (const std::string& p : payloads) tokens.push_back(dec.decode_copy(p).tokens);
  return tokens;
}

TEST(Decoder, UsageAppearingMidStreamDoesNotDoubleCount) {
  OpenAIStreamDecoder dec(ApiKind::kCompletions);
  auto t = decode_all(dec, {R"({"choices":[{"text":"a"}]})", R"({"choices":[{"text":"b"}]})",
                            R"({"choices":[{"text":"cd"}],"usage":{"completion_tokens":4}})",
                            R"({"choices":[{"text":"e"}],"usage":{"completion_tokens":5}})"});
  EXPECT_EQ(t, (std::vector<int>{1, 1, 2, 1}));
  EXPECT_EQ(dec.summary().source, TokenSource::kUsageContinuous);
  EXPECT_EQ(dec.summary().output_tokens, 5);
}

TEST(Decoder, CumulativeUsageGoingBackwardsCannotUncountText) {
  // "b" and "c" each carried text, so each carried a token, whatever the usage said:
  // a usage (4) below what was received (3 + 1 + 1) is not believed.
  OpenAIStreamDecoder dec;
  auto t = decode_all(dec, {R"({"choices":[{"text":"a"}],"usage":{"completion_tokens":3}})",
                            R"({"choices":[{"text":"b"}],"usage":{"completion_tokens":2}})",
                            R"({"choices":[{"text":"c"}],"usage":{"completion_tokens":4}})"});
  EXPECT_EQ(t, (std::vector<int>{3, 1, 1}));
  EXPECT_EQ(dec.summary().output_tokens, 5);
  EXPECT_EQ(dec.summary().source, TokenSource::kUsageBelowChunks);
}

// A stream of `chunks` text chunks (one token of text each), then a final usage-only chunk.
OpenAIStreamDecoder stream_with_final_usage(int chunks, std::int64_t usage) {
  OpenAIStreamDecoder dec;
  for (int i = 0; i < chunks; ++i) dec.decode_copy(R"({"choices":[{"text":"x"}]})");
  dec.decode_copy(R"({"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":)" +
                  std::to_string(usage) + "}}");
  return dec;
}

struct UsageCase {
  int chunks;
  std::int64_t usage;
  TokenSource source;
  std::int64_t output_tokens;
};

class FinalUsageJudged : public ::testing::TestWithParam<UsageCase> {};

TEST_P(FinalUsageJudged, AgainstTheChunksThatCarriedText) {
  const UsageCase& c = GetParam();
  OpenAIStreamDecoder dec = stream_with_final_usage(c.chunks, c.usage);
  EXPECT_EQ(dec.summary().text_chunks, c.chunks);
  EXPECT_EQ(dec.summary().source, c.source);
  EXPECT_EQ(dec.summary().output_tokens, c.output_tokens);
  // the per-chunk counts are kept as streamed: one per text chunk
  EXPECT_EQ(dec.summary().chunk_tokens, c.chunks);
}

INSTANTIATE_TEST_SUITE_P(
    Usage, FinalUsageJudged,
    ::testing::Values(
        // the issue's server: usage 1 for 64 chunks cannot be right; 64 were received
        UsageCase{64, 1, TokenSource::kUsageBelowChunks, 64},
        UsageCase{64, 0, TokenSource::kUsageBelowChunks, 64},
        UsageCase{64, 63, TokenSource::kUsageBelowChunks, 64},
        UsageCase{64, 64, TokenSource::kUsageFinal, 64},
        // several tokens a chunk are possible: believed up to 2x, or a few tokens more
        UsageCase{64, 128, TokenSource::kUsageFinal, 128},
        UsageCase{64, 129, TokenSource::kUsageAboveChunks, 129},
        UsageCase{2, 10, TokenSource::kUsageFinal, 10},  // 8 above: a few tokens
        UsageCase{2, 11, TokenSource::kUsageAboveChunks, 11},
        UsageCase{0, 9, TokenSource::kUsageAboveChunks, 9}),
    [](const ::testing::TestParamInfo<UsageCase>& info) {
      return std::to_string(info.param.chunks) + "_chunks_usage_" +
             std::to_string(info.param.usage);
    });

TEST(Decoder, ContinuousUsageStuckBelowTheTextIsCountedAsReceived) {
  // cumulative usage that never moves past 1: every text chunk still carried a token
  OpenAIStreamDecoder dec;
  std::vector<std::string> payloads(
      10, R"({"choices":[{"text":"x"}],"usage":{"completion_tokens":1}})");
  payloads.emplace_back(R"({"choices":[],"usage":{"completion_tokens":1}})");
  auto t = decode_all(dec, payloads);
  EXPECT_EQ(t, (std::vector<int>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(dec.summary().output_tokens, 10);
  EXPECT_EQ(dec.summary().source, TokenSource::kUsageBelowChunks);
}

TEST(Decoder, ContinuousUsageOfSeveralTokensAChunkIsExactAndNotFlagged) {
  OpenAIStreamDecoder dec;
  auto t = decode_all(dec, {R"({"choices":[{"text":"ab"}],"usage":{"completion_tokens":4}})",
                            R"({"choices":[{"text":"cd"}],"usage":{"completion_tokens":8}})",
                            R"({"choices":[],"usage":{"completion_tokens":8}})"});
  EXPECT_EQ(t, (std::vector<int>{4, 4, 0}));
  EXPECT_EQ(dec.summary().output_tokens, 8);
  EXPECT_EQ(dec.summary().source, TokenSource::kUsageContinuous);
}

TEST(Decoder, ACutStreamIsNotJudgedBeforeItsUsage) {
  // a request the window's end cut: no usage yet, counted per chunk as before
  OpenAIStreamDecoder dec;
  decode_all(dec, {R"({"choices":[{"text":"x"}]})", R"({"choices":[{"text":"y"}]})"});
  EXPECT_EQ(dec.summary().source, TokenSource::kChunks);
  EXPECT_EQ(dec.summary().output_tokens, 2);
}

TEST(Decoder, FinalUsageTotalWinsOverChunkCount) {
  OpenAIStreamDecoder dec;
  auto t = decode_all(dec, {R"({"choices":[{"text":"a b c"}]})", R"({"choices":[{"text":"d e"}]})",
                            R"({"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":5}})"});
  EXPECT_EQ(t, (std::vector<int>{1, 1, 0}));
  EXPECT_EQ(dec.summary().chunk_tokens, 2);
  EXPECT_EQ(dec.summary().output_tokens, 5);
  EXPECT_EQ(dec.summary().prompt_tokens, 8);
  EXPECT_EQ(dec.summary().source, TokenSource::kUsageFinal);
}

TEST(Decoder, ZeroUsageWithoutTextLeavesSourceNone) {
  OpenAIStreamDecoder dec(ApiKind::kChat);
  decode_all(dec, {R"({"choices":[{"delta":{"role":"assistant"}}]})",
                   R"({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0}})"});
  EXPECT_EQ(dec.summary().source, TokenSource::kNone);
  EXPECT_EQ(dec.summary().output_tokens, 0);
}

TEST(Decoder, FirstTokenOnlyOnceAndNotForRoleChunk) {
  OpenAIStreamDecoder dec(ApiKind::kChat);
  EXPECT_FALSE(
      dec.decode_copy(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})").first_token);
  EXPECT_TRUE(dec.decode_copy(R"({"choices":[{"delta":{"content":"x"}}]})").first_token);
  EXPECT_FALSE(dec.decode_copy(R"({"choices":[{"delta":{"content":"y"}}]})").first_token);
}

TEST(Decoder, ReasoningIsKeptApartFromContent) {
  // SGLang's recorded reasoning stream: four reasoning deltas, then content.
  DecodingSink sink(ApiKind::kChat);
  SseParser parser;
  const std::string bytes = read_stream_file("sglang_chat_reasoning.sse");
  ASSERT_EQ(parser.feed(bytes.data(), bytes.size(), sink), SseStatus::kOk);
  ASSERT_GE(sink.results.size(), 6u);
  int first_token = -1, first_content = -1, reasoning = 0, content = 0;
  for (std::size_t i = 0; i < sink.results.size(); ++i) {
    const ChunkResult& r = sink.results[i];
    if (r.first_token) first_token = static_cast<int>(i);
    if (r.first_content) first_content = static_cast<int>(i);
    reasoning += r.has_reasoning;
    content += r.has_content;
    EXPECT_FALSE(r.has_reasoning && r.has_content) << i;
    EXPECT_EQ(r.has_text, r.has_reasoning || r.has_content) << i;
  }
  EXPECT_EQ(first_token, 1);
  EXPECT_EQ(first_content, 5);
  EXPECT_EQ(reasoning, 4);
  EXPECT_EQ(content, 4);
  EXPECT_EQ(sink.dec.summary().output_tokens, 12);     // reasoning counts as output
  EXPECT_EQ(sink.dec.summary().reasoning_tokens, -1);  // this server's usage does not say
  EXPECT_EQ(sink.dec.summary().cached_tokens, -1);
}

TEST(Decoder, FirstContentOnceForTextContentOrToolCallsNeverForReasoning) {
  OpenAIStreamDecoder chat(ApiKind::kChat);
  EXPECT_FALSE(chat.decode_copy(R"({"choices":[{"delta":{"reasoning":"hm"}}]})").first_content);
  EXPECT_FALSE(
      chat.decode_copy(R"({"choices":[{"delta":{"reasoning_content":"so"}}]})").first_content);
  EXPECT_TRUE(
      chat.decode_copy(R"({"choices":[{"delta":{"tool_calls":[{"index":0}]}}]})").first_content);
  EXPECT_FALSE(chat.decode_copy(R"({"choices":[{"delta":{"content":"x"}}]})").first_content);
  OpenAIStreamDecoder completions(ApiKind::kCompletions);
  const ChunkResult r = completions.decode_copy(R"({"choices":[{"text":"a"}]})");
  EXPECT_TRUE(r.first_token);
  EXPECT_TRUE(r.first_content);
  EXPECT_FALSE(r.has_reasoning);
  // a reset decoder finds its first content again
  chat.reset(ApiKind::kChat);
  EXPECT_TRUE(chat.decode_copy(R"({"choices":[{"delta":{"content":"x"}}]})").first_content);
}

TEST(Decoder, UsageDetailsGiveReasoningAndCachedTokens) {
  OpenAIStreamDecoder dec(ApiKind::kChat);
  decode_all(
      dec,
      {R"({"choices":[{"delta":{"content":"a"}}],"usage":null})",
       R"({"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":40,)"
       R"("prompt_tokens_details":{"cached_tokens":64,"audio_tokens":0},)"
       R"("completion_tokens_details":{"accepted_prediction_tokens":0,"reasoning_tokens":32}}})"});
  EXPECT_EQ(dec.summary().reasoning_tokens, 32);
  EXPECT_EQ(dec.summary().cached_tokens, 64);
  EXPECT_EQ(dec.summary().output_tokens, 40);
  EXPECT_EQ(dec.summary().prompt_tokens, 100);
  // null or absent details leave -1; a later report replaces an earlier one
  OpenAIStreamDecoder none(ApiKind::kChat);
  decode_all(none, {R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,)"
                    R"("prompt_tokens_details":null,"completion_tokens_details":{}}})"});
  EXPECT_EQ(none.summary().reasoning_tokens, -1);
  EXPECT_EQ(none.summary().cached_tokens, -1);
  decode_all(none, {R"({"choices":[],"usage":{"completion_tokens":2,)"
                    R"("prompt_tokens_details":{"cached_tokens":null},)"
                    R"("completion_tokens_details":{"reasoning_tokens":0}}})"});
  EXPECT_EQ(none.summary().reasoning_tokens, 0);
  EXPECT_EQ(none.summary().cached_tokens, -1);
}

TEST(Decoder, UsageDetailsOfAWrongTypeAreMalformed) {
  for (
      const char* bad :
      {R"({"choices":[],"usage":{"completion_tokens":1,"prompt_tokens_details":3}})",
       R"({"choices":[],"usage":{"completion_tokens":1,"completion_tokens_details":{"reasoning_tokens":"x"}}})"}) {
    OpenAIStreamDecoder dec(ApiKind::kChat);
    EXPECT_EQ(dec.decode_copy(bad).kind, ChunkKind::kMalformed) << bad;
  }
}

TEST(Decoder, AWithheldTokenTextIsFirstTokenedByTheUsageThatCountsIt) {
  // llama.cpp with max_tokens 1 and a token that is an incomplete UTF-8 sequence: an
  // empty-text chunk, then the finish with usage. The token exists: the usage marks it.
  OpenAIStreamDecoder dec(ApiKind::kCompletions);
  EXPECT_FALSE(dec.decode_copy(R"({"choices":[{"text":""}]})").first_token);
  EXPECT_TRUE(
      dec.decode_copy(
             R"({"choices":[{"text":"","finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":1}})")
          .first_token);
  EXPECT_EQ(dec.summary().output_tokens, 1);
  // a usage report of no token marks nothing
  OpenAIStreamDecoder none(ApiKind::kChat);
  EXPECT_FALSE(
      none.decode_copy(R"({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0}})")
          .first_token);
}

TEST(Decoder, ResetAndMoveKeepItUsable) {
  OpenAIStreamDecoder a(ApiKind::kCompletions);
  a.decode_copy(R"({"choices":[{"text":"x","finish_reason":"stop"}]})");
  EXPECT_EQ(a.summary().finish_reason, "stop");
  OpenAIStreamDecoder b(std::move(a));
  EXPECT_EQ(b.summary().output_tokens, 1);
  EXPECT_EQ(b.decode_copy(R"({"choices":[{"text":"y"}]})").tokens, 1);
  EXPECT_FALSE(b.decode_copy(R"({"choices":[{"text":"z"}]})").first_token);
  b.reset(ApiKind::kChat);
  EXPECT_EQ(b.summary().output_tokens, 0);
  EXPECT_TRUE(b.summary().finish_reason.empty());
  EXPECT_TRUE(b.decode_copy(R"({"choices":[{"delta":{"content":"x"}}]})").first_token);
  a.reset(ApiKind::kChat);  // moved-from
  EXPECT_EQ(a.decode_copy(R"({"choices":[{"delta":{"content":"x"}}]})").tokens, 1);
  OpenAIStreamDecoder c;
  c = std::move(b);
  EXPECT_EQ(c.summary().output_tokens, 1);
}

TEST(Decoder, LargePayloadParses) {
  std::string text(1 << 20, 'a');
  OpenAIStreamDecoder dec;
  const ChunkResult r = dec.decode_copy(R"({"choices":[{"text":")" + text + R"("}],"sm_t_ns":42})");
  EXPECT_EQ(r.kind, ChunkKind::kData);
  EXPECT_EQ(r.tokens, 1);
  EXPECT_EQ(r.server_ns, 42);
}

// --- non-stream error bodies ---
struct BodyCase {
  const char* name;
  std::string body;
  std::string expected;
};

const BodyCase kBodies[] = {
    {"vllm",
     R"({"error":{"message":"This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.","type":"BadRequestError","param":null,"code":400}})",
     "This model's maximum context length is 8192 tokens. However, you "
     "requested 9000 tokens. "
     "[BadRequestError, code=400]"},
    {"sglang_flat",
     R"({"object":"error","message":"Input length (9000 tokens) exceeds the maximum allowed length (8192 tokens).","type":"BadRequestError","param":null,"code":400})",
     "Input length (9000 tokens) exceeds the maximum allowed length (8192 "
     "tokens). "
     "[BadRequestError, code=400]"},
    {"tgi",
     R"({"error":"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`","error_type":"validation"})",
     "Input validation error: `inputs` tokens + `max_new_tokens` must be <= "
     "4096. Given: 4000 "
     "`inputs` tokens and 200 `max_new_tokens`"},  // type already in the
                                                   // message: not repeated
    {"tgi_overloaded", R"({"error":"Model is busy","error_type":"overloaded"})",
     "Model is busy [overloaded]"},
    {"llamacpp",
     R"({"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}})",
     "the request exceeds the available context size, try increasing it "
     "[exceed_context_size_error, code=400, n_prompt_tokens=5000, n_ctx=4096]"},
    {"ollama", R"({"error":"model \"llama9\" not found, try pulling it first"})",
     "model \"llama9\" not found, try pulling it first"},
    {"fastapi_validation",
     R"({"detail":[{"loc":["body","model"],"msg":"Field required","type":"missing"}]})",
     "body.model: Field required"},
    {"fastapi_detail", R"({"detail":"Not Found"})", "Not Found"},
    {"trtllm_flat_no_type", R"({"object":"error","message":"model is required","code":400})",
     "model is required [code=400]"},
    {"plain_text", "Internal Server Error\n", "Internal Server Error"},
    {"html",
     "<html>\r\n<head><title>502 Bad "
     "Gateway</title></head>\r\n\t<body></body>\n</html>",
     "<html> <head><title>502 Bad Gateway</title></head> <body></body> "
     "</html>"},
    {"json_message_with_newlines", R"({"error":{"message":"line1\nline2\r\n  line3"}})",
     "line1 line2 line3"},
    {"json_string", R"("just text")", "just text"},
    {"empty", "", ""},
    {"unknown_object", R"({"status":"busy"})", R"({"status":"busy"})"},
};

class ErrorBody : public ::testing::TestWithParam<BodyCase> {};

TEST_P(ErrorBody, OneLineMessage) {
  EXPECT_EQ(error_message_from_body(GetParam().body), GetParam().expected);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ErrorBody, ::testing::ValuesIn(kBodies),
                         [](const ::testing::TestParamInfo<BodyCase>& info) {
                           return info.param.name;
                         });

TEST(DecoderKeep, KeepsUnescapedTextAndStreamedIdsOnlyWhenAsked) {
  const std::vector<std::string> chunks = {
      R"({"choices":[{"index":0,"text":"he\"llo","token_ids":[7,8],"prompt_token_ids":[1]}]})",
      R"({"choices":[{"index":0,"text":" w\u00e9","token_ids":[9],"finish_reason":"length"}]})",
  };
  OpenAIStreamDecoder off;
  for (const std::string& c : chunks) EXPECT_EQ(off.decode_copy(c).tokens, 1);
  RequestOutput out;
  OpenAIStreamDecoder dec;
  for (const std::string& c : chunks) {
    dec.keep_output(&out, 1 << 20);
    EXPECT_EQ(dec.decode_copy(c).tokens, 1);
  }
  EXPECT_EQ(out.text, "he\"llo w\xc3\xa9");
  EXPECT_EQ(out.token_ids, (std::vector<std::int32_t>{7, 8, 9}));
  EXPECT_TRUE(out.ids_streamed);
  EXPECT_FALSE(out.truncated);
  // chat: delta.content is kept, reasoning is not; no ids streamed
  RequestOutput chat;
  OpenAIStreamDecoder cd(ApiKind::kChat);
  cd.keep_output(&chat, 1 << 20);
  cd.decode_copy(R"({"choices":[{"delta":{"reasoning_content":"hmm"}}]})");
  cd.decode_copy(R"({"choices":[{"delta":{"content":"yes"}}]})");
  EXPECT_EQ(chat.text, "yes");
  EXPECT_FALSE(chat.ids_streamed);
  dec.reset(ApiKind::kCompletions);  // reset stops keeping
  dec.decode_copy(chunks[0]);
  EXPECT_EQ(out.token_ids.size(), 3u);
}

TEST(DecoderKeep, CapBoundsTextAndIdsOfAHostileStream) {
  RequestOutput out;
  OpenAIStreamDecoder dec;
  dec.keep_output(&out, 16);
  std::string big;
  for (int i = 0; i < 10; ++i) big += "\xc3\xa9";  // 20 bytes of 2-byte characters
  dec.decode_copy(R"({"choices":[{"text":"ab","token_ids":[1,2]}]})");
  dec.decode_copy(R"({"choices":[{"text":")" + big + R"(","token_ids":[3]}]})");
  EXPECT_TRUE(out.truncated);
  EXPECT_LE(out.kept_bytes(), 16u);
  EXPECT_EQ(out.text.size() % 2, 0u) << "cut inside a UTF-8 sequence";
  EXPECT_EQ(out.token_ids, (std::vector<std::int32_t>{1, 2}));
  const std::size_t kept = out.kept_bytes();
  dec.decode_copy(R"({"choices":[{"text":"more","token_ids":[4,5,6]}]})");
  EXPECT_EQ(out.kept_bytes(), kept);
}

TEST(ErrorBodyLimits, LongBodyIsCutAtUtf8BoundaryTo500Bytes) {
  std::string body;
  for (int i = 0; i < 400; ++i) body += "\xc3\xa9";  // é, 2 bytes each
  const std::string m = error_message_from_body(R"({"error":{"message":")" + body + R"("}})");
  EXPECT_LE(m.size(), 500u);
  EXPECT_GE(m.size(), 490u);
  ASSERT_EQ(m.substr(m.size() - 3), "...");
  const std::string head = m.substr(0, m.size() - 3);
  EXPECT_EQ(head.size() % 2, 0u) << "cut inside a UTF-8 sequence";
  const std::string plain = error_message_from_body(std::string(5000, 'x'));
  EXPECT_EQ(plain.size(), 500u);
}

}  // namespace
}  // namespace speedmatrix
