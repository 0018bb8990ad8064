// Raw records of a cell: the truth every figure is derived from. Columnar, so
// they cross into Python as numpy arrays without per-row objects.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
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

// Arrival times of a cell's token events, kept compactly while the window runs: each is a
// 4-byte offset from the base of its block; a new block (16 bytes) starts when an offset
// would not fit in 32 bits (4.29 s) or time goes back. Random access is a binary search
// over blocks. to_vector() gives the plain int64 column at the end of the cell.
class NsColumn {
 public:
  void push_back(ns_t t);
  ns_t operator[](std::size_t i) const;
  std::size_t size() const noexcept { return offsets_.size(); }
  void reserve(std::size_t n) { offsets_.reserve(n); }
  std::vector<ns_t> to_vector() const;
  std::size_t memory_bytes() const noexcept;

 private:
  struct Block {
    ns_t base;
    std::size_t first;  // index of its first entry
  };
  std::vector<Block> blocks_;
  std::vector<std::uint32_t> offsets_;
};

// Token counts of events: 2 bytes each; a count of 65535 or more (never seen from a real
// server: one event is one chunk) is kept whole in a side list.
class CountColumn {
 public:
  void push_back(std::int32_t v);
  std::int32_t operator[](std::size_t i) const;
  std::size_t size() const noexcept { return small_.size(); }
  void reserve(std::size_t n) { small_.reserve(n); }
  std::vector<std::int32_t> to_vector() const;
  std::size_t memory_bytes() const noexcept;

 private:
  static constexpr std::uint16_t kEscape = 0xFFFF;
  std::vector<std::uint16_t> small_;
  std::vector<std::pair<std::size_t, std::int32_t>> large_;  // (index, value), in order
};

// The engine's own send stamps: nothing at all is stored while every value is kNever (any
// server but the built-in engine with --stamp); the first stamp makes the column plain.
class StampColumn {
 public:
  void push_back(ns_t v);
  ns_t operator[](std::size_t i) const { return dense_ ? values_[i] : kNever; }
  std::size_t size() const noexcept { return n_; }
  void reserve(std::size_t) {}
  std::vector<ns_t> to_vector() const;
  std::size_t memory_bytes() const noexcept { return values_.capacity() * sizeof(ns_t); }

 private:
  std::size_t n_ = 0;
  bool dense_ = false;        // a stamp was seen: values_ holds every entry
  std::vector<ns_t> values_;  // empty while every value is kNever
};

// Every event that carried tokens, in arrival order. Held for the whole window, so kept
// compact: 10 bytes an event without server stamps (docs/RELIABILITY.md), against 24 as
// plain columns; the Python side gets the plain columns (to_vector) once the cell ends.
struct EventColumns {
  std::vector<std::int32_t> request;  // index into the cell's request list
  NsColumn t_ns;                      // arrival (one clock read per socket read)
  CountColumn tokens;                 // tokens the event carried (>= 1)
  StampColumn server_ns;              // server's send stamp when it gave one, else -1
  void reserve(std::size_t n);
  std::size_t size() const noexcept { return t_ns.size(); }
  // Bytes held (capacities, not sizes): what a long window costs.
  std::size_t memory_bytes() const noexcept;
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
