// One transfer's body: an error or non-SSE answer kept (bounded) for its message, an
// event stream parsed and decoded into the cell's token events as each read arrives.
#include <algorithm>
#include <string>
#include <string_view>

#include "http_common.hpp"

namespace speedmatrix {
namespace {

constexpr std::size_t kMaxCollectedBody = 64u << 10;  // error / non-SSE bodies kept for the message

// A body whose content type is not text/event-stream is still read as SSE
// when it starts like one (some servers send text/plain or no type).
bool looks_like_sse(std::string_view s) {
  std::size_t i = 0;
  if (s.substr(0, 3) == "\xEF\xBB\xBF") i = 3;
  while (i < s.size() && (s[i] == '\n' || s[i] == '\r')) ++i;
  s.remove_prefix(i);
  if (s.empty()) return false;
  for (std::string_view field : {"data:", ":", "event:", "id:", "retry:"}) {
    const std::size_t n = std::min(s.size(), field.size());
    if (s.substr(0, n) == field.substr(0, n)) return true;
  }
  return false;
}

}  // namespace

bool Transfer::on_data(std::string_view piece) {
  const char* ptr = piece.data();
  const std::size_t n = piece.size();
  if (body == Body::kUnknown) {
    if (status >= 400 || status < 200) {
      body = Body::kError;
    } else if (!content_encoding.empty()) {
      // No encoding was asked for (no Accept-Encoding): a compressed stream cannot be read
      // as SSE, and its bytes would only say "not SSE". Name it.
      body = Body::kNotSse;
      err_kind = "not_sse";
      err_msg = "the stream is " + content_encoding +
                "-encoded (Content-Encoding: " + content_encoding +
                ") though no encoding was asked for; turn compression off for this path on "
                "the server or its proxy";
      return false;
    } else if (event_stream_type || looks_like_sse(piece)) {
      body = Body::kSse;
    } else {
      body = Body::kNotSse;
    }
  }
  if (body != Body::kSse) {
    const std::size_t room = kMaxCollectedBody - std::min(kMaxCollectedBody, collected.size());
    collected.append(ptr, std::min(room, n));
    if (body == Body::kNotSse && collected.size() >= kMaxCollectedBody) {
      err_kind = "not_sse";
      return false;  // enough to say what it was; abort
    }
    return true;
  }
  switch (parser.feed(ptr, n, *this)) {
    case SseStatus::kOk:
      return true;
    case SseStatus::kEventTooLarge:
      err_kind = "event_too_large";
      err_msg = "an event exceeded " + std::to_string(opt->max_event_bytes) + " bytes";
      return false;
    case SseStatus::kStopped:
      return false;  // on_event set the verdict
  }
  return true;
}

bool Transfer::on_event(const SseEvent& ev) {
  // Set before each decode: records->outputs may have grown (moved) since the last one.
  if (opt->keep_output) decoder.keep_output(&records->output(id), opt->keep_output_max_bytes);
  const ChunkResult c = decoder.decode(ev.data);
  RequestRecord& r = records->requests[static_cast<std::size_t>(id)];
  switch (c.kind) {
    case ChunkKind::kData:
      if (ev.event == "error") {
        err_kind = "stream_error";
        err_msg = error_message_from_body(ev.data);
        return false;
      }
      if (c.first_token && r.first_token_ns == kNever) {
        r.first_token_ns = last_read_ns;
        if (progress && r.phase == Phase::kWindow)
          progress->first_tokens.fetch_add(1, std::memory_order_relaxed);
      }
      if (c.first_content && r.first_content_ns == kNever) r.first_content_ns = last_read_ns;
      if (c.has_reasoning) ++r.reasoning_deltas;
      // usage details arrive on any chunk (final usage mostly): the latest wins
      r.reasoning_tokens = decoder.summary().reasoning_tokens;
      r.cached_tokens = decoder.summary().cached_tokens;
      if (c.tokens > 0) {
        if (opt->record_events) {
          records->events.push(id, last_read_ns, c.tokens,
                               opt->server_stamps ? c.server_ns : kNever);
        }
        if (progress && r.phase == Phase::kWindow) {
          progress->tokens.fetch_add(c.tokens, std::memory_order_relaxed);
        }
      }
      if (c.finished) stream_finished = true;
      return true;
    case ChunkKind::kDone:
      stream_finished = true;
      return true;
    case ChunkKind::kError:
      err_kind = "stream_error";
      err_msg = decoder.summary().error_message;
      if (err_msg.empty()) err_msg = error_message_from_body(ev.data);
      return false;
    case ChunkKind::kMalformed:
      err_kind = "malformed_event";
      err_msg = decoder.summary().error_message;
      if (err_msg.empty()) err_msg = "unreadable event: " + std::string(ev.data.substr(0, 120));
      return false;
  }
  return true;
}

}  // namespace speedmatrix
