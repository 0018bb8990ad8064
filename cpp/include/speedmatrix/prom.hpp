// Prometheus text exposition format (0.0.4) parser: enough for the /metrics
// pages of SGLang, vLLM, llama.cpp, TGI, TensorRT-LLM and LMDeploy.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace speedmatrix {

struct PromSample {
  std::string name;  // e.g. "sglang:num_running_reqs", "vllm:e2e_request_latency_seconds_bucket"
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;  // NaN / +Inf / -Inf are parsed
};

// Parses a whole page; malformed lines are skipped and counted in *bad_lines.
std::vector<PromSample> parse_prometheus(std::string_view text, int* bad_lines = nullptr);

// How the samples of one name (one per label set: tp_rank, dp_rank, engine,
// ...) become one figure. Counts (running, waiting requests) add up across
// ranks; a fraction of each rank's own pool (KV usage) does not: its maximum
// is the fullest rank.
enum class Reduce { kSum, kMax };

// For each wanted name, the reduction (by how[j]; kSum where `how` is shorter
// than `names`) of the values of all samples with that exact name. NaN samples
// are skipped; NaN when no sample with a number has that name.
std::vector<double> reduce_by_name(const std::vector<PromSample>& samples,
                                   const std::vector<std::string>& names,
                                   const std::vector<Reduce>& how = {});

// reduce_by_name with kSum for every name.
inline std::vector<double> sum_by_name(const std::vector<PromSample>& samples,
                                       const std::vector<std::string>& names) {
  return reduce_by_name(samples, names);
}

}  // namespace speedmatrix
