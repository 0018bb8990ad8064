// Incremental Server-Sent-Events parser (WHATWG event-stream rules, the subset
// LLM servers use): bytes may be split at any point; lines end in "\n", "\r\n"
// or "\r"; lines starting with ':' are comments; "data:" lines of one event are
// joined with '\n'; a blank line dispatches the event; "event:" and "id:" are
// kept; a single space after the colon is dropped. No I/O, no allocation per
// event once buffers have grown.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace speedmatrix {

// SseEvent::data is followed by at least this many readable bytes, so a
// simdjson on-demand parser can read it in place without copying.
inline constexpr std::size_t kSsePadding = 64;

struct SseEvent {
  std::string_view event;  // "" when the event had no "event:" line
  std::string_view data;   // joined data lines (no trailing '\n')
  std::string_view id;
};

class SseSink {
 public:
  virtual ~SseSink() = default;
  // The views are valid only during the call. Return false to stop parsing
  // (feed() then returns at once with SseStatus::kStopped).
  virtual bool on_event(const SseEvent& ev) = 0;
};

enum class SseStatus { kOk, kStopped, kEventTooLarge };

class SseParser {
 public:
  // max_event_bytes: the largest event (sum of its data) accepted; a larger
  // one makes feed() return kEventTooLarge and the parser unusable until reset().
  explicit SseParser(std::size_t max_event_bytes = 16u << 20);

  // Parses n bytes, calling sink.on_event for each complete event. After
  // kStopped the bytes of this call that followed the stopping event are
  // dropped; a later feed() continues with its own bytes.
  SseStatus feed(const char* bytes, std::size_t n, SseSink& sink);
  SseStatus feed(std::string_view bytes, SseSink& sink) {
    return feed(bytes.data(), bytes.size(), sink);
  }

  // True when bytes of an unfinished event (or line) are buffered: at the end
  // of a stream this means it stopped mid-event.
  bool has_partial() const noexcept;
  // Total events dispatched and comment lines seen since construction/reset.
  std::size_t events() const noexcept { return events_; }
  std::size_t comments() const noexcept { return comments_; }
  void reset();

 private:
  enum class Step { kOk, kStopped, kTooLarge };
  Step process_line(const char* p, std::size_t n, SseSink& sink);
  Step dispatch(SseSink& sink);

  std::size_t max_event_bytes_;
  std::string line_;  // the current unfinished line, carried across feeds
  // Data of the current event in [0, data_len_); data_.size() >= data_len_ +
  // kSsePadding always, so the padding bytes are allocated and initialised.
  std::string data_;
  std::size_t data_len_ = 0;
  std::string event_;
  std::string id_;            // last event ID: persists across events (WHATWG)
  bool have_data_ = false;    // a "data" field was seen in the current event
  bool pending_ = false;      // any field of the current event was seen
  bool last_was_cr_ = false;  // the previous feed ended in '\r'
  bool too_large_ = false;
  std::size_t events_ = 0;
  std::size_t comments_ = 0;
};

}  // namespace speedmatrix
