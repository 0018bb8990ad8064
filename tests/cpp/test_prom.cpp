// Prometheus text parser: real /metrics excerpts of SGLang, vLLM, llama.cpp,
// TGI and TRT-LLM, the syntax corners of the exposition format, broken lines,
// and summing over labels.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "speedmatrix/prom.hpp"

namespace speedmatrix {
namespace {

const char* kSglang =
    R"(# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"} 12.0
sglang:num_running_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="1"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"} 3.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"} 0.41
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="Qwen/Qwen2.5-7B-Instruct"} 5.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="Qwen/Qwen2.5-7B-Instruct"} 9.0
sglang:time_to_first_token_seconds_sum{model_name="Qwen/Qwen2.5-7B-Instruct"} 1.25
sglang:time_to_first_token_seconds_count{model_name="Qwen/Qwen2.5-7B-Instruct"} 9.0
)";

const char* kVllm =
    R"(# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0625
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="27235",prefix_caching_hash_algo="builtin"} 1.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.234567e+06
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
process_start_time_seconds 1.73314e+09
)";

const char* kLlamacpp =
    "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
    "# TYPE llamacpp:prompt_tokens_total counter\n"
    "llamacpp:prompt_tokens_total 1024\n"
    "# HELP llamacpp:requests_processing Number of requests processing.\n"
    "# TYPE llamacpp:requests_processing gauge\n"
    "llamacpp:requests_processing 2\n"
    "llamacpp:requests_deferred 0\n"
    "llamacpp:predicted_tokens_seconds 61.5\n";

const char* kTgi =
    "# TYPE tgi_queue_size gauge\r\n"
    "tgi_queue_size 7\r\n"
    "# TYPE tgi_batch_current_size gauge\r\n"
    "tgi_batch_current_size 32\r\n"
    "tgi_request_duration_bucket{le=\"0.5\"} 3\r\n";

TEST(Prom, SglangPageWithRanksSummed) {
  int bad = -1;
  auto s = parse_prometheus(kSglang, &bad);
  EXPECT_EQ(bad, 0);
  ASSERT_EQ(s.size(), 8u);
  EXPECT_EQ(s[0].name, "sglang:num_running_reqs");
  ASSERT_EQ(s[0].labels.size(), 4u);
  EXPECT_EQ(s[0].labels[3], (std::pair<std::string, std::string>{"tp_rank", "0"}));
  EXPECT_EQ(s[0].labels[1].second, "Qwen/Qwen2.5-7B-Instruct");
  EXPECT_EQ(s[5].labels[0].second, "+Inf");
  auto v = sum_by_name(s, {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                           "sglang:gen_throughput", "sglang:time_to_first_token_seconds_count"});
  EXPECT_DOUBLE_EQ(v[0], 24.0);
  EXPECT_DOUBLE_EQ(v[1], 3.0);
  EXPECT_DOUBLE_EQ(v[2], 0.41);
  EXPECT_TRUE(std::isnan(v[3]));
  EXPECT_DOUBLE_EQ(v[4], 9.0);
}

TEST(Prom, VllmPageAndCacheConfigLabels) {
  int bad = -1;
  auto s = parse_prometheus(kVllm, &bad);
  EXPECT_EQ(bad, 0);
  ASSERT_EQ(s.size(), 8u);
  auto v = sum_by_name(s, {"vllm:num_requests_running", "vllm:generation_tokens_total",
                           "process_start_time_seconds"});
  EXPECT_DOUBLE_EQ(v[0], 9.0);
  EXPECT_DOUBLE_EQ(v[1], 1234567.0);
  EXPECT_DOUBLE_EQ(v[2], 1.73314e9);
  const PromSample& cc = s[4];
  EXPECT_EQ(cc.name, "vllm:cache_config_info");
  std::string blocks, bs;
  for (auto& [k, val] : cc.labels) {
    if (k == "num_gpu_blocks") blocks = val;
    if (k == "block_size") bs = val;
  }
  EXPECT_EQ(blocks, "27235");
  EXPECT_EQ(bs, "16");
}

TEST(Prom, LlamacppUnlabelledAndTgiCrlf) {
  int bad = -1;
  auto s = parse_prometheus(kLlamacpp, &bad);
  EXPECT_EQ(bad, 0);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_TRUE(s[1].labels.empty());
  EXPECT_DOUBLE_EQ(sum_by_name(s, {"llamacpp:requests_processing"})[0], 2.0);
  auto t = parse_prometheus(kTgi, &bad);
  EXPECT_EQ(bad, 0);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_DOUBLE_EQ(sum_by_name(t, {"tgi_queue_size"})[0], 7.0);
  EXPECT_EQ(t[2].labels[0].second, "0.5");
}

struct LineCase {
  const char* name;
  std::string line;
  bool ok;
  const char* metric;
  double value;  // NaN: expect NaN
  std::vector<std::pair<std::string, std::string>> labels;
};

const double kNan = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

const LineCase kLines[] = {
    {"plain", "a 1", true, "a", 1, {}},
    {"colon_name", "ns:sub:metric_total 2.5", true, "ns:sub:metric_total", 2.5, {}},
    {"empty_braces", "a{} 3", true, "a", 3, {}},
    {"timestamp", "a{x=\"1\"} 4 1733140000000", true, "a", 4, {{"x", "1"}}},
    {"negative_timestamp", "a 4 -5", true, "a", 4, {}},
    {"nan", "a NaN", true, "a", kNan, {}},
    {"plus_inf", "a +Inf", true, "a", kInf, {}},
    {"minus_inf", "a -Inf", true, "a", -kInf, {}},
    {"lower_inf", "a inf", true, "a", kInf, {}},
    {"exponent", "a 1.5e-3", true, "a", 1.5e-3, {}},
    {"negative", "a -2", true, "a", -2, {}},
    {"plus_sign", "a +2", true, "a", 2, {}},
    {"escaped_quote", R"(a{p="say \"hi\""} 1)", true, "a", 1, {{"p", "say \"hi\""}}},
    {"escaped_backslash_and_newline",
     R"(a{p="c:\\dir\nx"} 1)",
     true,
     "a",
     1,
     {{"p", "c:\\dir\nx"}}},
    {"comma_and_brace_in_value",
     R"(a{p="x,y}z",q="2"} 1)",
     true,
     "a",
     1,
     {{"p", "x,y}z"}, {"q", "2"}}},
    {"trailing_comma", R"(a{p="1",} 1)", true, "a", 1, {{"p", "1"}}},
    {"spaces_around", "  a { p = \"1\" , q=\"2\" }\t7  ", true, "a", 7, {{"p", "1"}, {"q", "2"}}},
    {"empty_label_value", R"(a{p=""} 1)", true, "a", 1, {{"p", ""}}},
    {"no_value", "a", false, "", 0, {}},
    {"no_value_labels", R"(a{p="1"})", false, "", 0, {}},
    {"bad_value", "a one", false, "", 0, {}},
    {"double_sign", "a +-1", false, "", 0, {}},
    {"bad_timestamp", "a 1 soon", false, "", 0, {}},
    {"extra_field", "a 1 2 3", false, "", 0, {}},
    {"unterminated_label", R"(a{p="1} 1)", false, "", 0, {}},
    {"label_without_quotes", "a{p=1} 1", false, "", 0, {}},
    {"digit_first_name", "1a 1", false, "", 0, {}},
    {"label_missing_comma", R"(a{p="1" q="2"} 1)", false, "", 0, {}},
};

class PromLine : public ::testing::TestWithParam<LineCase> {};

TEST_P(PromLine, Parses) {
  const LineCase& c = GetParam();
  int bad = -1;
  auto s = parse_prometheus(c.line + "\n", &bad);
  if (!c.ok) {
    EXPECT_EQ(bad, 1);
    EXPECT_TRUE(s.empty());
    return;
  }
  EXPECT_EQ(bad, 0);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].name, c.metric);
  if (std::isnan(c.value))
    EXPECT_TRUE(std::isnan(s[0].value));
  else
    EXPECT_DOUBLE_EQ(s[0].value, c.value);
  EXPECT_EQ(s[0].labels, c.labels);
}

INSTANTIATE_TEST_SUITE_P(Lines, PromLine, ::testing::ValuesIn(kLines),
                         [](const ::testing::TestParamInfo<LineCase>& info) {
                           return info.param.name;
                         });

TEST(Prom, BadLinesAreSkippedAndCountedOthersKept) {
  int bad = -1;
  auto s = parse_prometheus("a 1\ngarbage here now\n# comment\n\n   \nb{x=\"1\"} 2\nc", &bad);
  EXPECT_EQ(bad,
            2);  // "garbage here now" and "c" (no trailing newline, no value)
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[1].name, "b");
  EXPECT_TRUE(parse_prometheus("").empty());
}

TEST(Prom, SumByNameSkipsNanAndRepeatsNames) {
  auto s = parse_prometheus("a{r=\"0\"} 1\na{r=\"1\"} NaN\na{r=\"2\"} 2\nb NaN\n");
  auto v = sum_by_name(s, {"a", "b", "a", "missing"});
  EXPECT_DOUBLE_EQ(v[0], 3.0);
  EXPECT_TRUE(std::isnan(v[1]));
  EXPECT_DOUBLE_EQ(v[2], 3.0);
  EXPECT_TRUE(std::isnan(v[3]));
  EXPECT_TRUE(sum_by_name(s, {}).empty());
}

TEST(Prom, ReduceByNameTakesTheFullestRankForFractions) {
  // Two data-parallel ranks, each with its own KV pool: usage 0.9 and 0.5.
  // Requests add up across ranks; a fraction of each rank's pool does not.
  auto s = parse_prometheus(
      "sglang:token_usage{dp_rank=\"0\"} 0.9\nsglang:token_usage{dp_rank=\"1\"} 0.5\n"
      "sglang:num_running_reqs{dp_rank=\"0\"} 3\nsglang:num_running_reqs{dp_rank=\"1\"} 4\n"
      "neg{r=\"0\"} -2\nneg{r=\"1\"} -5\n");
  auto v = reduce_by_name(s, {"sglang:token_usage", "sglang:num_running_reqs", "neg", "missing"},
                          {Reduce::kMax, Reduce::kSum, Reduce::kMax, Reduce::kMax});
  EXPECT_DOUBLE_EQ(v[0], 0.9);
  EXPECT_DOUBLE_EQ(v[1], 7.0);
  EXPECT_DOUBLE_EQ(v[2], -2.0);  // the maximum, not 0 from an initial value
  EXPECT_TRUE(std::isnan(v[3]));
  // `how` shorter than `names`: the rest are summed.
  auto w = reduce_by_name(s, {"sglang:num_running_reqs", "sglang:token_usage"}, {Reduce::kMax});
  EXPECT_DOUBLE_EQ(w[0], 4.0);
  EXPECT_DOUBLE_EQ(w[1], 1.4);
}

}  // namespace
}  // namespace speedmatrix
