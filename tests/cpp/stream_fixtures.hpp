// Recorded SSE streams under tests/data/streams/ and helpers to replay them
// (shared by test_sse and test_openai).
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "speedmatrix/sse.hpp"

namespace speedmatrix::testing {

inline std::string read_stream_file(const std::string& name) {
  std::ifstream in(std::string(SM_TEST_DATA_DIR) + "/streams/" + name, std::ios::binary);
  if (!in) return {};
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One dispatched event, owned.
struct OwnedEvent {
  std::string event, data, id;
  bool operator==(const OwnedEvent&) const = default;
};

class CollectingSink : public SseSink {
 public:
  bool on_event(const SseEvent& ev) override {
    events.push_back({std::string(ev.event), std::string(ev.data), std::string(ev.id)});
    return true;
  }
  std::vector<OwnedEvent> events;
};

// Replaces every line end ("\r\n", "\r" or "\n") with `eol`.
inline std::string with_line_ends(const std::string& s, const std::string& eol) {
  std::string out;
  out.reserve(s.size() * 2);
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
      out += eol;
    } else if (s[i] == '\n') {
      out += eol;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace speedmatrix::testing
