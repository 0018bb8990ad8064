// libFuzzer target: a hostile /metrics page through the Prometheus text parser and the
// per-name reduction the sampler uses. Checks: no crash, bad lines counted, not thrown.
#include <string>
#include <vector>

#include "speedmatrix/prom.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  int bad = 0;
  auto samples = speedmatrix::parse_prometheus(text, &bad);
  std::vector<std::string> names = {"sglang:num_running_reqs", "vllm:num_requests_waiting"};
  for (std::size_t i = 0; i < samples.size() && i < 4; ++i) names.push_back(samples[i].name);
  auto v = speedmatrix::reduce_by_name(samples, names,
                                       {speedmatrix::Reduce::kSum, speedmatrix::Reduce::kMax});
  return v.size() == names.size() ? 0 : 1;
}
