// Incremental decoder of HTTP/1.1 chunked transfer coding (RFC 9112 §7.1).
//
// Why it exists: libcurl, when it decodes chunks itself, calls the write
// callback once per HTTP chunk, so the events of one socket read (a server
// that flushes several tokens at once, or a client that fell behind) would get
// one clock read each, microseconds apart, instead of sharing the read's time.
// The HTTP engine turns libcurl's decoding off (libcurl still follows the
// chunks to find the end of the response), takes one clock read per socket
// read, and decodes the chunks here. Pure: no I/O, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace speedmatrix {

class ChunkedDecoder {
 public:
  enum class Status {
    kOk,       // all bytes consumed; more are expected
    kDone,     // the last chunk and its trailer section ended (bytes after it are ignored)
    kStopped,  // the sink returned false; the rest of these bytes was not decoded
    kError,    // malformed framing: error() says what; the decoder stays in error until reset()
  };

  // Receives each piece of decoded body data, in order. Pieces are views into
  // the bytes passed to feed(), valid only during the call. Return false to
  // stop: feed() then returns kStopped at once (the caller has its own verdict).
  class Sink {
   public:
    virtual ~Sink() = default;
    virtual bool on_data(std::string_view piece) = 0;
  };

  // Decodes n bytes (split anywhere). Chunk extensions (";name=value") and
  // trailer fields are skipped; a bare "\n" is accepted where "\r\n" belongs.
  Status feed(const char* bytes, std::size_t n, Sink& sink);
  Status feed(std::string_view bytes, Sink& sink) { return feed(bytes.data(), bytes.size(), sink); }

  // True when a chunk or size line is unfinished (the body ended mid-chunk).
  bool has_partial() const noexcept;
  bool done() const noexcept { return state_ == State::kDone; }
  const char* error() const noexcept { return error_; }
  void reset() noexcept { *this = ChunkedDecoder(); }

 private:
  enum class State : std::uint8_t {
    kSize,
    kExtension,
    kData,
    kDataCr,
    kDataLf,
    kTrailer,
    kDone,
    kError
  };

  Status fail(const char* why) {
    state_ = State::kError;
    error_ = why;
    return Status::kError;
  }

  State state_ = State::kSize;
  std::uint64_t remaining_ = 0;  // data bytes left in the current chunk
  std::uint64_t size_ = 0;       // chunk size being read
  std::size_t line_len_ = 0;     // bytes of the current size or trailer line so far
  bool size_digits_ = false;     // at least one hex digit seen on the size line
  bool size_ended_ = false;      // the hex digits ended (whitespace or ';' seen)
  const char* error_ = "";
};

}  // namespace speedmatrix
