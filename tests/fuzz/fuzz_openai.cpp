// libFuzzer target: a hostile SSE stream through the SSE parser into the OpenAI stream
// decoder (both APIs), as a cell's stream goes; and the error-body parser. Checks: no crash,
// counts never negative, error messages kept to one line of at most 500 bytes.
#include <cstdlib>

#include "fuzz_common.hpp"
#include "speedmatrix/openai.hpp"
#include "speedmatrix/sse.hpp"

namespace {

struct Sink : speedmatrix::SseSink {
  speedmatrix::OpenAIStreamDecoder* dec;
  bool on_event(const speedmatrix::SseEvent& ev) override {
    auto r = dec->decode(ev.data);
    if (r.tokens < 0) std::abort();
    return true;
  }
};

void check(const speedmatrix::StreamSummary& s) {
  if (s.output_tokens < 0 || s.chunk_tokens < 0) std::abort();
  if (s.error_message.size() > 500 || s.error_message.find('\n') != std::string::npos) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  auto api = (data[0] & 1) ? speedmatrix::ApiKind::kChat : speedmatrix::ApiKind::kCompletions;
  auto [a, b] = speedmatrix::fuzz::split(data, size);
  speedmatrix::OpenAIStreamDecoder dec(api);
  speedmatrix::SseParser p(1 << 16);
  Sink sink;
  sink.dec = &dec;
  p.feed(a, sink);
  p.feed(b, sink);
  check(dec.summary());
  // The same bytes as one event's payload, and as a non-streaming error body.
  speedmatrix::OpenAIStreamDecoder whole(api);
  whole.decode_copy(std::string_view(reinterpret_cast<const char*>(data), size));
  check(whole.summary());
  auto msg = speedmatrix::error_message_from_body(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (msg.size() > 500 || msg.find('\n') != std::string::npos) std::abort();
  return 0;
}
