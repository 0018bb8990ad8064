// The built-in engine's model: a simulated LLM inference engine with
// continuous batching, driven by an injectable clock. Pure: no I/O; the HTTP
// server (cpp/src/sim/server.cpp) feeds it requests and writes the tokens it
// emits. All times are CLOCK_MONOTONIC-style nanoseconds on the given clock.
//
// Timeline of one request in "batched" mode:
//   arrival --overhead (parallel)--> front-end (serial FIFO, cost per prompt
//   token) --> waiting queue (FIFO) --admission: running cap and KV pool-->
//   prefill of the uncached prompt tokens, in chunks, one chunk per engine
//   iteration --> first token at the end of its last chunk --> one token per
//   decode step, shared by the whole running batch --> finish at max_tokens, or
//   earlier at end-of-sequence (RequestSpec::eos_at).
// An engine iteration is [prefill chunk (if any)] then [decode step (if any)],
// so a long prefill delays the batch's next step, as in a chunked-prefill engine.
// Iterations follow each other on absolute model time (no drift): the next one
// starts exactly when the previous one ends, whatever the caller's latency.
//
// "fixed" mode ignores batching: token k of a request leaves at
// arrival + ttft + k * itl exactly.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "speedmatrix/clock.hpp"

namespace speedmatrix::sim {

// A profile: the data that describes one simulated engine. Loaded from JSON
// (python/speedmatrix/profiles/*.json); field names below are the JSON keys.
struct Profile {
  std::string name = "custom";
  std::string model = "sim-model";
  std::string model_path;              // what the server says it loaded ("" = the model name)
  std::string dtype = "auto";          // SGLang /server_info "dtype" (e.g. "bfloat16")
  std::string flavour = "sglang";      // "sglang" | "vllm": metric names, owned_by
  std::string version = "0.0.0-sim";   // reported by /version and /server_info
  std::string mode = "batched";        // "batched" | "fixed"
  std::int64_t context_length = 8192;  // max prompt + output tokens per request
  std::int64_t kv_tokens = 65536;      // KV pool in tokens (max_total_num_tokens)
  std::int32_t max_running = 64;       // cap on admitted (prefilling + decoding) requests
  std::int32_t block_size = 16;        // prefix-cache block and vLLM KV block, tokens
  std::int64_t chunk_tokens = 8192;    // chunked-prefill chunk size, tokens
  std::int64_t default_max_tokens = 16;
  // The model emits end-of-sequence after this many output tokens, ending a request
  // that does not set ignore_eos before its max_tokens (finish_reason "stop"), as a
  // real model ends its answer; a request's min_tokens holds EOS back. 0 = never:
  // every request runs to max_tokens, ignore_eos or not.
  std::int64_t eos_after = 0;
  std::int64_t vocab_size = 151936;
  bool prefix_cache = true;
  // Decode step (ms) = base + per_seq * b + per_seq2 * b^2 + per_kv_token * kv
  // (+ batched when b >= 2) + per_ctx_token * kv / b, b = sequences in the step, kv =
  // tokens they attend (prompt + generated). `step_batched_ms` is a backend whose
  // one-sequence path is faster than its batched one (llama.cpp on a CPU: a step of 2
  // costs ~2.7x a step of 1). `step_per_ctx_token_ns` is a cost paid once per step per
  // token of the batch's mean context, not once per sequence (llama.cpp on a CPU: a step
  // of 4 sequences at 1,920 tokens costs ~6 ms more than at 128, as does a step of 1).
  double step_base_ms = 16.0;
  double step_per_seq_ms = 0.0;
  double step_per_seq2_ms = 0.0;
  double step_per_kv_token_ns = 0.0;
  double step_batched_ms = 0.0;
  double step_per_ctx_token_ns = 0.0;
  // Prefill: a token at position p costs prefill_per_token_us µs plus
  // prefill_per_token_ctx_ns ns per 1000 tokens of context before it (p / 1000),
  // so the rate falls with context. Plus a fixed cost per chunk.
  double prefill_per_token_us = 100.0;
  double prefill_per_token_ctx_ns = 0.0;
  double prefill_chunk_overhead_ms = 0.0;
  // Front-end: fixed latency (parallel) then a serial cost per prompt token
  // (request parsing, tokenization, cache lookup: one request at a time).
  double frontend_overhead_ms = 0.0;
  double frontend_per_token_us = 0.0;
  // "fixed" mode
  double fixed_ttft_ms = 50.0;
  double fixed_itl_ms = 20.0;
  std::int32_t trace_capacity = 8192;  // decode steps kept for /sim/trace
};

// Parses a profile from JSON text, applying "key=value" overrides first
// (value parsed as JSON when it is valid JSON, else taken as a string).
// Throws std::runtime_error naming the bad key or value.
Profile parse_profile(const std::string& json_text, const std::vector<std::string>& overrides = {});
Profile load_profile(const std::string& path, const std::vector<std::string>& overrides = {});
// The profile as JSON text (every field), for /sim/state and tests.
std::string profile_to_json(const Profile& p);

// Model costs, exposed for tests and the fitting script.
ns_t decode_step_ns(const Profile& p, std::int64_t batch, std::int64_t kv_tokens);
// Prefill of n tokens at positions [pos, pos + n).
ns_t prefill_ns(const Profile& p, std::int64_t pos, std::int64_t n);

using RequestId = std::uint64_t;

struct RequestSpec {
  RequestId id = 0;
  std::int64_t prompt_tokens = 0;
  std::int64_t max_tokens = 16;
  // Chained hashes of the prompt's full blocks (block_size tokens each); the
  // prefix cache matches on them. Empty = nothing cacheable.
  std::vector<std::uint64_t> block_hashes;
  // The chain continued over the tokens it will generate: the full blocks of prompt +
  // output past the prompt's. A finished request leaves them in the prefix cache as vLLM
  // and SGLang do, so a conversation's next turn finds its prompt and its answer there.
  std::vector<std::uint64_t> output_block_hashes;
  // A what-if shortcut for warm-ups (body field "sm_prefill_free"): the request
  // costs no front-end or prefill time but fills the prefix cache as usual.
  bool free_prefill = false;
  // The request ends at end-of-sequence after this many output tokens when that
  // comes before max_tokens. 0 = no EOS (ignore_eos, or a profile without eos_after).
  // KV is still reserved for max_tokens at admission: the engine cannot know in advance.
  std::int64_t eos_at = 0;
};

// Output tokens a request produces: max_tokens, or fewer when EOS comes first.
inline std::int64_t output_tokens(const RequestSpec& s) {
  return s.eos_at > 0 && s.eos_at < s.max_tokens ? s.eos_at : s.max_tokens;
}

enum class EventKind : std::uint8_t {
  kToken = 0,     // the request's next token left at t_ns
  kFinished = 1,  // its last token left at t_ns (max_tokens or EOS reached): it is done
};

struct Event {
  RequestId id;
  EventKind kind;
  ns_t t_ns;                   // model time of the event
  std::int64_t generated;      // tokens generated so far, this event included
  std::int64_t cached_tokens;  // prompt tokens served from the prefix cache
};

struct StepRecord {
  ns_t t_ns;  // end of the step: when its tokens leave
  std::int32_t batch;
  std::int64_t kv_tokens;
  ns_t step_ns;     // decode part of the iteration
  ns_t prefill_ns;  // prefill chunk run before it in the same iteration (0 if none)
  std::int64_t prefill_tokens;
};

struct EngineState {
  std::int64_t frontend = 0;  // in the front-end (not yet queued)
  std::int64_t waiting = 0;   // FIFO waiting queue
  std::int64_t prefilling = 0;
  std::int64_t running = 0;             // admitted: prefilling + decoding
  std::int64_t kv_used_tokens = 0;      // prompt + generated of admitted requests
  std::int64_t kv_reserved_tokens = 0;  // prompt + max_tokens of admitted requests
  std::int64_t kv_cached_tokens = 0;    // evictable prefix-cache blocks, tokens
  std::int64_t kv_capacity_tokens = 0;
  std::int64_t cache_query_tokens = 0;  // prompt tokens looked up in the cache
  std::int64_t cache_hit_tokens = 0;
  std::int64_t prompt_tokens_total = 0;   // prompt tokens of admitted requests
  std::int64_t prefill_tokens_total = 0;  // prompt tokens actually computed
  std::int64_t generation_tokens_total = 0;
  std::int64_t requests_submitted = 0;
  std::int64_t requests_finished = 0;
  std::int64_t requests_stopped = 0;  // of requests_finished: ended at EOS before max_tokens
  std::int64_t requests_aborted = 0;
  std::int64_t steps = 0;
};

class Engine {
 public:
  Engine(Profile profile, Clock& clock);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Checks a request against the profile before submit. Returns "" when it can
  // run, else an error message (mentions "context length" when too long).
  std::string validate(std::int64_t prompt_tokens, std::int64_t max_tokens) const;

  // Submits at clock.now(). REQUIRES: a fresh id.
  void submit(const RequestSpec& spec);
  // Removes the request wherever it is and frees its KV at once. Unknown id: no-op.
  void abort(RequestId id);

  // Drops every prefix-cache block no running request holds (SGLang /flush_cache,
  // vLLM /reset_prefix_cache). Returns the tokens dropped.
  std::int64_t flush_cache();

  // Runs the model up to clock.now(); appends the events that happened, in time order.
  void advance(std::vector<Event>& out);
  // Absolute time of the next event that advance() would produce, kNever when idle.
  ns_t next_deadline() const;

  EngineState state() const;
  const std::deque<StepRecord>& trace() const;
  const Profile& profile() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The deterministic vocabulary: token id <-> word. Every id has a word made of
// lowercase letters (bijective base-26 of id + 1); a word that is not the
// image of an id maps to a hash of itself modulo vocab_size.
std::string token_word(std::uint64_t id);
std::uint64_t word_token(const char* s, std::size_t n, std::int64_t vocab_size);
// Chained block hashes for a prompt given as token ids.
std::vector<std::uint64_t> block_hashes(const std::vector<std::uint64_t>& ids, std::int32_t block);

}  // namespace speedmatrix::sim
