// Decoder of OpenAI-compatible streaming payloads (/v1/completions and
// /v1/chat/completions): one SSE data payload in, what it means for the
// request out. One decoder per request; it keeps the running token count.
//
// Token counting (see shared/reference/servers.md): a chunk's tokens come from
// `usage.completion_tokens` when the server streams cumulative usage
// (continuous_usage_stats); otherwise each chunk with non-empty text counts as
// one token and the request's count is marked estimated. A final usage-only
// chunk gives the true total either way.
// Usage on a chunk that has choices is taken as continuous (cumulative) usage,
// except on the closing chunk (finish_reason set) of a stream without usage so
// far: llama.cpp and TGI put the final usage there.
// First token = first chunk with non-empty `text` / `delta.content` /
// `delta.reasoning_content` / `delta.reasoning` (or streamed tool calls);
// role-only chunks are not. First content = first chunk with non-empty `text`,
// `delta.content` or tool calls: reasoning is kept apart from content (it counts as
// output tokens all the same). Only choices[0] is read.
// Usage details: `usage.completion_tokens_details.reasoning_tokens` and
// `usage.prompt_tokens_details.cached_tokens` (either may be null or absent: -1).
// Shape: wrong JSON types for the fields read are kMalformed; an object
// without choices, usage or error is a kData chunk with no tokens.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace speedmatrix {

enum class ApiKind : std::uint8_t { kCompletions = 0, kChat = 1 };

// How a request's output token count was obtained.
enum class TokenSource : std::uint8_t {
  kNone = 0,             // no tokens seen
  kChunks = 1,           // one per non-empty chunk: an estimate
  kUsageFinal = 2,       // per-chunk counts estimated, total from the final usage
  kUsageContinuous = 3,  // every chunk's count from cumulative usage: exact
  // The usage (final or cumulative) was below the chunks that carried text: it
  // cannot be right, so the request is counted as received (each text chunk at
  // least one token, more where cumulative usage said so).
  kUsageBelowChunks = 4,
  // A final usage more than kUsageAboveFactor times the chunks that carried
  // text, and more than kUsageAboveSlack tokens above them: believed (chunks
  // scaled to it, as kUsageFinal), but flagged.
  kUsageAboveChunks = 5,
};

inline constexpr std::int64_t kUsageAboveFactor = 2;
inline constexpr std::int64_t kUsageAboveSlack = 8;

// Whether a request's per-chunk counts are scaled to its usage total (stats.cpp).
constexpr bool scaled_to_usage(TokenSource s) {
  return s == TokenSource::kUsageFinal || s == TokenSource::kUsageAboveChunks;
}

enum class ChunkKind : std::uint8_t {
  kData = 0,       // a normal chunk (may carry zero tokens, e.g. role-only)
  kDone = 1,       // "[DONE]"
  kError = 2,      // a JSON object carrying "error" (mid-stream error event)
  kMalformed = 3,  // not JSON, or JSON of an unexpected shape
};

struct ChunkResult {
  ChunkKind kind = ChunkKind::kData;
  std::int32_t tokens = 0;      // output tokens this chunk adds (>= 0)
  bool has_text = false;        // non-empty text/content/reasoning
  bool has_content = false;     // non-empty text/content or tool calls (not reasoning)
  bool has_reasoning = false;   // non-empty delta.reasoning_content / delta.reasoning
  bool first_token = false;     // this chunk carries the request's first token
  bool first_content = false;   // this chunk carries the request's first content
  bool finished = false;        // a finish_reason was given in this chunk
  std::int64_t server_ns = -1;  // "sm_t_ns" stamp of the built-in engine (benchmarks), else -1
};

struct StreamSummary {
  std::int64_t output_tokens = 0;   // best count so far (usage when given)
  std::int64_t chunk_tokens = 0;    // sum of ChunkResult::tokens
  std::int64_t text_chunks = 0;     // chunks with non-empty text (each at least one token)
  std::int64_t prompt_tokens = -1;  // usage.prompt_tokens, -1 if never given
  // usage.completion_tokens_details.reasoning_tokens, the last one given; -1 if never
  std::int64_t reasoning_tokens = -1;
  // usage.prompt_tokens_details.cached_tokens, the last one given; -1 if never
  std::int64_t cached_tokens = -1;
  TokenSource source = TokenSource::kNone;
  std::string finish_reason;  // "" until given
  std::string error_type;     // kError: the server's type (or code); kMalformed: "malformed_event"
  std::string error_message;  // one line, at most 500 bytes
  bool done = false;          // "[DONE]" seen
};

// What one request's stream delivered, kept only when asked (CellSpec::keep_output): the
// content text of choice 0 (`text` / `delta.content`, unescaped; reasoning is not kept) and,
// where the server streams them, its token ids (a choice's `token_ids` array: vLLM with
// `return_token_ids`). Bounded: text bytes + 4 x ids stop growing at the decoder's cap
// (a hostile server cannot grow the client's memory), truncated then says so.
struct RequestOutput {
  std::string text;
  std::vector<std::int32_t> token_ids;
  bool ids_streamed = false;  // some chunk carried a token_ids array (possibly empty)
  bool truncated = false;     // the cap was reached: text and ids stop there
  std::size_t kept_bytes() const noexcept { return text.size() + 4 * token_ids.size(); }
};

class OpenAIStreamDecoder {
 public:
  explicit OpenAIStreamDecoder(ApiKind api = ApiKind::kCompletions);
  ~OpenAIStreamDecoder();
  OpenAIStreamDecoder(OpenAIStreamDecoder&&) noexcept;
  OpenAIStreamDecoder& operator=(OpenAIStreamDecoder&&) noexcept;

  // REQUIRES: `data` is followed by kSsePadding readable bytes (SseEvent::data is).
  ChunkResult decode(std::string_view data);
  // Same, for a payload without padding (copies it first). For tests and cold paths.
  ChunkResult decode_copy(std::string_view data);

  const StreamSummary& summary() const noexcept { return summary_; }
  // Resets the counts and stops keeping output (keep_output(nullptr)).
  void reset(ApiKind api);
  // From the next decode() on, appends what the chunks deliver to *out (null: keep nothing,
  // the default: no string is read or copied), at most max_bytes of it (kept_bytes()).
  // *out must outlive the decodes that follow (callers set it before each one).
  void keep_output(RequestOutput* out, std::size_t max_bytes) noexcept {
    keep_ = out;
    keep_max_ = max_bytes;
  }

 private:
  // summary_.source and output_tokens from the counts so far (the usage judged
  // against the chunks that carried text).
  void judge_usage();
  // The tokens one chunk carries: from its usage (a running count when `continuous`, else
  // a final total) or from its text; settles how the stream is counted (counted_).
  std::int64_t chunk_tokens(bool continuous, bool has_usage, bool has_text,
                            std::int64_t completion_tokens);

  struct Impl;  // simdjson parser state
  ApiKind api_;
  StreamSummary summary_;
  Impl* impl_ = nullptr;
  // Cumulative usage.completion_tokens already turned into chunk tokens
  // (continuous usage), -1 before the first one.
  std::int64_t last_usage_completion_ = -1;
  std::int64_t final_usage_completion_ = -1;  // total from a final usage, -1 if none
  std::int64_t usage_max_ = -1;  // largest cumulative usage.completion_tokens, -1 if none
  // How the chunks' tokens are counted (kNone .. kUsageContinuous); summary_.source
  // adds the judgement of the usage against the text chunks.
  TokenSource counted_ = TokenSource::kNone;
  bool seen_text_ = false;
  bool seen_content_ = false;
  RequestOutput* keep_ = nullptr;
  std::size_t keep_max_ = 0;
};

// Parses a non-streaming error body (an HTTP 4xx/5xx answer) of any of the
// shapes servers use: {"error":{"message","type","code"}}, {"object":"error",
// "message",...}, {"error":"text","error_type":...}, or plain text. Returns a
// one-line message (at most 500 bytes).
std::string error_message_from_body(std::string_view body);

}  // namespace speedmatrix
