#include "speedmatrix/chunked.hpp"

#include <algorithm>

namespace speedmatrix {
namespace {

// Bounds on what is not body data: a size line (with extensions) and one
// trailer line. Real servers send a few bytes; these only stop a runaway.
constexpr std::size_t kMaxLine = 8192;
constexpr std::uint64_t kMaxChunk = std::uint64_t{1} << 48;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool ChunkedDecoder::has_partial() const noexcept {
  if (state_ == State::kDone) return false;
  return state_ != State::kSize || line_len_ > 0;
}

ChunkedDecoder::Status ChunkedDecoder::feed(const char* p, std::size_t n, Sink& sink) {
  const char* const end = p + n;
  while (p < end) {
    switch (state_) {
      case State::kDone:
        return Status::kDone;
      case State::kError:
        return Status::kError;
      case State::kData: {
        const auto take = static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, end - p));
        if (!sink.on_data(std::string_view(p, take))) return Status::kStopped;
        p += take;
        remaining_ -= take;
        if (remaining_ == 0) state_ = State::kDataCr;
        break;
      }
      case State::kDataCr: {
        const char c = *p++;
        if (c == '\r') {
          state_ = State::kDataLf;
        } else if (c == '\n') {
          state_ = State::kSize;
        } else {
          return fail("chunk data not followed by CRLF");
        }
        break;
      }
      case State::kDataLf:
        if (*p++ != '\n') return fail("chunk data not followed by CRLF");
        state_ = State::kSize;
        break;
      case State::kSize:
      case State::kExtension: {
        const char c = *p++;
        if (++line_len_ > kMaxLine) return fail("chunk size line too long");
        if (c == '\n') {
          if (!size_digits_) return fail("chunk size missing");
          line_len_ = 0;
          size_digits_ = size_ended_ = false;
          if (size_ == 0) {
            state_ = State::kTrailer;
          } else {
            remaining_ = size_;
            state_ = State::kData;
          }
          size_ = 0;
        } else if (state_ == State::kExtension || c == '\r') {
          // extension text, or the CR of the line's CRLF: skipped
        } else if (c == ';') {
          state_ = State::kExtension;
        } else if (c == ' ' || c == '\t') {
          size_ended_ = size_digits_;  // whitespace may follow the size (before ';')
        } else if (const int d = hex_value(c); d >= 0 && !size_ended_) {
          size_ = size_ * 16 + static_cast<std::uint64_t>(d);
          size_digits_ = true;
          if (size_ > kMaxChunk) return fail("chunk size too large");
        } else {
          return fail("chunk size is not hexadecimal");
        }
        break;
      }
      case State::kTrailer: {
        const char c = *p++;
        if (c == '\n') {
          if (line_len_ == 0) {
            state_ = State::kDone;
            return Status::kDone;
          }
          line_len_ = 0;
        } else if (c != '\r' && ++line_len_ > kMaxLine) {
          return fail("trailer line too long");
        }
        break;
      }
    }
  }
  return state_ == State::kDone ? Status::kDone : Status::kOk;
}

}  // namespace speedmatrix
