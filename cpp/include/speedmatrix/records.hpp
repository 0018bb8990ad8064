// Raw records of a cell: the truth every figure is derived from. Columnar, so
// they cross into Python as numpy arrays without per-row objects.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
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
  ns_t first_token_ns = kNever;  // first chunk with text on any channel (reasoning or content)
  // First chunk with visible content (`text`, `delta.content`, streamed tool calls), not
  // reasoning: the time to first output (TTFO) a reader sees. Equal to first_token_ns on a
  // server that streams no reasoning; kNever when only reasoning (or nothing) came.
  ns_t first_content_ns = kNever;
  ns_t done_ns = kNever;  // finished, failed or cancelled
  std::int32_t http_status = 0;
  std::int64_t prompt_tokens = -1;  // usage.prompt_tokens as the server reported
  std::int64_t output_tokens = 0;   // every channel: reasoning tokens included
  // usage.completion_tokens_details.reasoning_tokens (part of output_tokens); -1 when the
  // server did not say.
  std::int64_t reasoning_tokens = -1;
  // usage.prompt_tokens_details.cached_tokens: prompt tokens served from the server's
  // prefix cache; -1 when the server did not say.
  std::int64_t cached_tokens = -1;
  // Chunks that carried non-empty `delta.reasoning_content` / `delta.reasoning`: what was
  // streamed of the reasoning (compared with reasoning_tokens by the reasoning_hidden rule).
  std::int32_t reasoning_deltas = 0;
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

// A cell's request records in send order (request id = index). Memory does not grow with
// the window: once the in-memory tail holds spill_threshold records, spill_finished() moves
// its longest prefix of records that finished before a given time to two unlinked files
// (fixed 128-byte rows, and the three strings of each row back to back) and drops them.
// Records in flight always stay in memory.
//   operator[] (mutable): the transport and the loops change only records in flight or just
//     finished, which the loops' lag (they spill what finished seconds ago) keeps in memory;
//     a spilled id throws std::logic_error, a bug and never a lost record.
//   operator[] const: any id; a spilled one is read into a one-record cache, valid until the
//     next read of a spilled id (read a field and let go).
//   for_each: every record, spilled ones read in blocks; begin..end: as operator[] const.
// When a spill file cannot be created or written, the records stay in memory from then on
// and note() says so once; none is lost. Not thread-safe: the transport's thread only.
class RequestLog {
 public:
  static constexpr std::size_t kDefaultSpillThreshold = 4096;  // ~0.9 MB of records

  RequestLog();
  RequestLog(RequestLog&& o) noexcept;
  RequestLog& operator=(RequestLog&& o) noexcept;
  RequestLog(const RequestLog&) = delete;
  RequestLog& operator=(const RequestLog&) = delete;
  ~RequestLog();

  // threshold 0 = never spill; dir "" = $TMPDIR, else /tmp.
  void configure_spill(std::size_t threshold, std::string dir = "");

  void push_back(RequestRecord r) { tail_.push_back(std::move(r)); }
  std::size_t size() const noexcept { return spilled_ + tail_.size(); }
  bool empty() const noexcept { return size() == 0; }
  RequestRecord& operator[](std::size_t i);
  const RequestRecord& operator[](std::size_t i) const;
  RequestRecord& back() { return (*this)[size() - 1]; }
  const RequestRecord& back() const { return (*this)[size() - 1]; }

  // When the tail has reached the threshold: spills its longest prefix of records whose
  // outcome is final and whose done_ns is before `before_ns`. Cheap when there is nothing to
  // do; a prefix held back by a long request is retried after threshold/4 more records.
  void spill_finished(ns_t before_ns);

  // Calls f(i, record) for i in [from, to), in order.
  template <class F>
  void for_each(std::size_t from, std::size_t to, F&& f) const;

  std::size_t spilled() const noexcept { return spilled_; }
  const std::string& note() const noexcept { return note_; }
  std::size_t memory_bytes() const noexcept;  // records held (capacity), their strings aside

  // Iteration over every record, as operator[] const reads them: a spilled record's
  // reference lasts until the next one is read (for_each reads them in blocks).
  class const_iterator {
   public:
    using value_type = RequestRecord;
    using reference = const RequestRecord&;
    using difference_type = std::ptrdiff_t;
    const_iterator(const RequestLog* log, std::size_t i) : log_(log), i_(i) {}
    const RequestRecord& operator*() const { return (*log_)[i_]; }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const const_iterator& o) const { return i_ == o.i_; }
    bool operator!=(const const_iterator& o) const { return i_ != o.i_; }

   private:
    const RequestLog* log_;
    std::size_t i_;
  };
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size()}; }

  static constexpr std::size_t kReadBlock = 1024;

  // One spilled record: fixed fields, and where its strings lie in the text file.
  struct Row {
    ns_t scheduled_ns, sent_ns, first_byte_ns, first_token_ns, first_content_ns, done_ns;
    std::int64_t prompt_tokens, output_tokens, reasoning_tokens, cached_tokens;
    std::uint64_t text_off;  // finish_reason, error_kind, error_message, back to back
    std::int32_t slot, body, http_status, retries, reasoning_deltas;
    std::uint32_t finish_len, kind_len, message_len;
    std::uint8_t phase, token_source, outcome, pad;
    std::uint32_t pad2;
  };

 private:
  // Rows [from, from + n) with their strings, into `out` (resized to n).
  void read_spilled(std::size_t from, std::size_t n, std::vector<RequestRecord>& out) const;
  void fail(const std::string& what, int err);
  void close_files() noexcept;

  std::size_t threshold_ = kDefaultSpillThreshold;
  std::size_t next_try_ = kDefaultSpillThreshold;  // tail size at which to look again
  std::string dir_;
  std::size_t spilled_ = 0;  // records [0, spilled_) are in the files
  std::uint64_t text_bytes_ = 0;
  bool disabled_ = false;
  std::string note_;
  int fd_[2] = {-1, -1};                      // rows, text
  std::vector<RequestRecord> tail_;           // records [spilled_, size())
  mutable std::vector<RequestRecord> cache_;  // the last spilled record read by operator[]
};

template <class F>
void RequestLog::for_each(std::size_t from, std::size_t to, F&& f) const {
  to = std::min(to, size());
  if (from < spilled_) {
    std::vector<RequestRecord> block;
    while (from < std::min(to, spilled_)) {
      const std::size_t n = std::min({kReadBlock, spilled_ - from, to - from});
      read_spilled(from, n, block);
      for (std::size_t k = 0; k < n; ++k) f(from + k, static_cast<const RequestRecord&>(block[k]));
      from += n;
    }
  }
  for (; from < to; ++from) f(from, static_cast<const RequestRecord&>(tail_[from - spilled_]));
}

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
  void clear() noexcept;  // keeps the capacity

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
  void clear() noexcept;  // keeps the capacity

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
  void clear() noexcept;  // keeps the capacity

 private:
  std::size_t n_ = 0;
  bool dense_ = false;        // a stamp was seen: values_ holds every entry
  std::vector<ns_t> values_;  // empty while every value is kNever
};

// A plain column handed over at the end of a cell: either owned memory or a private
// (copy-on-write) mapping of a spill file, unmapped when this is destroyed. Move-only.
template <class T>
class PlainColumn {
 public:
  PlainColumn() = default;
  explicit PlainColumn(std::vector<T> v) : owned_(std::move(v)) {}
  // Takes over a mapping of `n` values at `addr` (`bytes` long, for munmap).
  PlainColumn(void* addr, std::size_t bytes, std::size_t n)
      : map_(addr), map_bytes_(bytes), n_(n) {}
  PlainColumn(PlainColumn&& o) noexcept { *this = std::move(o); }
  PlainColumn& operator=(PlainColumn&& o) noexcept;
  PlainColumn(const PlainColumn&) = delete;
  PlainColumn& operator=(const PlainColumn&) = delete;
  ~PlainColumn() { release(); }
  T* data() noexcept { return map_ ? static_cast<T*>(map_) : owned_.data(); }
  const T* data() const noexcept { return map_ ? static_cast<const T*>(map_) : owned_.data(); }
  std::size_t size() const noexcept { return map_ ? n_ : owned_.size(); }
  bool mapped() const noexcept { return map_ != nullptr; }
  std::vector<T> to_vector() const { return std::vector<T>(data(), data() + size()); }

 private:
  void release() noexcept;
  std::vector<T> owned_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0, n_ = 0;
};

// Every event that carried tokens, in arrival order, for the whole cell. Memory does not
// grow with the window: the newest events (the tail) are held compactly (10 bytes an event
// without server stamps, docs/RELIABILITY.md); once the tail holds spill_threshold events it
// is appended, as plain columns (int32 request, int64 t_ns, int32 tokens, int64 server_ns:
// 24 bytes an event), to four unlinked temporary files (O_TMPFILE in the spill directory,
// else mkstemp + unlink) and dropped from memory. Every index stays readable: the tail from
// memory, older events from the files (pread; for_each reads them in blocks). When a spill
// file cannot be created or written (full disk, read-only directory) the events stay in
// memory from then on and note() says so once; no event is lost.
// At the end of the cell take_plain() hands over the plain columns: mappings of the files
// when the cell spilled (no anonymous memory for them), else vectors.
// Not thread-safe: one thread writes and reads (the transport's, between polls).
class EventColumns {
 public:
  static constexpr std::size_t kDefaultSpillThreshold = std::size_t{1} << 18;  // 2.5 MB of tail

  EventColumns() = default;
  EventColumns(EventColumns&& o) noexcept;
  EventColumns& operator=(EventColumns&& o) noexcept;
  EventColumns(const EventColumns&) = delete;
  EventColumns& operator=(const EventColumns&) = delete;
  ~EventColumns();

  // threshold 0 = never spill; dir "" = $TMPDIR, else /tmp. Call before the first push.
  void configure_spill(std::size_t threshold, std::string dir = "");

  void push(std::int32_t request, ns_t t_ns, std::int32_t tokens, ns_t server_ns);
  std::size_t size() const noexcept { return spilled_ + t_ns_.size(); }
  void reserve(std::size_t n);

  // Random access to any event; an index below spilled() costs a pread per call.
  std::int32_t request(std::size_t i) const;
  ns_t t_ns(std::size_t i) const;
  std::int32_t tokens(std::size_t i) const;
  ns_t server_ns(std::size_t i) const;

  // Calls f(i, request, t_ns, tokens) for i in [from, to), in order; spilled events are
  // read in blocks of kReadBlock.
  template <class F>
  void for_each(std::size_t from, std::size_t to, F&& f) const;

  std::size_t spilled() const noexcept { return spilled_; }
  // One line when the events could not be spilled (and are held in memory), else "".
  const std::string& note() const noexcept { return note_; }
  // Bytes held in memory (capacities, not sizes): what a long window costs.
  std::size_t memory_bytes() const noexcept;

  struct Plain {
    PlainColumn<std::int32_t> request;
    PlainColumn<ns_t> t_ns;
    PlainColumn<std::int32_t> tokens;
    PlainColumn<ns_t> server_ns;
  };
  // The whole columns, once the cell has ended; leaves this empty. A cell that spilled gets
  // mappings of the files (its last tail is spilled first); if that fails, the columns are
  // read back into memory once and note() says why.
  Plain take_plain();
  // A copy of the whole columns in memory (24 bytes an event); leaves this as it was.
  Plain plain_copy() const;

  static constexpr std::size_t kReadBlock = 8192;

 private:
  struct Block {
    std::int32_t request[kReadBlock];
    ns_t t_ns[kReadBlock];
    std::int32_t tokens[kReadBlock];
  };
  void read_spilled(std::size_t from, std::size_t n, Block& b) const;
  bool spill();  // the tail to the files; false (and note_) on failure
  void fail(const std::string& what, int err);
  void close_files() noexcept;

  std::size_t threshold_ = kDefaultSpillThreshold;
  std::string dir_;
  std::size_t spilled_ = 0;  // events [0, spilled_) are in the files
  bool disabled_ = false;    // a spill failed: keep everything in memory
  std::string note_;
  int fd_[4] = {-1, -1, -1, -1};  // request, t_ns, tokens, server_ns
  // the tail: events [spilled_, size())
  std::vector<std::int32_t> request_;
  NsColumn t_ns_;
  CountColumn tokens_;
  StampColumn server_ns_;
};

template <class F>
void EventColumns::for_each(std::size_t from, std::size_t to, F&& f) const {
  to = std::min(to, size());
  if (from < spilled_) {
    auto b = std::make_unique<Block>();
    while (from < std::min(to, spilled_)) {
      const std::size_t n = std::min({kReadBlock, spilled_ - from, to - from});
      read_spilled(from, n, *b);
      for (std::size_t k = 0; k < n; ++k) f(from + k, b->request[k], b->t_ns[k], b->tokens[k]);
      from += n;
    }
  }
  for (; from < to; ++from) {
    const std::size_t k = from - spilled_;
    f(from, request_[k], t_ns_[k], tokens_[k]);
  }
}

// /metrics samples taken during the cell: values[i * names.size() + j] is
// metric names[j] (summed over labels) at t_ns[i]; NaN when absent.
struct MetricSamples {
  std::vector<std::string> names;
  std::vector<ns_t> t_ns;
  std::vector<double> values;
  std::int32_t failures = 0;  // polls that failed (connection, HTTP error)
};

}  // namespace speedmatrix
