// Prints the cost of the client's hot path per event: SSE framing alone, and
// framing + OpenAI decoding, on a typical small chat chunk and a completions
// chunk with continuous usage. Times are the thread's CPU time, so that other
// load on a shared machine inflates them less. A benchmark, not a test.
#include <cstdio>
#include <string>
#include <vector>

#include "speedmatrix/clock.hpp"
#include "speedmatrix/openai.hpp"
#include "speedmatrix/sse.hpp"
#include "speedmatrix/stats.hpp"

using namespace speedmatrix;

namespace {

struct CountSink : SseSink {
  std::size_t n = 0;
  bool on_event(const SseEvent&) override {
    ++n;
    return true;
  }
};

struct DecodeSink : SseSink {
  OpenAIStreamDecoder dec{ApiKind::kChat};
  std::int64_t tokens = 0;
  bool on_event(const SseEvent& ev) override {
    tokens += dec.decode(ev.data).tokens;
    return true;
  }
};

void run(const char* name, const std::string& event, int reps) {
  std::string buf;
  for (int i = 0; i < 64; ++i) buf += event;  // one socket read carrying 64 events
  const int feeds = reps / 64;
  {
    SseParser p;
    CountSink s;
    const ns_t t0 = thread_cpu_ns();
    for (int i = 0; i < feeds; ++i) p.feed(buf, s);
    const ns_t t1 = thread_cpu_ns();
    std::printf("%-28s sse only        %7.1f ns/event\n", name, double(t1 - t0) / double(s.n));
  }
  {
    SseParser p;
    DecodeSink s;
    const ns_t t0 = thread_cpu_ns();
    for (int i = 0; i < feeds; ++i) p.feed(buf, s);
    const ns_t t1 = thread_cpu_ns();
    std::printf("%-28s sse + decode    %7.1f ns/event  (%zu bytes/event)\n", name,
                double(t1 - t0) / double(p.events()), event.size());
  }
  {
    OpenAIStreamDecoder dec(ApiKind::kChat);
    std::string data = event.substr(6, event.size() - 8);
    data.resize(data.size() + kSsePadding);
    const std::string_view view(data.data(), event.size() - 8);
    const ns_t t0 = thread_cpu_ns();
    for (int i = 0; i < reps; ++i) dec.decode(view);
    const ns_t t1 = thread_cpu_ns();
    std::printf("%-28s decode only     %7.1f ns/event\n", name, double(t1 - t0) / reps);
    // CellSpec::keep_output on: each chunk's text (and ids) unescaped and appended
    RequestOutput out;
    const ns_t k0 = thread_cpu_ns();
    for (int i = 0; i < reps; ++i) {
      if ((i & 1023) == 0) out = RequestOutput{};  // a request's worth, then the next
      dec.keep_output(&out, std::size_t{1} << 20);
      dec.decode(view);
    }
    const ns_t k1 = thread_cpu_ns();
    std::printf("%-28s decode + keep   %7.1f ns/event  (keep_output)\n", name,
                double(k1 - k0) / reps);
  }
}

}  // namespace

int main() {
  const int reps = 1 << 20;
  run("sglang chat chunk",
      "data: "
      "{\"id\":\"4a3c9e7f0b2d4c1e8f6a5b4c3d2e1f00\",\"object\":\"chat."
      "completion.chunk\","
      "\"created\":1733140001,\"model\":\"Qwen/"
      "Qwen2.5-7B-Instruct\",\"choices\":[{\"index\":0,"
      "\"delta\":{\"role\":null,\"content\":\" "
      "help\",\"reasoning_content\":null,\"tool_calls\":null},"
      "\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}],"
      "\"usage\":null}\n\n",
      reps);
  run("vllm completions + usage",
      "data: "
      "{\"id\":\"cmpl-0a1b2c3d4e5f60718293a4b5c6d7e8f9\",\"object\":\"text_"
      "completion\","
      "\"created\":1733140003,\"model\":\"meta-llama/"
      "Llama-3.1-8B\",\"choices\":[{\"index\":0,"
      "\"text\":\" "
      "four\",\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}],"
      "\"usage\":{\"prompt_tokens\":20,\"total_tokens\":21,\"completion_"
      "tokens\":1}}\n\n",
      reps);
  run("sim stamped chunk",
      "data: "
      "{\"id\":\"sim-42\",\"object\":\"text_completion\",\"model\":\"sim\","
      "\"choices\":[{\"index\":0,"
      "\"text\":\" w4\",\"finish_reason\":null}],\"sm_t_ns\":1040000000}\n\n",
      reps);
  // summarize_cell over a 30 s window: 256 streams at 50 tok/s each (384k events).
  {
    const int n_req = 256, per_s = 50, secs = 30;
    std::vector<ns_t> sent(n_req, 0), first(n_req, 20'000'000), done(n_req, kNever);
    std::vector<std::uint8_t> outcome(n_req, 2), phase(n_req, 1);
    std::vector<std::int64_t> prompt(n_req, 1024);
    std::vector<std::int32_t> ev_req, ev_tok;
    std::vector<ns_t> ev_t;
    for (int k = 0; k < per_s * secs; ++k) {
      for (int q = 0; q < n_req; ++q) {
        ev_req.push_back(q);
        ev_t.push_back(20'000'000 + static_cast<ns_t>(k) * (1'000'000'000 / per_s) + q * 1000);
        ev_tok.push_back(1 + (k % 7 == 0));
      }
    }
    RecordView v{sent, first, done, outcome, phase, prompt, ev_req, ev_t, ev_tok};
    const ns_t t0 = thread_cpu_ns();
    const CellFigures f = summarize_cell(v, 0, static_cast<ns_t>(secs) * 1'000'000'000);
    const ns_t t1 = thread_cpu_ns();
    std::printf("summarize_cell %zu events    %7.1f ms  (%.0f tok/s, tbt %.2f ms)\n", ev_t.size(),
                double(t1 - t0) / 1e6, f.total_tok_s, f.tbt_ms);
  }
  return 0;
}
