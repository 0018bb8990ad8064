// libFuzzer target: the SSE parser fed a hostile stream in two pieces. Checks: no crash, no
// leak, no read out of bounds (ASan), the padding promise of SseEvent::data, and the event
// size bound.
#include <cstdlib>
#include <string>

#include "fuzz_common.hpp"
#include "speedmatrix/sse.hpp"

namespace {

constexpr std::size_t kMaxEvent = 4096;

struct Sink : speedmatrix::SseSink {
  std::size_t n = 0;
  bool on_event(const speedmatrix::SseEvent& ev) override {
    if (ev.data.size() > kMaxEvent) std::abort();  // the bound was not kept
    // SseEvent::data promises kSsePadding readable bytes after it: touch them (ASan checks).
    volatile char sink = 0;
    for (std::size_t i = 0; i < speedmatrix::kSsePadding; ++i)
      sink = static_cast<char>(sink ^ ev.data.data()[ev.data.size() + i]);
    (void)sink;
    return ++n < 10000;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto [a, b] = speedmatrix::fuzz::split(data, size);
  speedmatrix::SseParser p(kMaxEvent);
  Sink sink;
  if (p.feed(a, sink) == speedmatrix::SseStatus::kEventTooLarge) {
    p.reset();
  }
  p.feed(b, sink);
  (void)p.has_partial();
  return 0;
}
