// What the built-in engine tells about itself: /v1/models, the server info
// endpoints, Prometheus /metrics in the profile's flavour, /sim/state and
// /sim/trace.
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "server_impl.hpp"

namespace speedmatrix::sim {

using nlohmann::json;

void Server::handle_models(evhttp_request* req) {
  json m = {{"id", prof_.model},
            {"object", "model"},
            {"created", started_unix_},
            {"owned_by", owned_by_},
            {"root", prof_.model_path},
            {"parent", nullptr},
            {"max_model_len", prof_.context_length}};
  reply_json(req, 200, json{{"object", "list"}, {"data", json::array({m})}}.dump());
}

void Server::handle_server_info(evhttp_request* req) {
  json internal = {{"max_total_num_tokens", prof_.kv_tokens},
                   {"max_running_requests", prof_.max_running},
                   {"last_gen_throughput", 0.0}};
  json j = {{"model_path", prof_.model_path},
            {"served_model_name", prof_.model},
            {"tokenizer_path", prof_.model_path},
            {"dtype", prof_.dtype},
            {"context_length", prof_.context_length},
            {"max_running_requests", prof_.max_running},
            {"max_total_num_tokens", prof_.kv_tokens},
            {"max_req_input_len", prof_.context_length - 1},
            {"page_size", prof_.block_size},
            {"chunked_prefill_size", prof_.chunk_tokens},
            {"tp_size", 1},
            {"dp_size", 1},
            {"enable_metrics", true},
            {"disable_radix_cache", !prof_.prefix_cache},
            {"internal_states", json::array({internal})},
            {"version", prof_.version},
            {"sim_profile", prof_.name},
            {"sim_flavour", prof_.flavour}};
  reply_json(req, 200, j.dump());
}

void Server::handle_metrics(evhttp_request* req) {
  EngineState st = engine_.state();
  ns_t now = clock_.now();
  double gen_tps = 0;
  std::int64_t recent = 0;
  for (auto it = engine_.trace().rbegin();
       it != engine_.trace().rend() && it->t_ns > now - 1'000'000'000; ++it)
    recent += it->batch;
  gen_tps = static_cast<double>(recent);
  std::string m;
  auto gauge = [&](const std::string& name, const std::string& labels, double v,
                   const char* type = "gauge", const char* help = "") {
    m += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + "{" +
         labels + "} ";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    m += buf;
    m += '\n';
  };
  double usage = static_cast<double>(st.kv_used_tokens) / static_cast<double>(prof_.kv_tokens);
  if (prof_.flavour == "vllm") {
    std::string l = "engine=\"0\",model_name=" + jstr(prof_.model);
    gauge("vllm:num_requests_running", l, static_cast<double>(st.running), "gauge",
          "Number of requests in model execution batches.");
    gauge("vllm:num_requests_waiting", l, static_cast<double>(st.waiting), "gauge",
          "Number of requests waiting to be processed.");
    gauge("vllm:kv_cache_usage_perc", l, usage, "gauge",
          "KV-cache usage. 1 means 100 percent usage.");
    std::string cl = "block_size=\"" + std::to_string(prof_.block_size) +
                     "\",cache_dtype=\"auto\",enable_prefix_caching=\"" +
                     (prof_.prefix_cache ? "True" : "False") + "\",engine=\"0\",num_gpu_blocks=\"" +
                     std::to_string(prof_.kv_tokens / prof_.block_size) + "\"";
    gauge("vllm:cache_config_info", cl, 1.0, "gauge", "Information of the LLMEngine CacheConfig");
    gauge("vllm:prefix_cache_queries_total", l, static_cast<double>(st.cache_query_tokens),
          "counter", "Prefix cache queries, in tokens.");
    gauge("vllm:prefix_cache_hits_total", l, static_cast<double>(st.cache_hit_tokens), "counter",
          "Prefix cache hits, in tokens.");
    gauge("vllm:prompt_tokens_total", l, static_cast<double>(st.prompt_tokens_total), "counter",
          "Number of prefill tokens processed.");
    gauge("vllm:generation_tokens_total", l, static_cast<double>(st.generation_tokens_total),
          "counter", "Number of generation tokens processed.");
    gauge("vllm:num_preemptions_total", l, 0.0, "counter", "Cumulative number of preemptions.");
    gauge("vllm:request_success_total", l + ",finished_reason=\"length\"",
          static_cast<double>(st.requests_finished - st.requests_stopped), "counter",
          "Finished requests.");
    // A second series of the same family: no second HELP/TYPE header.
    m += "vllm:request_success_total{" + l + ",finished_reason=\"stop\"} " +
         std::to_string(st.requests_stopped) + "\n";
  } else {
    std::string l =
        "model_name=" + jstr(prof_.model) + ",engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\"";
    gauge("sglang:num_running_reqs", l, static_cast<double>(st.running), "gauge",
          "The number of running requests.");
    gauge("sglang:num_queue_reqs", l, static_cast<double>(st.waiting), "gauge",
          "The number of requests in the waiting queue.");
    gauge("sglang:num_used_tokens", l, static_cast<double>(st.kv_used_tokens), "gauge",
          "The number of used tokens.");
    gauge("sglang:token_usage", l, usage, "gauge", "The token usage.");
    gauge("sglang:gen_throughput", l, gen_tps, "gauge", "The generation throughput (token/s).");
    double hit = st.cache_query_tokens ? static_cast<double>(st.cache_hit_tokens) /
                                             static_cast<double>(st.cache_query_tokens)
                                       : 0.0;
    gauge("sglang:cache_hit_rate", l, hit, "gauge", "The prefix cache hit rate.");
    gauge("sglang:max_total_num_tokens", l, static_cast<double>(prof_.kv_tokens), "gauge",
          "Maximum total number of tokens in the KV pool.");
    gauge("sglang:prompt_tokens_total", l, static_cast<double>(st.prompt_tokens_total), "counter",
          "Number of prefill tokens processed.");
    gauge("sglang:generation_tokens_total", l, static_cast<double>(st.generation_tokens_total),
          "counter", "Number of generation tokens processed.");
    gauge("sglang:num_requests_total", l, static_cast<double>(st.requests_submitted), "counter",
          "Number of requests processed.");
  }
  evkeyvalq* h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
  evbuffer* b = evbuffer_new();
  evbuffer_add(b, m.data(), m.size());
  evhttp_send_reply(req, 200, "OK", b);
  evbuffer_free(b);
}

void Server::handle_state(evhttp_request* req) {
  EngineState st = engine_.state();
  json j = {{"running", st.running},
            {"waiting", st.waiting},
            {"frontend", st.frontend},
            {"prefilling", st.prefilling},
            {"kv_used_tokens", st.kv_used_tokens},
            {"kv_reserved_tokens", st.kv_reserved_tokens},
            {"kv_cached_tokens", st.kv_cached_tokens},
            {"kv_capacity_tokens", st.kv_capacity_tokens},
            {"cache_query_tokens", st.cache_query_tokens},
            {"cache_hit_tokens", st.cache_hit_tokens},
            {"prompt_tokens_total", st.prompt_tokens_total},
            {"prefill_tokens_total", st.prefill_tokens_total},
            {"generation_tokens_total", st.generation_tokens_total},
            {"tokens_sent", tokens_sent_},
            {"requests_submitted", st.requests_submitted},
            {"requests_finished", st.requests_finished},
            {"requests_stopped", st.requests_stopped},
            {"requests_aborted", st.requests_aborted},
            {"steps", st.steps},
            {"streams_open", streams_.size()},
            {"unpaced", opt_.unpaced},
            {"stamp", opt_.stamp},
            {"now_ns", clock_.now()},
            {"profile", json::parse(profile_to_json(prof_))}};
  reply_json(req, 200, j.dump());
}

void Server::handle_trace(evhttp_request* req) {
  // GET /sim/trace[?last=N][&since_ns=T]: decode steps, oldest first.
  const char* uri = evhttp_request_get_uri(req);
  evkeyvalq q;
  std::size_t last = SIZE_MAX;
  ns_t since = -1;
  const char* qs = std::strchr(uri, '?');
  if (qs && evhttp_parse_query_str(qs + 1, &q) == 0) {
    if (const char* v = evhttp_find_header(&q, "last")) last = std::strtoull(v, nullptr, 10);
    if (const char* v = evhttp_find_header(&q, "since_ns")) since = std::strtoll(v, nullptr, 10);
    evhttp_clear_headers(&q);
  }
  const auto& tr = engine_.trace();
  std::size_t start = tr.size() > last ? tr.size() - last : 0;
  std::string out = "[";
  bool first = true;
  for (std::size_t i = start; i < tr.size(); ++i) {
    const StepRecord& r = tr[i];
    if (r.t_ns < since) continue;
    if (!first) out += ',';
    first = false;
    out += "{\"t_ns\":";
    append_int(out, r.t_ns);
    out += ",\"batch\":";
    append_int(out, r.batch);
    out += ",\"kv_tokens\":";
    append_int(out, r.kv_tokens);
    out += ",\"step_ns\":";
    append_int(out, r.step_ns);
    out += ",\"prefill_ns\":";
    append_int(out, r.prefill_ns);
    out += ",\"prefill_tokens\":";
    append_int(out, r.prefill_tokens);
    out += '}';
  }
  out += ']';
  reply_json(req, 200, out);
}

}  // namespace speedmatrix::sim
