#include "speedmatrix/sse.hpp"

#include <algorithm>
#include <cstring>

namespace speedmatrix {
namespace {

// A line may be longer than the event's data only by its field name and
// colon; anything beyond this is counted as too large before it is buffered.
constexpr std::size_t kLineOverhead = 256;

bool field_is(const char* p, std::size_t n, const char* name, std::size_t name_len) {
  return n == name_len && std::memcmp(p, name, n) == 0;
}

}  // namespace

SseParser::SseParser(std::size_t max_event_bytes) : max_event_bytes_(max_event_bytes) {
  data_.resize(kSsePadding + 1024);
}

void SseParser::reset() {
  line_.clear();
  data_len_ = 0;
  event_.clear();
  id_.clear();
  have_data_ = pending_ = last_was_cr_ = too_large_ = false;
  events_ = comments_ = 0;
}

bool SseParser::has_partial() const noexcept { return !line_.empty() || pending_; }

SseParser::Step SseParser::dispatch(SseSink& sink) {
  const bool have_data = have_data_;
  have_data_ = pending_ = false;
  if (!have_data) {  // WHATWG: an event without data is dropped, its type reset
    event_.clear();
    return Step::kOk;
  }
  SseEvent ev{event_, std::string_view(data_.data(), data_len_), id_};
  ++events_;
  const bool go_on = sink.on_event(ev);
  data_len_ = 0;
  event_.clear();
  return go_on ? Step::kOk : Step::kStopped;
}

SseParser::Step SseParser::process_line(const char* p, std::size_t n, SseSink& sink) {
  if (n == 0) return dispatch(sink);
  if (p[0] == ':') {
    ++comments_;
    return Step::kOk;
  }
  const char* colon = static_cast<const char*>(std::memchr(p, ':', n));
  const std::size_t name_len = colon ? static_cast<std::size_t>(colon - p) : n;
  const char* value = colon ? colon + 1 : p + n;
  std::size_t value_len = static_cast<std::size_t>(p + n - value);
  if (value_len > 0 && *value == ' ') {
    ++value;
    --value_len;
  }
  if (field_is(p, name_len, "data", 4)) {
    const std::size_t sep = have_data_ ? 1 : 0;
    const std::size_t len = data_len_ + sep + value_len;
    if (len > max_event_bytes_) return Step::kTooLarge;
    if (data_.size() < len + kSsePadding) {
      data_.resize(std::max(len + kSsePadding, data_.size() * 2));
    }
    if (sep) data_[data_len_] = '\n';
    std::memcpy(data_.data() + data_len_ + sep, value, value_len);
    data_len_ = len;
    have_data_ = pending_ = true;
  } else if (field_is(p, name_len, "event", 5)) {
    event_.assign(value, value_len);
    pending_ = true;
  } else if (field_is(p, name_len, "id", 2)) {
    if (std::memchr(value, '\0', value_len) == nullptr) id_.assign(value, value_len);
    pending_ = true;
  }
  // "retry" and unknown fields are ignored, as WHATWG says.
  return Step::kOk;
}

SseStatus SseParser::feed(const char* bytes, std::size_t n, SseSink& sink) {
  if (too_large_) return SseStatus::kEventTooLarge;
  const char* p = bytes;
  const char* const end = bytes + n;
  if (last_was_cr_ && p < end) {  // "\r" | "\n" split across two feeds is one line end
    last_was_cr_ = false;
    if (*p == '\n') ++p;
  }
  // Next '\n' and '\r' at or after p (nullptr: none before end). Each is
  // searched again only once p has passed it, so framing stays linear even for
  // streams that use bare '\r'.
  const char* nl = nullptr;
  const char* cr = nullptr;
  bool nl_valid = false, cr_valid = false;
  while (p < end) {
    if (!nl_valid || (nl && nl < p)) {
      nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)));
      nl_valid = true;
    }
    if (!cr_valid || (cr && cr < p)) {
      cr = static_cast<const char*>(std::memchr(p, '\r', static_cast<std::size_t>(end - p)));
      cr_valid = true;
    }
    const char* eol = !cr ? nl : (!nl ? cr : std::min(nl, cr));
    if (eol == nullptr) {
      const std::size_t rest = static_cast<std::size_t>(end - p);
      if (line_.size() + rest > max_event_bytes_ + kLineOverhead) {
        too_large_ = true;
        return SseStatus::kEventTooLarge;
      }
      line_.append(p, rest);
      break;
    }
    const char* next;
    if (*eol == '\r') {
      if (eol + 1 < end) {
        next = eol + (eol[1] == '\n' ? 2 : 1);
      } else {
        next = end;
        last_was_cr_ = true;
      }
    } else {
      next = eol + 1;
    }
    Step step;
    if (line_.empty()) {
      step = process_line(p, static_cast<std::size_t>(eol - p), sink);
    } else {
      if (line_.size() + static_cast<std::size_t>(eol - p) > max_event_bytes_ + kLineOverhead) {
        too_large_ = true;
        return SseStatus::kEventTooLarge;
      }
      line_.append(p, static_cast<std::size_t>(eol - p));
      step = process_line(line_.data(), line_.size(), sink);
      line_.clear();
    }
    p = next;
    if (step == Step::kStopped) return SseStatus::kStopped;
    if (step == Step::kTooLarge) {
      too_large_ = true;
      return SseStatus::kEventTooLarge;
    }
  }
  return SseStatus::kOk;
}

}  // namespace speedmatrix
