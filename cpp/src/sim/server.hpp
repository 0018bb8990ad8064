// The built-in engine's HTTP server (libevent evhttp, one event loop).
#pragma once

#include <cstdint>
#include <string>

#include "speedmatrix/sim.hpp"

namespace speedmatrix::sim {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = pick a free port
  Profile profile;
  bool unpaced = false;  // emit tokens as fast as the sockets take them
  bool stamp = false;    // add "sm_t_ns" (CLOCK_MONOTONIC send time) to every chunk
  // Shares of requests (0..1) given each fault at random; deterministic by seed.
  double fault_http500 = 0, fault_malformed = 0, fault_drop = 0, fault_stall = 0;
  std::uint64_t seed = 1;
  // Exit when stdin reaches end of file: a parent that holds the pipe's other end
  // (speedmatrix.sim.Sim) takes the engine down with it even when it is killed.
  bool watch_stdin = false;
  // When set, every API path (all but /health, /ping, /metrics, /version and /sim/*, as
  // vLLM and SGLang leave open) wants "Authorization: Bearer <api_key>"; others get 401.
  std::string api_key;
  // Reasoning mode (chat only; /v1/completions has no reasoning channel): a reply's first
  // min(reasoning_tokens, output - 1) tokens are reasoning, streamed as
  // delta.reasoning_content and reported as usage.completion_tokens_details.reasoning_tokens
  // (counted in completion_tokens, as every server does). reasoning_hidden: generated and
  // reported, never streamed (the first visible chunk follows the silence they take).
  std::int64_t reasoning_tokens = 0;
  bool reasoning_hidden = false;
};

// Runs until SIGTERM/SIGINT. Prints "speedmatrix-sim listening on HOST:PORT" to
// stdout once accepting. Returns the process exit status.
int run_server(const ServerOptions& opts);

}  // namespace speedmatrix::sim
