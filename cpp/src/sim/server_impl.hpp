// The built-in engine's HTTP server, shared by its parts (private to cpp/src/sim):
// server.cpp (the loop, HTTP plumbing and routing), server_generate.cpp (reading
// requests, starting replies), server_stream.cpp (streaming, timing, disconnects),
// server_observe.cpp (/metrics, /sim/*, model and server info), server_faults.cpp.
//
// The per-token path builds each chunk from a per-request preformatted prefix
// and suffix with plain appends (no JSON library), so one core can emit more
// than a million tokens per second in unpaced mode.
#pragma once

#include <event2/event.h>
#include <event2/http.h>
#include <simdjson.h>

#include <charconv>
#include <cstdint>
#include <ctime>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "server.hpp"

namespace speedmatrix::sim {

class Server;
extern Server* g_server;  // the process's only server, for libevent's C callbacks

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

bool parse_fault(const std::string& s, Fault& f);  // "none", "http_500", ...

inline void append_int(std::string& out, std::int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

// JSON string escaping for the (rare) non-hot-path fields we echo.
inline std::string jstr(const std::string& s) { return nlohmann::json(s).dump(); }

// What a generation request asked for, read and checked.
struct GenerateArgs {
  bool chat = false, streaming = false, include_usage = false, continuous = false;
  bool ignore_eos = false, free_prefill = false;
  bool return_ids = false;  // vLLM's return_token_ids (vllm flavour only)
  std::int64_t prompt = 0, max_tokens = 0, min_tokens = 0;
  Fault fault = Fault::kNone;
  std::vector<std::uint64_t> ids;  // the prompt's tokens
};

struct Stream {
  RequestId id = 0;
  evhttp_request* req = nullptr;
  evhttp_connection* conn = nullptr;
  bool chat = false, streaming = true, include_usage = false, continuous_usage = false;
  std::int64_t prompt_tokens = 0, max_tokens = 0, cached = 0;
  std::int64_t out_tokens = 0;  // tokens the reply carries: max_tokens, or fewer at EOS
  std::int64_t sent = 0;        // tokens written
  std::int64_t reasoning = 0;   // the first `reasoning` tokens are reasoning (ServerOptions)
  Fault fault = Fault::kNone;
  std::int64_t fault_at = 1;  // the fault fires after this many tokens
  bool stalled = false;
  bool in_engine = false;
  bool return_ids = false;  // each chunk carries its "token_ids" (vLLM return_token_ids)
  std::string head;         // 'data: {"id":...,"choices":[{"index":0,"text":"' (or delta content)
  std::string reasoning_head;  // chat: '... "delta":{"reasoning_content":"'
  std::string tail;            // '","logprobs":null,"finish_reason":'
  std::string obj_head;        // '{"id":"...","object":"...","created":N,"model":"..."'
};

class Server {
 public:
  explicit Server(const ServerOptions& o)
      : opt_(o), prof_(o.profile), engine_(o.profile, clock_), rng_(o.seed) {
    words_.reserve(kWords);
    for (std::size_t i = 0; i < kWords; ++i) words_.push_back(" " + token_word(word_token_id(i)));
    owned_by_ = prof_.flavour;
  }

  int run();

 private:
  static constexpr int kWords = 1024;
  // The word (and token) a stream generates at output position k: words_[word_at(id, k)],
  // whose token id is word_token_id(word_at(id, k)).
  static std::size_t word_at(RequestId id, std::int64_t k) {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(k) + id * 31) % kWords);
  }
  std::uint64_t word_token_id(std::size_t w) const {
    return (w * 2654435761ULL) % static_cast<std::uint64_t>(prof_.vocab_size);
  }
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
  bool read_generate(evhttp_request* req, GenerateArgs& a);
  bool read_lengths(evhttp_request* req, simdjson::dom::object body, GenerateArgs& a);
  bool read_stream_options(evhttp_request* req, simdjson::dom::object body, GenerateArgs& a);
  bool read_flags(evhttp_request* req, simdjson::dom::object body, GenerateArgs& a);
  bool read_fault(evhttp_request* req, simdjson::dom::object body, GenerateArgs& a);
  bool reply_fault_status(evhttp_request* req, Fault fault);
  Stream& open_stream(evhttp_request* req, const GenerateArgs& a, RequestSpec& spec);
  bool start_stream_reply(Stream& s, ns_t arrival_ns);
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

}  // namespace speedmatrix::sim
