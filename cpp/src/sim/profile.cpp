// Profiles: JSON <-> Profile, with "--set key=value" overrides.
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "speedmatrix/sim.hpp"

namespace speedmatrix::sim {
namespace {

using nlohmann::json;

// Keys that document a profile and are not model parameters.
bool is_note_key(const std::string& k) {
  return k == "description" || k == "fit" || k == "notes" || (!k.empty() && k[0] == '_');
}

// Applies "a.b.c=value" to j. The value is parsed as JSON when possible.
void apply_override(json& j, const std::string& kv) {
  auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0)
    throw std::runtime_error("bad --set '" + kv + "': expected key=value");
  std::string key = kv.substr(0, eq), val = kv.substr(eq + 1);
  json v = json::parse(val, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) v = val;
  json* node = &j;
  std::size_t start = 0;
  while (true) {
    auto dot = key.find('.', start);
    std::string part =
        key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (dot == std::string::npos) {
      (*node)[part] = v;
      break;
    }
    node = &(*node)[part];
    start = dot + 1;
  }
}

template <class T>
void get(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end()) return;
  try {
    out = it->get<T>();
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("profile field '") + key + "': " + e.what());
  }
}

// Every field of a profile under its JSON name: the one list that reading, the check for
// unknown keys and for costs, and writing walk. P is Profile or const Profile.
template <class P, class F>
void for_each_field(P& p, F&& f) {
  f("name", p.name);
  f("model", p.model);
  f("model_path", p.model_path);
  f("dtype", p.dtype);
  f("flavour", p.flavour);
  f("version", p.version);
  f("mode", p.mode);
  f("context_length", p.context_length);
  f("kv_tokens", p.kv_tokens);
  f("max_running", p.max_running);
  f("block_size", p.block_size);
  f("chunk_tokens", p.chunk_tokens);
  f("default_max_tokens", p.default_max_tokens);
  f("eos_after", p.eos_after);
  f("vocab_size", p.vocab_size);
  f("prefix_cache", p.prefix_cache);
  f("step_base_ms", p.step_base_ms);
  f("step_per_seq_ms", p.step_per_seq_ms);
  f("step_per_seq2_ms", p.step_per_seq2_ms);
  f("step_per_kv_token_ns", p.step_per_kv_token_ns);
  f("step_batched_ms", p.step_batched_ms);
  f("step_per_ctx_token_ns", p.step_per_ctx_token_ns);
  f("prefill_per_token_us", p.prefill_per_token_us);
  f("prefill_per_token_ctx_ns", p.prefill_per_token_ctx_ns);
  f("prefill_chunk_overhead_ms", p.prefill_chunk_overhead_ms);
  f("frontend_overhead_ms", p.frontend_overhead_ms);
  f("frontend_per_token_us", p.frontend_per_token_us);
  f("fixed_ttft_ms", p.fixed_ttft_ms);
  f("fixed_itl_ms", p.fixed_itl_ms);
  f("trace_capacity", p.trace_capacity);
}

}  // namespace

Profile parse_profile(const std::string& text, const std::vector<std::string>& overrides) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw std::runtime_error("profile is not a JSON object");
  for (const auto& o : overrides) apply_override(j, o);
  Profile p;
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = is_note_key(it.key());
    for_each_field(p, [&](const char* k, const auto&) { known = known || it.key() == k; });
    if (!known) throw std::runtime_error("unknown profile field '" + it.key() + "'");
  }
  for_each_field(p, [&](const char* k, auto& v) { get(j, k, v); });
  if (p.model_path.empty()) p.model_path = p.model;
  if (p.flavour != "sglang" && p.flavour != "vllm")
    throw std::runtime_error("flavour must be 'sglang' or 'vllm', not '" + p.flavour + "'");
  if (p.mode != "batched" && p.mode != "fixed")
    throw std::runtime_error("mode must be 'batched' or 'fixed', not '" + p.mode + "'");
  if (p.context_length <= 0 || p.kv_tokens <= 0 || p.max_running <= 0 || p.block_size <= 0 ||
      p.chunk_tokens <= 0 || p.vocab_size <= 0 || p.trace_capacity <= 0)
    throw std::runtime_error("profile sizes must be positive");
  if (p.eos_after < 0)
    throw std::runtime_error("eos_after must be 0 (never) or a number of tokens");
  // A negative cost would schedule steps in the past (a pace the tests then trust); the
  // costs are the profile's floating-point fields.
  for_each_field(p, [](const char* name, const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, double>) {
      if (!std::isfinite(v) || v < 0 || v > 3.6e6)
        throw std::runtime_error(std::string(name) + " must be a number from 0 to 3600000, not " +
                                 std::to_string(v));
    }
  });
  return p;
}

Profile load_profile(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read profile " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_profile(ss.str(), overrides);
}

std::string profile_to_json(const Profile& p) {
  json j = json::object();
  for_each_field(p, [&](const char* k, const auto& v) { j[k] = v; });
  return j.dump();
}

}  // namespace speedmatrix::sim
