// The streaming HTTP engine: libcurl's multi interface driven by our own epoll
// loop (curl_multi_socket_action), many concurrent SSE streams on keep-alive
// connections, each fed through SseParser -> OpenAIStreamDecoder into the
// cell's records. The only component that includes <curl/curl.h>.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "speedmatrix/openai.hpp"
#include "speedmatrix/scheduler.hpp"

namespace speedmatrix {

struct HttpOptions {
  std::string url;                   // http:// or https:// endpoint that answers a POST with SSE
  std::vector<std::string> headers;  // extra "Name: value" headers
  std::string api_key;               // "Authorization: Bearer ..."; never logged or returned
  ApiKind api = ApiKind::kCompletions;
  double connect_timeout_s = 10;
  double idle_timeout_s = 120;  // no byte for this long => error "stall"
  bool tls_verify = true;       // verify the peer's certificate and host name
  std::string ca_file;          // PEM CA bundle; "" = libcurl's default
  std::size_t max_event_bytes = 16u << 20;
  bool record_events = true;   // fill records.events
  bool server_stamps = false;  // keep the engine's "sm_t_ns" stamps in events.server_ns
  // Keep what each stream delivers in records.outputs, at most keep_output_max_bytes a
  // request (CellSpec::keep_output; the cell sets these two from its spec).
  bool keep_output = false;
  std::size_t keep_output_max_bytes = 0;
  // The most transfers expected at once. Sizes the connection cache so that
  // every stream keeps its connection; connections are never capped below it.
  std::int32_t max_concurrency = 1;
};

// Transport over libcurl multi. Per-request timing contract:
//   sent_ns        when the transfer was added to the multi handle
//   first_byte_ns  the socket read that brought the first response header
//   first_token_ns / events[].t_ns  the socket read that brought the event:
//                  one clock read per libcurl write callback (a socket read,
//                  or an HTTP chunk of it), taken before any parsing
//   done_ns        the last read of a completed stream; otherwise when the
//                  failure or cancellation was seen
class CurlTransport final : public Transport {
 public:
  // Throws std::invalid_argument for an unusable URL and std::runtime_error
  // when libcurl or epoll cannot be set up. `progress` (may be null) gets the
  // window's token count live.
  CurlTransport(HttpOptions options, CellRecords& records, CellProgress* progress = nullptr);
  ~CurlTransport() override;
  CurlTransport(const CurlTransport&) = delete;
  CurlTransport& operator=(const CurlTransport&) = delete;

  void start(std::int32_t id, std::string_view body) override;
  void cancel(std::int32_t id) override;
  void poll(ns_t deadline_ns, std::vector<std::int32_t>& finished) override;
  void wake() noexcept override;

  // Worst lateness of the loop waking from a timed wait, in ms.
  double loop_lag_max_ms() const noexcept;
  // Connections libcurl opened for the requests that finished so far
  // (keep-alive reuse shows as fewer than requests).
  std::int64_t connections_opened() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A blocking GET on a kept-alive connection, for the /metrics sampler.
class HttpGetter {
 public:
  HttpGetter(std::vector<std::string> headers, std::string api_key, double timeout_s,
             bool tls_verify = true, const std::string& ca_file = {});
  ~HttpGetter();
  HttpGetter(const HttpGetter&) = delete;
  HttpGetter& operator=(const HttpGetter&) = delete;
  // True with the body in *body on a 2xx answer; false with a one-line reason
  // in *error otherwise (never throws).
  bool get(const std::string& url, std::string* body, std::string* error);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The delay a Retry-After header value asks for, in ns (RFC 9110 10.2.3):
// delta-seconds ("120"), or an HTTP-date ("Wed, 21 Oct 2015 07:28:00 GMT")
// taken against `now_unix_s` (a date in the past: 0). kNever when the value is
// neither. Values are capped at a year; the caller bounds them further
// (BackoffPolicy::retry_after_max_ns). CurlTransport reads it from every
// answer and, for an answer that ends http_<code>, stores it in
// CellRecords::retry_after_ns and adds "(Retry-After N ms)" to the message.
ns_t parse_retry_after(std::string_view value, std::int64_t now_unix_s);

// Checks that `url` is an absolute http(s) URL libcurl can use; returns "" or
// the reason it cannot.
std::string check_url(const std::string& url);

}  // namespace speedmatrix
