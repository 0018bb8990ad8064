// What the libcurl users of cpp/src share (http.cpp's transport, http_transfer.cpp,
// http_common.cpp, http_getter.cpp). Private to cpp/src.
#pragma once

#include <curl/curl.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "speedmatrix/cell.hpp"
#include "speedmatrix/chunked.hpp"
#include "speedmatrix/http.hpp"
#include "speedmatrix/openai.hpp"
#include "speedmatrix/sse.hpp"

namespace speedmatrix {

// curl_global_init, once per process.
void global_init();

// One line, bounded: error messages end up in tables and JSON.
std::string one_line(std::string s, std::size_t max = 500);

// Whether `s` starts with `prefix`, ASCII case-insensitively. `prefix` is lower case.
bool iequals_prefix(std::string_view s, std::string_view prefix);

// The error kind (records.hpp) of a libcurl failure; `connected`: the connection was made.
const char* kind_of(CURLcode code, bool connected);

// One transfer: parser state reused across requests, and an easy handle made
// afresh for each request from the transport's template (the connection lives
// in the multi handle's cache, not in the easy handle).
//
// Why a fresh handle per request: when a kept-alive connection turns out dead
// before any response byte (a server such as llama.cpp's closes an idle one
// after its keep-alive timeout; a request can cross that moment), libcurl
// re-sends the request on a new connection by itself, but its retry budget
// (5) belongs to the easy handle and libcurl 7.88 never refills it after a
// success. A handle reused for many requests used it up, and the next such
// close failed at once: "Connection died, tried 5 times before giving up".
struct Transfer final : SseSink, ChunkedDecoder::Sink {
  CurlTransport::Impl* engine = nullptr;  // for libcurl's callbacks (http.cpp)
  // What the body's events are written to (set by the engine with `engine`).
  const HttpOptions* opt = nullptr;
  CellRecords* records = nullptr;
  CellProgress* progress = nullptr;
  CURL* easy = nullptr;
  std::int32_t id = -1;
  ChunkedDecoder chunks;  // libcurl hands over the raw chunked body (see acquire())
  bool chunked = false;   // Transfer-Encoding: chunked
  SseParser parser;
  OpenAIStreamDecoder decoder;
  long status = 0;
  bool event_stream_type = false;  // Content-Type: text/event-stream
  std::string content_encoding;    // Content-Encoding of a 2xx answer ("" = none, identity)
  enum class Body : std::uint8_t { kUnknown, kSse, kError, kNotSse } body = Body::kUnknown;
  bool headers_started = false;
  bool stream_finished = false;  // [DONE] or a finish reason seen
  ns_t last_activity_ns = kNever;
  ns_t last_read_ns = kNever;  // the clock read of the latest write callback (one libcurl read)
  std::string collected;       // body of an error / non-SSE answer (bounded)
  std::string err_kind;        // our own verdict, set before we abort a transfer
  std::string err_msg;
  std::int32_t sends = 0;  // times libcurl sent this request (> 1: re-sent on a new connection)
  ns_t retry_after_ns = kNever;  // the answer's Retry-After (parse_retry_after), kNever: none
  char errbuf[CURL_ERROR_SIZE];

  Transfer(std::size_t max_event_bytes, ApiKind api) : parser(max_event_bytes), decoder(api) {}

  void reset_for(std::int32_t new_id, ApiKind api, ns_t now) {
    id = new_id;
    chunks.reset();
    chunked = false;
    parser.reset();
    decoder.reset(api);
    status = 0;
    event_stream_type = false;
    content_encoding.clear();
    body = Body::kUnknown;
    headers_started = false;
    stream_finished = false;
    last_activity_ns = now;
    last_read_ns = kNever;
    collected.clear();
    err_kind.clear();
    err_msg.clear();
    sends = 0;
    retry_after_ns = kNever;
    errbuf[0] = '\0';
  }

  bool on_event(const SseEvent& ev) override;
  // Decoded body bytes of the current read (all stamped with last_read_ns).
  // False: abort the transfer (err_kind, or on_event's verdict, says why).
  bool on_data(std::string_view piece) override;
};

}  // namespace speedmatrix
