// Raw records of a cell: the truth every figure is derived from. Columnar, so
// they cross into Python as numpy arrays without per-row objects.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "speedmatrix/clock.hpp"
#include "speedmatrix/openai.hpp"

namespace speedmatrix {

enum class Phase : std::uint8_t { kWarmup = 0, kWindow = 1 };

enum class Outcome : std::uint8_t {
  kPending = 0,    // never finished (should not remain after a cell)
  kOk = 1,         // the stream ended with [DONE] or a finish reason
  kCancelled = 2,  // cancelled by us at the end of the window (or by a stop)
  kError = 3,      // see error_kind / error_message
};

// Error kinds are stable strings (they are counted by kind in run.json):
//   "connect"            connection refused / host unreachable / DNS
//   "connect_timeout"    no connection within the connect timeout
//   "http_<code>"        HTTP status >= 400 (the message comes from the body)
//   "not_sse"            a 2xx answer whose body is not an event stream
//   "malformed_event"    an event whose JSON cannot be read
//   "stream_error"       an error event inside the stream
//   "incomplete_stream"  the stream ended without [DONE] or a finish reason
//   "connection_reset"   the connection broke mid-stream
//   "stall"              no bytes for longer than the idle timeout
//   "event_too_large"    one event exceeded the size limit
//   "tls"                TLS handshake or certificate failure
//   "bad_chunking"       the HTTP chunked framing of the body is malformed
//   "transport"          any other libcurl failure (message says which)

// One request. Times are CLOCK_MONOTONIC ns, kNever (-1) when not reached.
struct RequestRecord {
  std::int32_t slot = 0;  // concurrency slot (0..N-1) or warm-up index
  std::int32_t body = 0;  // index of the body it sent
  Phase phase = Phase::kWindow;
  ns_t scheduled_ns = kNever;    // when the scheduler wanted it sent
  ns_t sent_ns = kNever;         // when the transfer was handed to libcurl
  ns_t first_byte_ns = kNever;   // first response byte (headers)
  ns_t first_token_ns = kNever;  // first chunk with text
  ns_t done_ns = kNever;         // finished, failed or cancelled
  std::int32_t http_status = 0;
  std::int64_t prompt_tokens = -1;  // usage.prompt_tokens as the server reported
  std::int64_t output_tokens = 0;
  TokenSource token_source = TokenSource::kNone;
  Outcome outcome = Outcome::kPending;
  std::string finish_reason;
  std::string error_kind;     // "" unless outcome == kError
  std::string error_message;  // one line, secrets never included
  // Times the transport re-sent the request on a new connection because the
  // reused one died before any response byte (a keep-alive close racing the
  // request). Not a server failure; counted apart.
  std::int32_t retries = 0;
};

// Every event that carried tokens, in arrival order.
struct EventColumns {
  std::vector<std::int32_t> request;  // index into the cell's request list
  std::vector<ns_t> t_ns;             // arrival (one clock read per socket read)
  std::vector<std::int32_t> tokens;   // tokens the event carried (>= 1)
  std::vector<ns_t> server_ns;        // server's send stamp when it gave one, else -1
  void reserve(std::size_t n);
  std::size_t size() const noexcept { return t_ns.size(); }
};

// /metrics samples taken during the cell: values[i * names.size() + j] is
// metric names[j] (summed over labels) at t_ns[i]; NaN when absent.
struct MetricSamples {
  std::vector<std::string> names;
  std::vector<ns_t> t_ns;
  std::vector<double> values;
  std::int32_t failures = 0;  // polls that failed (connection, HTTP error)
};

}  // namespace speedmatrix
