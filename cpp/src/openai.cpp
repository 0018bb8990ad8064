#include "speedmatrix/openai.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "openai_detail.hpp"
#include "speedmatrix/sse.hpp"

namespace speedmatrix {

static_assert(kSsePadding >= simdjson::SIMDJSON_PADDING,
              "SSE data must carry the padding simdjson reads past the end");

namespace od = simdjson::ondemand;

namespace {

using detail::one_line;

// What one chunk says, before it is applied to the running counts.
struct Chunk {
  std::size_t n_choices = 0;
  bool has_text = false;  // has_content || has_reasoning
  bool has_content = false;
  bool has_reasoning = false;
  bool finished = false;
  std::string_view finish_reason;
  bool has_usage = false;  // usage object with completion_tokens
  std::int64_t prompt_tokens = -1;
  std::int64_t completion_tokens = -1;
  std::int64_t reasoning_tokens = -1;  // usage.completion_tokens_details.reasoning_tokens
  std::int64_t cached_tokens = -1;     // usage.prompt_tokens_details.cached_tokens
  std::int64_t server_ns = -1;
  // Errors: {"error": {...}} / {"error": "text", "error_type": ...} /
  // {"object": "error", "message": ..., "type": ...}.
  bool error = false;
  bool object_is_error = false;
  std::string_view message, type, error_type, code;
  std::string_view top_message, top_type;
  // CellSpec::keep_output: where the content text and token ids go (null: not read)
  RequestOutput* keep = nullptr;
  std::size_t keep_max = 0;
};

// Appends a kept text piece, cut (at a UTF-8 boundary) where the cap is reached.
void keep_text(std::string_view t, Chunk* c) {
  RequestOutput& o = *c->keep;
  if (o.truncated || t.empty()) return;
  const std::size_t room = c->keep_max - std::min(c->keep_max, o.kept_bytes());
  if (t.size() > room) {
    std::size_t cut = room;
    while (cut > 0 && (static_cast<unsigned char>(t[cut]) & 0xC0) == 0x80) --cut;
    t = t.substr(0, cut);
    o.truncated = true;
  }
  o.text.append(t);
}

// A choice's `token_ids` (vLLM return_token_ids) when output is kept: an array of ints or
// null; ids past the cap are dropped (truncated).
simdjson::error_code read_kept_ids(od::value v, Chunk* c) {
  od::json_type t;
  if (auto e = v.type().get(t)) return e;
  if (t == od::json_type::null) return simdjson::SUCCESS;
  od::array arr;
  if (auto e = v.get_array().get(arr)) return e;
  RequestOutput& o = *c->keep;
  o.ids_streamed = true;
  for (auto el : arr) {
    std::int64_t id = 0;
    if (auto e = std::move(el).get_int64().get(id)) return e;
    if (o.truncated) continue;
    if (o.kept_bytes() + 4 > c->keep_max) {
      o.truncated = true;
      continue;
    }
    o.token_ids.push_back(static_cast<std::int32_t>(id));
  }
  return simdjson::SUCCESS;
}

// Keys are compared in their raw (escaped) form, without unescaping them:
// the keys we look for contain no escapes. Reading name-length bytes of the
// key is safe even for a shorter key because the document is padded; the
// fixed-size memcmp compiles to a few integer compares.
template <std::size_t N>
bool key_is(const od::raw_json_string& key, const char (&name)[N]) {
  const char* p = key.raw();
  return std::memcmp(p, name, N - 1) == 0 && p[N - 1] == '"';
}

// Reads a string-or-null text field; sets *nonempty for a non-empty string.
// The raw (escaped) form is enough to tell "" from anything else. `keep` (a chunk whose
// output is kept, CellSpec::keep_output): the text is unescaped and appended to it.
simdjson::error_code read_text(od::value v, bool* nonempty, Chunk* keep = nullptr) {
  od::json_type t;
  if (auto e = v.type().get(t)) return e;
  if (t == od::json_type::null) return simdjson::SUCCESS;
  if (t != od::json_type::string) return simdjson::INCORRECT_TYPE;
  if (keep != nullptr) {
    std::string_view text;
    if (auto e = v.get_string().get(text)) return e;
    if (!text.empty()) *nonempty = true;
    keep_text(text, keep);
    return simdjson::SUCCESS;
  }
  od::raw_json_string raw;
  if (auto e = v.get_raw_json_string().get(raw)) return e;
  if (raw.raw()[0] != '"') *nonempty = true;
  return simdjson::SUCCESS;
}

simdjson::error_code read_string_or_null(od::value v, std::string_view* out) {
  od::json_type t;
  if (auto e = v.type().get(t)) return e;
  if (t == od::json_type::null) return simdjson::SUCCESS;
  if (t != od::json_type::string) return simdjson::INCORRECT_TYPE;
  return v.get_string().get(*out);
}

// An int field that may also be null; null leaves *out as it was.
simdjson::error_code read_int_or_null(od::value v, std::int64_t* out) {
  od::json_type t;
  if (auto e = v.type().get(t)) return e;
  if (t == od::json_type::null) return simdjson::SUCCESS;
  return v.get_int64().get(*out);
}

// A string or number rendered as text (error codes come as both); for numbers
// the raw JSON token is the text.
simdjson::error_code read_scalar_text(od::value v, std::string_view* out) {
  od::json_type t;
  if (auto e = v.type().get(t)) return e;
  if (t == od::json_type::string) return v.get_string().get(*out);
  if (t == od::json_type::number) {
    std::string_view raw = v.raw_json_token();
    while (!raw.empty() && (raw.back() == ' ' || raw.back() == '\n' || raw.back() == '\r' ||
                            raw.back() == '\t' || raw.back() == ',' || raw.back() == '}')) {
      raw.remove_suffix(1);
    }
    *out = raw;
  }
  return simdjson::SUCCESS;
}

// Calls on_field(key, value) for each field of `obj`, stopping at the first error (its own
// or on_field's).
template <typename F>
simdjson::error_code for_each_field(od::object obj, F&& on_field) {
  for (auto f : obj) {
    od::field field;
    if (auto e = std::move(f).get(field)) return e;
    if (auto e = on_field(field.key(), field.value())) return e;
  }
  return simdjson::SUCCESS;
}

// The same over an object-or-null value: null has no fields; any other type is an error.
template <typename F>
simdjson::error_code for_each_field(od::value v, F&& on_field) {
  od::json_type t;
  if (auto e = v.type().get(t)) return e;
  if (t == od::json_type::null) return simdjson::SUCCESS;
  od::object obj;
  if (auto e = v.get_object().get(obj)) return e;
  return for_each_field(obj, std::forward<F>(on_field));
}

simdjson::error_code read_delta(od::value v, Chunk* c) {
  return for_each_field(v, [c](const od::raw_json_string& key, od::value fv) {
    if (key_is(key, "content")) {
      return read_text(fv, &c->has_content, c->keep ? c : nullptr);
    }
    if (key_is(key, "reasoning_content") || key_is(key, "reasoning")) {
      return read_text(fv, &c->has_reasoning);
    }
    if (key_is(key, "tool_calls")) {
      // Streamed tool-call arguments are output tokens too.
      od::json_type tt;
      if (auto e = fv.type().get(tt)) return e;
      if (tt == od::json_type::array) {
        od::array arr;
        if (auto e = fv.get_array().get(arr)) return e;
        bool empty = true;
        if (auto e = arr.is_empty().get(empty)) return e;
        if (!empty) c->has_content = true;
      }
    }
    return simdjson::SUCCESS;
  });
}

// One int field `name` of an object-or-null (usage's *_details objects); null or absent
// leaves *out as it was, other fields are skipped.
template <std::size_t N>
simdjson::error_code read_detail(od::value v, const char (&name)[N], std::int64_t* out) {
  return for_each_field(v, [&name, out](const od::raw_json_string& key, od::value fv) {
    return key_is(key, name) ? read_int_or_null(fv, out) : simdjson::SUCCESS;
  });
}

simdjson::error_code read_choice(od::value v, Chunk* c) {
  od::object obj;
  if (auto e = v.get_object().get(obj)) return e;
  return for_each_field(obj, [c](const od::raw_json_string& key, od::value fv) {
    if (key_is(key, "text")) return read_text(fv, &c->has_content, c->keep ? c : nullptr);
    if (key_is(key, "delta")) return read_delta(fv, c);
    if (c->keep && key_is(key, "token_ids")) return read_kept_ids(fv, c);
    if (key_is(key, "finish_reason")) {
      od::json_type t;
      if (auto e = fv.type().get(t)) return e;
      if (t != od::json_type::null) {
        std::string_view fr;
        if (auto e = fv.get_string().get(fr)) return e;
        c->finished = true;
        c->finish_reason = fr;
      }
    }
    return simdjson::SUCCESS;
  });
}

simdjson::error_code read_usage(od::value v, Chunk* c) {
  auto err = for_each_field(v, [c](const od::raw_json_string& key, od::value fv) {
    if (key_is(key, "prompt_tokens")) return read_int_or_null(fv, &c->prompt_tokens);
    if (key_is(key, "completion_tokens")) return read_int_or_null(fv, &c->completion_tokens);
    if (key_is(key, "completion_tokens_details")) {
      return read_detail(fv, "reasoning_tokens", &c->reasoning_tokens);
    }
    if (key_is(key, "prompt_tokens_details")) {
      return read_detail(fv, "cached_tokens", &c->cached_tokens);
    }
    return simdjson::SUCCESS;
  });
  if (err) return err;
  c->has_usage = c->completion_tokens >= 0;
  return simdjson::SUCCESS;
}

simdjson::error_code read_error(od::value v, Chunk* c) {
  od::json_type t;
  if (auto e = v.type().get(t)) return e;
  if (t == od::json_type::null) return simdjson::SUCCESS;
  c->error = true;
  if (t == od::json_type::string) return v.get_string().get(c->message);
  if (t != od::json_type::object) return simdjson::SUCCESS;  // e.g. "error": true
  od::object obj;
  if (auto e = v.get_object().get(obj)) return e;
  return for_each_field(obj, [c](const od::raw_json_string& key, od::value fv) {
    if (key_is(key, "message")) return read_string_or_null(fv, &c->message);
    if (key_is(key, "type")) return read_string_or_null(fv, &c->type);
    if (key_is(key, "code")) return read_scalar_text(fv, &c->code);
    return simdjson::SUCCESS;
  });
}

simdjson::error_code read_chunk(od::parser& parser, std::string_view data, Chunk* c) {
  od::document doc;
  if (auto e = parser
                   .iterate(simdjson::padded_string_view(data.data(), data.size(),
                                                         data.size() + simdjson::SIMDJSON_PADDING))
                   .get(doc)) {
    return e;
  }
  od::object obj;
  if (auto e = doc.get_object().get(obj)) return e;
  auto err = for_each_field(obj, [c](const od::raw_json_string& key, od::value fv) {
    if (key_is(key, "choices")) {
      od::array arr;
      if (auto e = fv.get_array().get(arr)) return e;
      for (auto el : arr) {
        od::value choice;
        if (auto e = std::move(el).get(choice)) return e;
        // Only choice 0 is measured (n=1); the rest are skipped unread.
        if (c->n_choices++ == 0) {
          if (auto e = read_choice(choice, c)) return e;
        }
      }
      return simdjson::SUCCESS;
    }
    if (key_is(key, "usage")) return read_usage(fv, c);
    if (key_is(key, "sm_t_ns")) return fv.get_int64().get(c->server_ns);
    if (key_is(key, "error")) return read_error(fv, c);
    if (key_is(key, "object")) {
      std::string_view o;
      if (auto e = read_string_or_null(fv, &o)) return e;
      c->object_is_error = o == "error";
      return simdjson::SUCCESS;
    }
    if (key_is(key, "message")) return read_scalar_text(fv, &c->top_message);
    if (key_is(key, "type")) return read_scalar_text(fv, &c->top_type);
    if (key_is(key, "error_type")) return read_scalar_text(fv, &c->error_type);
    return simdjson::SUCCESS;
  });
  if (err) return err;
  // On-demand parsing stops at the end of the top-level object; anything
  // after it ("{...} junk", two objects) makes the event malformed.
  std::size_t end = data.size();
  while (end > 0 && (data[end - 1] == ' ' || data[end - 1] == '\n' || data[end - 1] == '\r' ||
                     data[end - 1] == '\t')) {
    --end;
  }
  if (end == 0 || data[end - 1] != '}') return simdjson::TRAILING_CONTENT;
  return simdjson::SUCCESS;
}

bool is_done(std::string_view data) {
  while (!data.empty() && (data.back() == ' ' || data.back() == '\t')) data.remove_suffix(1);
  while (!data.empty() && (data.front() == ' ' || data.front() == '\t')) data.remove_prefix(1);
  return data == "[DONE]";
}

}  // namespace

struct OpenAIStreamDecoder::Impl {
  od::parser parser;
  std::string copy;  // padded copy for decode_copy()
};

OpenAIStreamDecoder::OpenAIStreamDecoder(ApiKind api) : api_(api), impl_(new Impl) {}

OpenAIStreamDecoder::~OpenAIStreamDecoder() { delete impl_; }

OpenAIStreamDecoder::OpenAIStreamDecoder(OpenAIStreamDecoder&& o) noexcept
    : api_(o.api_),
      summary_(std::move(o.summary_)),
      impl_(std::exchange(o.impl_, nullptr)),
      last_usage_completion_(o.last_usage_completion_),
      final_usage_completion_(o.final_usage_completion_),
      usage_max_(o.usage_max_),
      counted_(o.counted_),
      seen_text_(o.seen_text_),
      seen_content_(o.seen_content_),
      keep_(o.keep_),
      keep_max_(o.keep_max_) {}

OpenAIStreamDecoder& OpenAIStreamDecoder::operator=(OpenAIStreamDecoder&& o) noexcept {
  if (this != &o) {
    delete impl_;
    api_ = o.api_;
    summary_ = std::move(o.summary_);
    impl_ = std::exchange(o.impl_, nullptr);
    last_usage_completion_ = o.last_usage_completion_;
    final_usage_completion_ = o.final_usage_completion_;
    usage_max_ = o.usage_max_;
    counted_ = o.counted_;
    seen_text_ = o.seen_text_;
    seen_content_ = o.seen_content_;
    keep_ = o.keep_;
    keep_max_ = o.keep_max_;
  }
  return *this;
}

void OpenAIStreamDecoder::reset(ApiKind api) {
  api_ = api;
  summary_ = StreamSummary{};
  last_usage_completion_ = -1;
  final_usage_completion_ = -1;
  usage_max_ = -1;
  counted_ = TokenSource::kNone;
  seen_text_ = false;
  seen_content_ = false;
  keep_ = nullptr;
  if (impl_ == nullptr) impl_ = new Impl;  // a moved-from decoder becomes usable again
}

ChunkResult OpenAIStreamDecoder::decode_copy(std::string_view data) {
  if (impl_ == nullptr) impl_ = new Impl;
  std::string& buf = impl_->copy;
  if (buf.size() < data.size() + kSsePadding) buf.resize(data.size() + kSsePadding);
  std::memcpy(buf.data(), data.data(), data.size());
  return decode(std::string_view(buf.data(), data.size()));
}

void OpenAIStreamDecoder::judge_usage() {
  summary_.source = counted_;
  summary_.output_tokens =
      final_usage_completion_ >= 0 ? final_usage_completion_ : summary_.chunk_tokens;
  const std::int64_t reported = final_usage_completion_ >= 0 ? final_usage_completion_
                                : counted_ == TokenSource::kUsageContinuous ? usage_max_
                                                                            : -1;
  if (reported < 0) return;
  const std::int64_t text = summary_.text_chunks;
  // What the stream itself proves: each text chunk carried a token, and with
  // cumulative usage each chunk carried what its usage added (or the one token
  // its text shows, where the usage added none).
  const std::int64_t received =
      counted_ == TokenSource::kUsageContinuous ? std::max(summary_.chunk_tokens, text) : text;
  if (reported < received) {
    // A usage below what was received cannot be right: count what was received.
    summary_.source = TokenSource::kUsageBelowChunks;
    summary_.output_tokens = received;
  } else if (counted_ == TokenSource::kUsageFinal && reported > kUsageAboveFactor * text &&
             reported - text > kUsageAboveSlack) {
    summary_.source = TokenSource::kUsageAboveChunks;
  }
}

std::int64_t OpenAIStreamDecoder::chunk_tokens(bool continuous, bool has_usage, bool has_text,
                                               std::int64_t completion_tokens) {
  std::int64_t tokens = 0;
  if (continuous) {
    if (counted_ != TokenSource::kUsageContinuous) {
      // Tokens counted per chunk before usage appeared are not counted twice.
      last_usage_completion_ = summary_.chunk_tokens;
      counted_ = TokenSource::kUsageContinuous;
    }
    tokens = std::max<std::int64_t>(0, completion_tokens - last_usage_completion_);
    // a chunk with text carries a token whatever a cumulative usage says
    if (tokens == 0 && has_text) tokens = 1;
    last_usage_completion_ += tokens;
    usage_max_ = std::max(usage_max_, completion_tokens);
  } else if (counted_ == TokenSource::kUsageContinuous) {
    if (has_usage) {  // final usage-only chunk: normally equal to the last
                      // cumulative count
      tokens = std::max<std::int64_t>(0, completion_tokens - last_usage_completion_);
      last_usage_completion_ = std::max(last_usage_completion_, completion_tokens);
    } else if (has_text) {  // a chunk without usage amid continuous usage:
                            // count it once
      tokens = 1;
      ++last_usage_completion_;
    }
  } else {
    tokens = has_text ? 1 : 0;
    if (tokens > 0 && counted_ == TokenSource::kNone) counted_ = TokenSource::kChunks;
  }
  if (has_usage && !continuous) {
    final_usage_completion_ = completion_tokens;
    if (counted_ != TokenSource::kUsageContinuous &&
        (completion_tokens > 0 || summary_.chunk_tokens + tokens > 0)) {
      counted_ = TokenSource::kUsageFinal;
    }
  }
  return tokens;
}

ChunkResult OpenAIStreamDecoder::decode(std::string_view data) {
  ChunkResult r;
  if (impl_ == nullptr) impl_ = new Impl;
  if (is_done(data)) {
    r.kind = ChunkKind::kDone;
    summary_.done = true;
    return r;
  }
  Chunk c;
  c.keep = keep_;
  c.keep_max = keep_max_;
  if (auto e = read_chunk(impl_->parser, data, &c)) {
    r.kind = ChunkKind::kMalformed;
    summary_.error_type = "malformed_event";
    summary_.error_message =
        one_line(std::string(simdjson::error_message(e)) + ": " + std::string(data.substr(0, 200)));
    return r;
  }
  r.server_ns = c.server_ns;
  c.has_text = c.has_content || c.has_reasoning;
  if (c.error || c.object_is_error) {
    r.kind = ChunkKind::kError;
    std::string_view type = !c.type.empty()         ? c.type
                            : !c.error_type.empty() ? c.error_type
                                                    : c.top_type;
    if (type.empty()) type = c.code;
    std::string_view message = !c.message.empty() ? c.message : c.top_message;
    summary_.error_type = one_line(type);
    summary_.error_message =
        one_line(message.empty() ? std::string_view("error event without message") : message);
    return r;
  }
  r.has_text = c.has_text;
  r.has_content = c.has_content;
  r.has_reasoning = c.has_reasoning;
  if (c.reasoning_tokens >= 0) summary_.reasoning_tokens = c.reasoning_tokens;
  if (c.cached_tokens >= 0) summary_.cached_tokens = c.cached_tokens;
  if (c.finished) {
    r.finished = true;
    summary_.finish_reason.assign(c.finish_reason);
  }
  if (c.prompt_tokens >= 0) summary_.prompt_tokens = c.prompt_tokens;

  // Cumulative usage on a chunk with choices means continuous usage stats,
  // except on the closing chunk of a stream that had none so far: servers
  // such as llama.cpp and TGI put the final usage there.
  const bool continuous =
      c.has_usage && c.n_choices > 0 && (counted_ == TokenSource::kUsageContinuous || !c.finished);
  const std::int64_t tokens =
      chunk_tokens(continuous, c.has_usage, c.has_text, c.completion_tokens);
  r.tokens = static_cast<std::int32_t>(std::min<std::int64_t>(tokens, INT32_MAX));
  summary_.chunk_tokens += r.tokens;
  if (c.has_text) ++summary_.text_chunks;
  judge_usage();
  // The first token: the first chunk with text, or, when a server withholds the text of a
  // generated token (llama.cpp holds back an incomplete UTF-8 sequence; with max_tokens 1
  // it never comes), the first chunk whose usage says a token was generated.
  if (!seen_text_ && (c.has_text || (c.has_usage && c.completion_tokens > 0))) {
    seen_text_ = true;
    r.first_token = true;
  }
  if (!seen_content_ && c.has_content) {
    seen_content_ = true;
    r.first_content = true;
  }
  return r;
}

}  // namespace speedmatrix
