// The built-in engine's HTTP side: one libevent loop, evhttp for HTTP/1.1, a
// timer that fires at the engine model's next absolute deadline, chunked
// streaming replies and disconnect detection (close -> abort).
//
// The per-token path builds each chunk from a per-request preformatted prefix
// and suffix with plain appends (no JSON library), so one core can emit more
// than a million tokens per second in unpaced mode.
#include "server.hpp"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <simdjson.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace speedmatrix::sim {
namespace {

using nlohmann::json;

class Server;
Server* g_server = nullptr;  // the process's only server, for libevent's C callbacks

enum class Fault : std::uint8_t {
  kNone,
  kHttp500,
  kMalformed,
  kDrop,
  kStall,
  kNotSse,
  kNoDone,
  kErrorEvent,
  kHttp429,  // 429 Too Many Requests with "Retry-After: 1" (per request only)
};

bool parse_fault(const std::string& s, Fault& f) {
  static const std::pair<const char*, Fault> kNames[] = {
      {"none", Fault::kNone},           {"http_500", Fault::kHttp500},
      {"malformed", Fault::kMalformed}, {"drop", Fault::kDrop},
      {"stall", Fault::kStall},         {"not_sse", Fault::kNotSse},
      {"no_done", Fault::kNoDone},      {"error_event", Fault::kErrorEvent},
      {"http_429", Fault::kHttp429}};
  for (auto& [n, v] : kNames)
    if (s == n) {
      f = v;
      return true;
    }
  return false;
}

void append_int(std::string& out, std::int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

// JSON string escaping for the (rare) non-hot-path fields we echo.
std::string jstr(const std::string& s) { return json(s).dump(); }

struct Stream {
  RequestId id = 0;
  evhttp_request* req = nullptr;
  evhttp_connection* conn = nullptr;
  bool chat = false, streaming = true, include_usage = false, continuous_usage = false;
  std::int64_t prompt_tokens = 0, max_tokens = 0, cached = 0;
  std::int64_t out_tokens = 0;  // tokens the reply carries: max_tokens, or fewer at EOS
  std::int64_t sent = 0;        // tokens written
  Fault fault = Fault::kNone;
  std::int64_t fault_at = 1;  // the fault fires after this many tokens
  bool stalled = false;
  bool in_engine = false;
  std::string head;      // 'data: {"id":...,"choices":[{"index":0,"text":"' (or delta content)
  std::string tail;      // '","logprobs":null,"finish_reason":'
  std::string obj_head;  // '{"id":"...","object":"...","created":N,"model":"..."'
};

class Server {
 public:
  explicit Server(const ServerOptions& o)
      : opt_(o), prof_(o.profile), engine_(o.profile, clock_), rng_(o.seed) {
    words_.reserve(kWords);
    for (int i = 0; i < kWords; ++i)
      words_.push_back(
          " " + token_word(static_cast<std::uint64_t>((i * 2654435761ULL) % prof_.vocab_size)));
    owned_by_ = prof_.flavour;
  }

  int run();

 private:
  static constexpr int kWords = 1024;
  ServerOptions opt_;
  Profile prof_;
  SystemClock clock_;
  Engine engine_;
  std::mt19937_64 rng_;
  std::vector<std::string> words_;
  std::string owned_by_;
  event_base* base_ = nullptr;
  evhttp* http_ = nullptr;
  event* timer_ = nullptr;
  std::unordered_map<RequestId, Stream> streams_;
  RequestId next_id_ = 1;
  std::vector<Event> events_;
  std::string scratch_;
  evbuffer* out_ = nullptr;
  std::int64_t tokens_sent_ = 0;
  ns_t last_tick_ns_ = 0;
  std::int64_t started_unix_ = static_cast<std::int64_t>(time(nullptr));

  // --- plumbing ---
  static void on_request(evhttp_request* req, void* self) {
    static_cast<Server*>(self)->handle(req);
  }
  static void on_timer(evutil_socket_t, short, void* self) { static_cast<Server*>(self)->tick(); }
  static void on_close(evhttp_connection*, void* arg);
  static void on_drained(evhttp_connection*, void* arg);

  void handle(evhttp_request* req);
  bool authorized(evhttp_request* req) const;
  void tick();
  void arm();
  void dispatch(const Event& ev);

  void reply_json(evhttp_request* req, int code, const std::string& body,
                  const char* reason = nullptr);
  void reply_error(evhttp_request* req, int code, const std::string& msg, const char* type);
  std::string body_of(evhttp_request* req);

  void handle_generate(evhttp_request* req, bool chat);
  void handle_tokenize(evhttp_request* req);
  void handle_detokenize(evhttp_request* req);
  void handle_metrics(evhttp_request* req);
  void handle_state(evhttp_request* req);
  void handle_trace(evhttp_request* req);
  void handle_models(evhttp_request* req);
  void handle_server_info(evhttp_request* req);

  // Tokenizes a prompt field (string, list of ids, or a one-element batch of
  // either) or chat messages. Returns false with msg set on a bad shape.
  bool tokens_of(simdjson::dom::object body, bool chat, std::vector<std::uint64_t>& ids,
                 std::string& msg);
  // Parses a request body (simdjson: a 128K-token prompt is ~1 MB and must not stall
  // the loop). Returns false, having replied 400, when it is not a JSON object.
  bool parse_body(evhttp_request* req, simdjson::dom::object& out);
  simdjson::dom::parser parser_;
  void words_to_ids(std::string_view text, std::vector<std::uint64_t>& ids);

  static constexpr std::size_t kChunkHead = 10;
  void send_token(Stream& s, ns_t t_ns, bool last);
  void write_chunk(Stream& s);
  void finish_stream(Stream& s);
  void send_nonstream(Stream& s);
  bool fire_fault(Stream& s);  // after a token; true when the stream must stop here
  void close_stream(RequestId id, bool abort_engine);
  void release_request(RequestId id);
  void pump_unpaced(RequestId id);
  void usage_json(std::string& out, const Stream& s, std::int64_t completion);
};

// --- request plumbing --------------------------------------------------------

std::string Server::body_of(evhttp_request* req) {
  evbuffer* in = evhttp_request_get_input_buffer(req);
  std::size_t n = evbuffer_get_length(in);
  std::string s(n, '\0');
  if (n) evbuffer_copyout(in, s.data(), n);
  return s;
}

void Server::reply_json(evhttp_request* req, int code, const std::string& body,
                        const char* reason) {
  evkeyvalq* h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Content-Type", "application/json");
  evbuffer* b = evbuffer_new();
  evbuffer_add(b, body.data(), body.size());
  evhttp_send_reply(req, code, reason ? reason : (code == 200 ? "OK" : "Error"), b);
  evbuffer_free(b);
}

void Server::reply_error(evhttp_request* req, int code, const std::string& msg, const char* type) {
  json e;
  if (prof_.flavour == "vllm")
    e = {{"error", {{"message", msg}, {"type", type}, {"param", nullptr}, {"code", code}}}};
  else
    e = {{"object", "error"}, {"message", msg}, {"type", type}, {"param", nullptr}, {"code", code}};
  const char* reason = code == 400   ? "Bad Request"
                       : code == 401 ? "Unauthorized"
                       : code == 404 ? "Not Found"
                       : code == 429 ? "Too Many Requests"
                       : code == 500 ? "Internal Server Error"
                                     : "Error";
  reply_json(req, code, e.dump(), reason);
}

bool Server::authorized(evhttp_request* req) const {
  const char* got = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
  std::string want = "Bearer " + opt_.api_key;
  if (!got || std::strlen(got) != want.size()) return false;
  unsigned diff = 0;  // compare every byte: the time taken says nothing of the key
  for (std::size_t i = 0; i < want.size(); ++i)
    diff |= static_cast<unsigned char>(got[i]) ^ static_cast<unsigned char>(want[i]);
  return diff == 0;
}

void Server::handle(evhttp_request* req) {
  const char* uri = evhttp_request_get_uri(req);
  std::string path(uri ? uri : "/");
  std::string query;
  if (auto q = path.find('?'); q != std::string::npos) {
    query = path.substr(q + 1);
    path.resize(q);
  }
  auto method = evhttp_request_get_command(req);
  bool post = method == EVHTTP_REQ_POST;
  try {
    bool open_path = path == "/health" || path == "/health_generate" || path == "/ping" ||
                     path == "/metrics" || path == "/version" || path.rfind("/sim/", 0) == 0;
    if (!opt_.api_key.empty() && !open_path && !authorized(req)) {
      reply_error(req, 401, "Invalid or missing API key", "AuthenticationError");
    } else if (path == "/health" || path == "/health_generate" || path == "/ping") {
      evhttp_send_reply(req, 200, "OK", nullptr);
    } else if (path == "/v1/models" || path == "/models") {
      handle_models(req);
    } else if (path == "/v1/completions" && post) {
      handle_generate(req, false);
    } else if (path == "/v1/chat/completions" && post) {
      handle_generate(req, true);
    } else if ((path == "/tokenize" || path == "/v1/tokenize") && post) {
      handle_tokenize(req);
    } else if ((path == "/detokenize" || path == "/v1/detokenize") && post) {
      handle_detokenize(req);
    } else if (path == "/metrics") {
      handle_metrics(req);
    } else if (path == "/server_info" || path == "/get_server_info") {
      handle_server_info(req);
    } else if ((path == "/flush_cache" || path == "/reset_prefix_cache") && post) {
      std::int64_t dropped = engine_.flush_cache();
      reply_json(req, 200, json{{"success", true}, {"flushed_tokens", dropped}}.dump());
    } else if (path == "/version") {
      reply_json(req, 200, json{{"version", prof_.version}}.dump());
    } else if (path == "/sim/state") {
      handle_state(req);
    } else if (path == "/sim/trace") {
      handle_trace(req);
    } else if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/tokenize" ||
               path == "/v1/tokenize" || path == "/detokenize" || path == "/v1/detokenize") {
      reply_error(req, 405, "Method Not Allowed", "MethodNotAllowed");
    } else {
      reply_error(req, 404, "Not Found: " + path, "NotFoundError");
    }
  } catch (const std::exception& e) {
    reply_error(req, 500, std::string("internal error: ") + e.what(), "InternalServerError");
  }
  tick();
}

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

void Server::words_to_ids(std::string_view text, std::vector<std::uint64_t>& ids) {
  std::size_t i = 0, n = text.size();
  while (i < n) {
    while (i < n && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    std::size_t j = i;
    while (j < n && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j > i) ids.push_back(word_token(text.data() + i, j - i, prof_.vocab_size));
    i = j;
  }
}

bool Server::parse_body(evhttp_request* req, simdjson::dom::object& out) {
  evbuffer* in = evhttp_request_get_input_buffer(req);
  std::size_t n = evbuffer_get_length(in);
  const char* data = n ? reinterpret_cast<const char*>(evbuffer_pullup(in, -1)) : "";
  if (parser_.parse(data, n).get_object().get(out) != simdjson::SUCCESS) {
    reply_error(req, 400, "malformed JSON body: expected a JSON object", "BadRequestError");
    return false;
  }
  return true;
}

bool Server::tokens_of(simdjson::dom::object body, bool chat, std::vector<std::uint64_t>& ids,
                       std::string& msg) {
  using simdjson::dom::element_type;
  simdjson::dom::element messages, prompt;
  bool has_messages = body["messages"].get(messages) == simdjson::SUCCESS;
  bool has_prompt = body["prompt"].get(prompt) == simdjson::SUCCESS ||
                    body["text"].get(prompt) == simdjson::SUCCESS;
  if (chat || (has_messages && !has_prompt)) {
    simdjson::dom::array arr;
    if (!has_messages || messages.get_array().get(arr) != simdjson::SUCCESS || arr.size() == 0) {
      msg = "'messages' must be a non-empty list";
      return false;
    }
    for (simdjson::dom::element m : arr) {
      simdjson::dom::object mo;
      if (m.get_object().get(mo) != simdjson::SUCCESS) {
        msg = "each message must be an object";
        return false;
      }
      simdjson::dom::element c;
      if (mo["content"].get(c) != simdjson::SUCCESS || c.is_null()) continue;
      std::string_view sv;
      simdjson::dom::array parts;
      if (c.get_string().get(sv) == simdjson::SUCCESS) {
        words_to_ids(sv, ids);
      } else if (c.get_array().get(parts) == simdjson::SUCCESS) {
        for (simdjson::dom::element part : parts) {
          std::string_view t;
          if (part["text"].get_string().get(t) == simdjson::SUCCESS) words_to_ids(t, ids);
        }
      } else {
        msg = "message content must be a string or a list of parts";
        return false;
      }
    }
    return true;
  }
  if (!has_prompt) {
    msg = "'prompt' is required";
    return false;
  }
  simdjson::dom::array arr;
  if (prompt.get_array().get(arr) == simdjson::SUCCESS && arr.size() == 1) {
    simdjson::dom::element first = arr.at(0).value_unsafe();
    if (first.is_string() || first.is_array()) prompt = first;  // a batch of one
  }
  std::string_view sv;
  if (prompt.get_string().get(sv) == simdjson::SUCCESS) {
    words_to_ids(sv, ids);
    return true;
  }
  if (prompt.get_array().get(arr) == simdjson::SUCCESS) {
    ids.reserve(arr.size());
    for (simdjson::dom::element v : arr) {
      std::uint64_t id;
      if (v.get_uint64().get(id) != simdjson::SUCCESS) {
        msg = "'prompt' must be a string or a list of non-negative token ids";
        return false;
      }
      ids.push_back(id);
    }
    return true;
  }
  msg = "'prompt' must be a string or a list of token ids";
  return false;
}

void Server::handle_tokenize(evhttp_request* req) {
  simdjson::dom::object body;
  if (!parse_body(req, body)) return;
  std::vector<std::uint64_t> ids;
  std::string msg;
  if (!tokens_of(body, false, ids, msg)) return reply_error(req, 400, msg, "BadRequestError");
  std::string out = "{\"tokens\":[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    append_int(out, static_cast<std::int64_t>(ids[i]));
  }
  out += "],\"count\":";
  append_int(out, static_cast<std::int64_t>(ids.size()));
  out += ",\"max_model_len\":";
  append_int(out, prof_.context_length);
  out += '}';
  reply_json(req, 200, out);
}

void Server::handle_detokenize(evhttp_request* req) {
  json body = json::parse(body_of(req), nullptr, false);
  if (body.is_discarded() || !body.is_object() || !body.contains("tokens") ||
      !body["tokens"].is_array())
    return reply_error(req, 400, "expected {\"tokens\": [ids]}", "BadRequestError");
  std::string text;
  for (const auto& v : body["tokens"]) {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0)
      return reply_error(req, 400, "token ids must be non-negative integers", "BadRequestError");
    if (!text.empty()) text += ' ';
    text += token_word(v.get<std::uint64_t>());
  }
  reply_json(req, 200, json{{prof_.flavour == "vllm" ? "prompt" : "text", text}}.dump());
}

// --- generation --------------------------------------------------------------

void Server::handle_generate(evhttp_request* req, bool chat) {
  simdjson::dom::object body;
  if (!parse_body(req, body)) return;
  simdjson::dom::element v;
  if (body["model"].get(v) == simdjson::SUCCESS && !v.is_null()) {
    std::string_view m;
    if (v.get_string().get(m) != simdjson::SUCCESS)
      return reply_error(req, 400, "'model' must be a string", "BadRequestError");
    if (m != prof_.model)
      return reply_error(req, 404, "The model `" + std::string(m) + "` does not exist.",
                         "NotFoundError");
  }
  std::vector<std::uint64_t> ids;
  std::string msg;
  if (!tokens_of(body, chat, ids, msg)) return reply_error(req, 400, msg, "BadRequestError");
  std::int64_t prompt = static_cast<std::int64_t>(ids.size());
  std::int64_t max_tokens =
      chat ? std::min<std::int64_t>(4096, prof_.context_length - prompt) : prof_.default_max_tokens;
  for (const char* k : {"max_tokens", "max_completion_tokens", "max_new_tokens"}) {
    if (body[k].get(v) != simdjson::SUCCESS || v.is_null()) continue;
    if (v.get_int64().get(max_tokens) != simdjson::SUCCESS)
      return reply_error(req, 400, std::string("'") + k + "' must be an integer",
                         "BadRequestError");
    break;
  }
  // Engine::validate adds prompt + max_tokens: a max_tokens near 2^63 would overflow that
  // sum and pass. Nothing above the context length can be served anyway.
  if (max_tokens > prof_.context_length)
    return reply_error(req, 400,
                       "This model's maximum context length is " +
                           std::to_string(prof_.context_length) +
                           " tokens. However, you "
                           "requested " +
                           std::to_string(max_tokens) +
                           " tokens in the completion. Please reduce the length of the "
                           "completion.",
                       "BadRequestError");
  bool streaming = false;
  if (body["stream"].get(v) == simdjson::SUCCESS && !v.is_null()) {
    if (v.get_bool().get(streaming) != simdjson::SUCCESS)
      return reply_error(req, 400, "'stream' must be a boolean", "BadRequestError");
  }
  bool include_usage = false, continuous = false;
  simdjson::dom::object so;
  if (body["stream_options"].get_object().get(so) == simdjson::SUCCESS) {
    bool b;
    if (so["include_usage"].get_bool().get(b) == simdjson::SUCCESS) include_usage = b;
    if (so["continuous_usage_stats"].get_bool().get(b) == simdjson::SUCCESS) continuous = b;
  }
  // The final usage chunk comes only with include_usage, on both engines. vLLM adds
  // per-chunk usage only on top of it (include_usage and continuous_usage_stats,
  // should_include_usage in vllm/entrypoints/serve/utils/api_utils.py); SGLang
  // honours continuous_usage_stats alone (should_include_usage in
  // python/sglang/srt/entrypoints/openai/utils.py).
  if (prof_.flavour == "vllm") continuous = continuous && include_usage;
  bool ignore_eos = false;
  if (body["ignore_eos"].get(v) == simdjson::SUCCESS && !v.is_null() &&
      v.get_bool().get(ignore_eos) != simdjson::SUCCESS)
    return reply_error(req, 400, "'ignore_eos' must be a boolean", "BadRequestError");
  std::int64_t min_tokens = 0;
  for (const char* k : {"min_tokens", "min_new_tokens"}) {
    if (body[k].get(v) != simdjson::SUCCESS || v.is_null()) continue;
    if (v.get_int64().get(min_tokens) != simdjson::SUCCESS)
      return reply_error(req, 400, std::string("'") + k + "' must be an integer",
                         "BadRequestError");
    break;
  }
  bool free_prefill = false;
  if (body["sm_prefill_free"].get(v) == simdjson::SUCCESS && !v.is_null() &&
      v.get_bool().get(free_prefill) != simdjson::SUCCESS)
    return reply_error(req, 400, "'sm_prefill_free' must be a boolean", "BadRequestError");
  Fault fault = Fault::kNone;
  if (body["sm_fault"].get(v) == simdjson::SUCCESS && !v.is_null()) {
    std::string_view f;
    if (v.get_string().get(f) != simdjson::SUCCESS || !parse_fault(std::string(f), fault))
      return reply_error(req, 400, "unknown sm_fault", "BadRequestError");
  } else if (opt_.fault_http500 + opt_.fault_malformed + opt_.fault_drop + opt_.fault_stall > 0) {
    double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    double c = opt_.fault_http500;
    if (u < c)
      fault = Fault::kHttp500;
    else if (u < (c += opt_.fault_malformed))
      fault = Fault::kMalformed;
    else if (u < (c += opt_.fault_drop))
      fault = Fault::kDrop;
    else if (u < (c += opt_.fault_stall))
      fault = Fault::kStall;
  }
  std::string err = engine_.validate(prompt, max_tokens);
  if (!err.empty()) return reply_error(req, 400, err, "BadRequestError");
  if (fault == Fault::kHttp500)
    return reply_error(req, 500, "simulated internal server error (sm_fault)",
                       "InternalServerError");
  if (fault == Fault::kHttp429) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
    return reply_error(req, 429, "simulated rate limit (sm_fault)", "RateLimitError");
  }

  // EOS ends the reply early unless the request ignores it; min_tokens holds it back.
  std::int64_t eos_at = 0;
  if (prof_.eos_after > 0 && !ignore_eos) eos_at = std::max(prof_.eos_after, min_tokens);

  ns_t arrival_ns = clock_.now();  // the engine's submit time below is the same reading's moment
  RequestId id = next_id_++;
  Stream& s = streams_[id];
  s.id = id;
  s.req = req;
  s.conn = evhttp_request_get_connection(req);
  s.chat = chat;
  s.streaming = streaming;
  s.include_usage = include_usage;
  s.continuous_usage = continuous;
  s.prompt_tokens = prompt;
  s.max_tokens = max_tokens;
  RequestSpec spec;
  spec.id = id;
  spec.prompt_tokens = prompt;
  spec.max_tokens = max_tokens;
  spec.free_prefill = free_prefill;
  spec.eos_at = eos_at;
  s.out_tokens = output_tokens(spec);
  s.fault = fault;
  s.fault_at = std::max<std::int64_t>(1, std::min<std::int64_t>(3, s.out_tokens - 1));
  char idbuf[40];
  std::snprintf(idbuf, sizeof idbuf, "%s-sim%016llx", chat ? "chatcmpl" : "cmpl",
                static_cast<unsigned long long>(id));
  s.obj_head =
      std::string("{\"id\":\"") + idbuf + "\",\"object\":\"" +
      (chat ? (streaming ? "chat.completion.chunk" : "chat.completion") : "text_completion") +
      "\",\"created\":" + std::to_string(time(nullptr)) + ",\"model\":" + jstr(prof_.model);
  if (chat)
    s.head = "data: " + s.obj_head + ",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"";
  else
    s.head = "data: " + s.obj_head + ",\"choices\":[{\"index\":0,\"text\":\"";
  s.tail =
      chat ? "\"},\"logprobs\":null,\"finish_reason\":" : "\",\"logprobs\":null,\"finish_reason\":";
  evhttp_connection_set_closecb(s.conn, &Server::on_close,
                                reinterpret_cast<void*>(static_cast<std::uintptr_t>(id)));

  if (streaming) {
    evkeyvalq* h = evhttp_request_get_output_headers(req);
    if (fault == Fault::kNotSse) {
      evhttp_add_header(h, "Content-Type", "text/html; charset=utf-8");
      evbuffer* b = evbuffer_new();
      evbuffer_add_printf(
          b, "<html><body>speedmatrix-sim: this is not an event stream (sm_fault)</body></html>\n");
      evhttp_connection_set_closecb(s.conn, nullptr, nullptr);
      evhttp_send_reply(req, 200, "OK", b);
      evbuffer_free(b);
      streams_.erase(id);
      return;
    }
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    // When the engine took the request (CLOCK_MONOTONIC): TTFT on the server's own clock.
    evhttp_add_header(h, "X-SM-Arrival-Ns", std::to_string(arrival_ns).c_str());
    evhttp_send_reply_start(req, 200, "OK");
    if (chat) {  // the role-only first chunk, as vLLM and SGLang send it
      std::string c =
          "data: " + s.obj_head +
          ",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
          "\"logprobs\":null,\"finish_reason\":null}]";
      if (opt_.stamp) {
        c += ",\"sm_t_ns\":";
        append_int(c, now_ns());
      }
      c += "}\n\n";
      evbuffer_add(out_, c.data(), c.size());
      evhttp_send_reply_chunk(req, out_);
    }
  }
  if (opt_.unpaced) {
    pump_unpaced(id);
    return;
  }
  if (prof_.prefix_cache && prof_.mode == "batched")
    spec.block_hashes = block_hashes(ids, prof_.block_size);
  engine_.submit(spec);
  s.in_engine = true;
}

void Server::usage_json(std::string& out, const Stream& s, std::int64_t completion) {
  out += "\"usage\":{\"prompt_tokens\":";
  append_int(out, s.prompt_tokens);
  out += ",\"total_tokens\":";
  append_int(out, s.prompt_tokens + completion);
  out += ",\"completion_tokens\":";
  append_int(out, completion);
  if (s.cached > 0) {
    out += ",\"prompt_tokens_details\":{\"cached_tokens\":";
    append_int(out, s.cached);
    out += '}';
  }
  out += '}';
}

// Appends one token event (and, for the last, the usage event and [DONE]) to out_.
void Server::send_token(Stream& s, ns_t, bool last) {
  std::string& c = scratch_;
  c.assign(kChunkHead, ' ');  // room for the HTTP chunk-size line, see write_chunk()
  const std::string& w = words_[static_cast<std::size_t>((s.sent + s.id * 31) % kWords)];
  c += s.head;
  if (s.sent == 0)
    c.append(w, 1, std::string::npos);  // no leading space on the first token
  else
    c += w;
  c += s.tail;
  c += !last ? "null}]" : s.out_tokens < s.max_tokens ? "\"stop\"}]" : "\"length\"}]";
  s.sent++;
  tokens_sent_++;
  if (s.continuous_usage) {
    c += ',';
    usage_json(c, s, s.sent);
  }
  if (opt_.stamp) {
    c += ",\"sm_t_ns\":";
    append_int(c, now_ns());
  }
  c += "}\n\n";
  if (last && s.include_usage) {
    c += "data: ";
    c += s.obj_head;
    c += ",\"choices\":[],";
    usage_json(c, s, s.sent);
    if (opt_.stamp) {
      c += ",\"sm_t_ns\":";
      append_int(c, now_ns());
    }
    c += "}\n\n";
  }
  if (last && s.fault != Fault::kNoDone) c += "data: [DONE]\n\n";
  // The caller sends scratch_ (write_chunk) or queues it (unpaced bursts).
}

// Writes scratch_ (kChunkHead spare bytes, then the events) as one HTTP/1.1 chunk
// straight into the connection's output buffer: one contiguous append, where
// evhttp_send_reply_chunk would format the size line with printf and start a new
// buffer chain per token.
void Server::write_chunk(Stream& s) {
  std::string& c = scratch_;
  std::size_t n = c.size() - kChunkHead;
  if (n == 0) return;
  char hex[16];
  auto r = std::to_chars(hex, hex + sizeof hex, n, 16);
  std::size_t h = static_cast<std::size_t>(r.ptr - hex);
  std::size_t start = kChunkHead - h - 2;
  std::memcpy(&c[start], hex, h);
  c[kChunkHead - 2] = '\r';
  c[kChunkHead - 1] = '\n';
  c += "\r\n";
  bufferevent* bev = evhttp_connection_get_bufferevent(s.conn);
  if (!(bufferevent_get_enabled(bev) & EV_WRITE)) bufferevent_enable(bev, EV_WRITE);
  evbuffer_add(bufferevent_get_output(bev), c.data() + start, c.size() - start);
}

void Server::send_nonstream(Stream& s) {
  std::string text;
  for (std::int64_t k = 0; k < s.out_tokens; ++k) {
    const std::string& w = words_[static_cast<std::size_t>((k + s.id * 31) % kWords)];
    if (k == 0)
      text.append(w, 1, std::string::npos);
    else
      text += w;
  }
  std::string c = s.obj_head;
  const char* reason = s.out_tokens < s.max_tokens ? "stop" : "length";
  if (s.chat)
    c += ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"" + text +
         "\"},\"logprobs\":null,\"finish_reason\":\"" + reason + "\"}],";
  else
    c += ",\"choices\":[{\"index\":0,\"text\":\"" + text +
         "\",\"logprobs\":null,\"finish_reason\":\"" + reason + "\"}],";
  tokens_sent_ += s.out_tokens;
  s.sent = s.out_tokens;
  usage_json(c, s, s.out_tokens);
  if (opt_.stamp) {
    c += ",\"sm_t_ns\":";
    append_int(c, now_ns());
  }
  c += '}';
  if (s.fault == Fault::kMalformed) c = "{\"id\": \"broken";
  evhttp_connection_set_closecb(s.conn, nullptr, nullptr);
  reply_json(s.req, 200, c);
}

// Called after a token of a streaming request was written.
bool Server::fire_fault(Stream& s) {
  if (s.fault == Fault::kNone || s.sent != s.fault_at) return false;
  switch (s.fault) {
    case Fault::kMalformed: {
      static const char kBad[] =
          "data: {\"id\":\"broken\",\"choices\":[{\"index\":0,\"text\":\"oops\n\n";
      evbuffer_add(out_, kBad, sizeof kBad - 1);
      evhttp_send_reply_chunk(s.req, out_);
      return false;  // the stream goes on after the bad event
    }
    case Fault::kDrop: {
      bufferevent* bev = evhttp_connection_get_bufferevent(s.conn);
      evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
      if (fd >= 0) {
        linger l{1, 0};  // reset, as a crashed server would
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        shutdown(fd, SHUT_RDWR);
      }
      s.stalled = true;  // the close callback cleans up
      return true;
    }
    case Fault::kStall:
      s.stalled = true;  // keep the connection open, send nothing more
      return true;
    case Fault::kNoDone:
      evhttp_connection_set_closecb(s.conn, nullptr, nullptr);
      evhttp_send_reply_end(s.req);
      return true;
    case Fault::kErrorEvent: {
      std::string e =
          "data: {\"error\":{\"message\":\"simulated engine error mid-stream (sm_fault)\","
          "\"type\":\"InternalServerError\",\"code\":500}}\n\ndata: [DONE]\n\n";
      evbuffer_add(out_, e.data(), e.size());
      evhttp_send_reply_chunk(s.req, out_);
      evhttp_connection_set_closecb(s.conn, nullptr, nullptr);
      evhttp_send_reply_end(s.req);
      return true;
    }
    default:
      return false;
  }
}

void Server::finish_stream(Stream& s) {
  evhttp_connection_set_closecb(s.conn, nullptr, nullptr);
  evhttp_send_reply_end(s.req);
}

void Server::close_stream(RequestId id, bool abort_engine) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  if (abort_engine && it->second.in_engine) engine_.abort(id);
  streams_.erase(it);
}

void Server::dispatch(const Event& ev) {
  auto it = streams_.find(ev.id);
  if (it == streams_.end()) return;
  Stream& s = it->second;
  s.cached = ev.cached_tokens;
  bool last = ev.kind == EventKind::kFinished;
  if (last) s.in_engine = false;
  if (s.stalled) {
    if (last) s.in_engine = false;
    return;
  }
  if (!s.streaming) {
    if (!last) return;
    if (s.fault == Fault::kDrop || s.fault == Fault::kStall) {
      if (s.fault == Fault::kDrop) {
        bufferevent* bev = evhttp_connection_get_bufferevent(s.conn);
        evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
        if (fd >= 0) shutdown(fd, SHUT_RDWR);
      }
      s.stalled = true;
      return;
    }
    send_nonstream(s);
    streams_.erase(it);
    return;
  }
  send_token(s, ev.t_ns, last);
  write_chunk(s);
  if (fire_fault(s)) {
    if (s.in_engine) {
      engine_.abort(s.id);
      s.in_engine = false;
    }
    if (!s.stalled) streams_.erase(s.id);
    return;
  }
  if (last) {
    finish_stream(s);
    streams_.erase(it);
  }
}

void Server::on_close(evhttp_connection*, void* arg) {
  RequestId id = static_cast<RequestId>(reinterpret_cast<std::uintptr_t>(arg));
  if (!g_server) return;  // the server is being torn down
  g_server->release_request(id);
  g_server->close_stream(id, true);
  g_server->arm();
}

// A client that goes away mid-reply (EOF or reset on a reply not yet ended) makes
// libevent detach the request from its connection and leave it to us: it is freed
// neither with the connection nor later (~2.9 KB a stream). A request still attached
// is freed with its connection, after this callback.
void Server::release_request(RequestId id) {
  auto it = streams_.find(id);
  if (it == streams_.end() || !it->second.req) return;
  if (evhttp_request_get_connection(it->second.req) == nullptr) evhttp_request_free(it->second.req);
  it->second.req = nullptr;
}

// Unpaced: write a burst of tokens, then wait for the socket to drain.
void Server::pump_unpaced(RequestId id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  Stream& s = it->second;
  if (!s.streaming) {
    send_nonstream(s);
    streams_.erase(it);
    return;
  }
  constexpr int kBurst = 256;
  for (int k = 0; k < kBurst; ++k) {
    bool last = s.sent + 1 >= s.out_tokens;
    send_token(s, 0, last);
    evbuffer_add(out_, scratch_.data() + kChunkHead, scratch_.size() - kChunkHead);
    if (s.fault != Fault::kNone && s.sent == s.fault_at) {
      evhttp_send_reply_chunk(s.req, out_);
      if (fire_fault(s)) {
        if (!s.stalled) streams_.erase(id);
        return;
      }
    }
    if (last) {
      evhttp_send_reply_chunk(s.req, out_);
      finish_stream(s);
      streams_.erase(id);
      return;
    }
  }
  // One HTTP chunk for the burst; the callback comes when the socket has taken it all.
  evhttp_send_reply_chunk_with_cb(s.req, out_, &Server::on_drained,
                                  reinterpret_cast<void*>(static_cast<std::uintptr_t>(id)));
}

void Server::on_drained(evhttp_connection*, void* arg) {
  if (g_server)
    g_server->pump_unpaced(static_cast<RequestId>(reinterpret_cast<std::uintptr_t>(arg)));
}

// --- timing --------------------------------------------------------------------

void Server::tick() {
  last_tick_ns_ = clock_.now();
  events_.clear();
  engine_.advance(events_);
  for (const Event& ev : events_) dispatch(ev);
  arm();
}

void Server::arm() {
  ns_t d = engine_.next_deadline();
  if (d == kNever) {
    evtimer_del(timer_);
    return;
  }
  // Thousands of streams in fixed mode have thousands of distinct deadlines; waking
  // for each costs more than the tokens. Wake-ups are at least kMinGapNs apart (events
  // leave at most that late); a lone stream's deadlines are never moved.
  constexpr ns_t kMinGapNs = 50'000;
  ns_t now = clock_.now();
  ns_t wait = std::max<ns_t>(0, std::max(d, last_tick_ns_ + kMinGapNs) - now);
  if (d <= now && now - last_tick_ns_ >= kMinGapNs) wait = 0;
  timeval tv{static_cast<time_t>(wait / 1'000'000'000),
             static_cast<suseconds_t>((wait % 1'000'000'000) / 1000)};
  evtimer_add(timer_, &tv);
}

// --- observability -------------------------------------------------------------

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

// --- loop ------------------------------------------------------------------------

void on_signal(evutil_socket_t, short, void* base) {
  event_base_loopbreak(static_cast<event_base*>(base));
}

void on_stdin(evutil_socket_t fd, short, void* base) {
  char buf[256];
  ssize_t n = read(fd, buf, sizeof buf);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
    event_base_loopbreak(static_cast<event_base*>(base));
}

// host is a numeric IPv4 or IPv6 address ("127.0.0.1", "::1", "0.0.0.0", "::"); -2 when
// it is neither, -1 with errno set when the socket cannot listen.
int listen_socket(const std::string& host, int port, int& bound_port) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, host.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<std::uint16_t>(port));
    len = sizeof *a4;
  } else if (inet_pton(AF_INET6, host.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<std::uint16_t>(port));
    len = sizeof *a6;
  } else {
    return -2;
  }
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // inherited by accepted sockets
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || listen(fd, 8192) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  bound_port = ntohs(ss.ss_family == AF_INET ? a4->sin_port : a6->sin6_port);
  return fd;
}

// "HOST:PORT", the host in brackets when it is an IPv6 address (as in a URL).
std::string host_port(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

int Server::run() {
  event_config* cfg = event_config_new();
  event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);  // timerfd: µs timers, not ms
  base_ = event_base_new_with_config(cfg);
  event_config_free(cfg);
  if (!base_) {
    std::fprintf(stderr, "speedmatrix-sim: cannot create the event loop\n");
    return 1;
  }
  http_ = evhttp_new(base_);
  evhttp_set_max_body_size(http_, 256LL << 20);
  evhttp_set_max_headers_size(http_, 1 << 20);
  timeval long_tv{24 * 3600, 0};
  evhttp_set_timeout_tv(http_, &long_tv);
  evhttp_set_allowed_methods(
      http_, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_OPTIONS);
  evhttp_set_gencb(http_, &Server::on_request, this);
  int port = 0;
  int fd = listen_socket(opt_.host, opt_.port, port);
  if (fd == -2) {
    std::fprintf(stderr,
                 "speedmatrix-sim: --host wants a numeric IPv4 or IPv6 address (127.0.0.1, ::1), "
                 "not %s\n",
                 opt_.host.c_str());
    return 1;
  }
  if (fd < 0) {
    std::fprintf(stderr, "speedmatrix-sim: cannot listen on %s: %s\n",
                 host_port(opt_.host, opt_.port).c_str(), std::strerror(errno));
    return 1;
  }
  if (!evhttp_accept_socket_with_handle(http_, fd)) {
    std::fprintf(stderr, "speedmatrix-sim: evhttp cannot accept on the socket\n");
    return 1;
  }
  timer_ = evtimer_new(base_, &Server::on_timer, this);
  out_ = evbuffer_new();
  scratch_.reserve(4096);
  event* sigterm = evsignal_new(base_, SIGTERM, on_signal, base_);
  event* sigint = evsignal_new(base_, SIGINT, on_signal, base_);
  evsignal_add(sigterm, nullptr);
  evsignal_add(sigint, nullptr);
  event* stdin_ev = nullptr;
  if (opt_.watch_stdin) {
    stdin_ev = event_new(base_, 0, EV_READ | EV_PERSIST, on_stdin, base_);
    event_add(stdin_ev, nullptr);
  }
  g_server = this;
  std::printf("speedmatrix-sim listening on %s\n", host_port(opt_.host, port).c_str());
  std::fflush(stdout);
  event_base_dispatch(base_);
  if (stdin_ev) event_free(stdin_ev);
  evhttp_free(http_);  // closes the connections (close callbacks still see the server)
  g_server = nullptr;
  event_free(sigterm);
  event_free(sigint);
  event_free(timer_);
  evbuffer_free(out_);
  event_base_free(base_);
  return 0;
}

}  // namespace

int run_server(const ServerOptions& opts) {
  signal(SIGPIPE, SIG_IGN);
  Server s(opts);
  return s.run();
}

}  // namespace speedmatrix::sim
