// The built-in engine's requests: reading a prompt (text, token ids or chat
// messages) and a generation request's fields, /tokenize and /detokenize, and
// starting a generation's reply.
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "server_impl.hpp"

namespace speedmatrix::sim {

using nlohmann::json;

// --- prompts -----------------------------------------------------------------

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

// Reads max_tokens (or its aliases) and refuses one above the context length.
bool Server::read_lengths(evhttp_request* req, simdjson::dom::object body, GenerateArgs& a) {
  simdjson::dom::element v;
  a.max_tokens = a.chat ? std::min<std::int64_t>(4096, prof_.context_length - a.prompt)
                        : prof_.default_max_tokens;
  for (const char* k : {"max_tokens", "max_completion_tokens", "max_new_tokens"}) {
    if (body[k].get(v) != simdjson::SUCCESS || v.is_null()) continue;
    if (v.get_int64().get(a.max_tokens) != simdjson::SUCCESS) {
      reply_error(req, 400, std::string("'") + k + "' must be an integer", "BadRequestError");
      return false;
    }
    break;
  }
  // Engine::validate adds prompt + max_tokens: a max_tokens near 2^63 would overflow that
  // sum and pass. Nothing above the context length can be served anyway.
  if (a.max_tokens > prof_.context_length) {
    reply_error(req, 400,
                "This model's maximum context length is " + std::to_string(prof_.context_length) +
                    " tokens. However, you "
                    "requested " +
                    std::to_string(a.max_tokens) +
                    " tokens in the completion. Please reduce the length of the "
                    "completion.",
                "BadRequestError");
    return false;
  }
  return true;
}

// Reads stream and stream_options as the profile's flavour does.
bool Server::read_stream_options(evhttp_request* req, simdjson::dom::object body, GenerateArgs& a) {
  simdjson::dom::element v;
  if (body["stream"].get(v) == simdjson::SUCCESS && !v.is_null()) {
    if (v.get_bool().get(a.streaming) != simdjson::SUCCESS) {
      reply_error(req, 400, "'stream' must be a boolean", "BadRequestError");
      return false;
    }
  }
  simdjson::dom::object so;
  if (body["stream_options"].get_object().get(so) == simdjson::SUCCESS) {
    bool b;
    if (so["include_usage"].get_bool().get(b) == simdjson::SUCCESS) a.include_usage = b;
    if (so["continuous_usage_stats"].get_bool().get(b) == simdjson::SUCCESS) a.continuous = b;
  }
  // The final usage chunk comes only with include_usage, on both engines. vLLM adds
  // per-chunk usage only on top of it (include_usage and continuous_usage_stats,
  // should_include_usage in vllm/entrypoints/serve/utils/api_utils.py); SGLang
  // honours continuous_usage_stats alone (should_include_usage in
  // python/sglang/srt/entrypoints/openai/utils.py).
  if (prof_.flavour == "vllm") a.continuous = a.continuous && a.include_usage;
  return true;
}

// Reads ignore_eos, min_tokens (or min_new_tokens) and sm_prefill_free.
bool Server::read_flags(evhttp_request* req, simdjson::dom::object body, GenerateArgs& a) {
  simdjson::dom::element v;
  if (body["ignore_eos"].get(v) == simdjson::SUCCESS && !v.is_null() &&
      v.get_bool().get(a.ignore_eos) != simdjson::SUCCESS) {
    reply_error(req, 400, "'ignore_eos' must be a boolean", "BadRequestError");
    return false;
  }
  for (const char* k : {"min_tokens", "min_new_tokens"}) {
    if (body[k].get(v) != simdjson::SUCCESS || v.is_null()) continue;
    if (v.get_int64().get(a.min_tokens) != simdjson::SUCCESS) {
      reply_error(req, 400, std::string("'") + k + "' must be an integer", "BadRequestError");
      return false;
    }
    break;
  }
  // vLLM streams each chunk's token ids on request (return_token_ids); other engines do not
  if (prof_.flavour == "vllm" && body["return_token_ids"].get(v) == simdjson::SUCCESS &&
      !v.is_null() && v.get_bool().get(a.return_ids) != simdjson::SUCCESS) {
    reply_error(req, 400, "'return_token_ids' must be a boolean", "BadRequestError");
    return false;
  }
  if (body["sm_prefill_free"].get(v) == simdjson::SUCCESS && !v.is_null() &&
      v.get_bool().get(a.free_prefill) != simdjson::SUCCESS) {
    reply_error(req, 400, "'sm_prefill_free' must be a boolean", "BadRequestError");
    return false;
  }
  return true;
}

// Reads a generation request, checking each field in the order the engines do; false,
// having replied with the error, when one is wrong.
bool Server::read_generate(evhttp_request* req, GenerateArgs& a) {
  simdjson::dom::object body;
  if (!parse_body(req, body)) return false;
  simdjson::dom::element v;
  if (body["model"].get(v) == simdjson::SUCCESS && !v.is_null()) {
    std::string_view m;
    if (v.get_string().get(m) != simdjson::SUCCESS) {
      reply_error(req, 400, "'model' must be a string", "BadRequestError");
      return false;
    }
    if (m != prof_.model) {
      reply_error(req, 404, "The model `" + std::string(m) + "` does not exist.", "NotFoundError");
      return false;
    }
  }
  std::string msg;
  if (!tokens_of(body, a.chat, a.ids, msg)) {
    reply_error(req, 400, msg, "BadRequestError");
    return false;
  }
  a.prompt = static_cast<std::int64_t>(a.ids.size());
  return read_lengths(req, body, a) && read_stream_options(req, body, a) &&
         read_flags(req, body, a) && read_fault(req, body, a);
}

// The stream's record, with the preformatted parts of its chunks, and its close callback.
Stream& Server::open_stream(evhttp_request* req, const GenerateArgs& a, RequestSpec& spec) {
  RequestId id = next_id_++;
  Stream& s = streams_[id];
  s.id = id;
  s.req = req;
  s.conn = evhttp_request_get_connection(req);
  s.chat = a.chat;
  s.streaming = a.streaming;
  s.include_usage = a.include_usage;
  s.continuous_usage = a.continuous;
  s.return_ids = a.return_ids;
  s.prompt_tokens = a.prompt;
  s.max_tokens = a.max_tokens;
  // EOS ends the reply early unless the request ignores it; min_tokens holds it back.
  std::int64_t eos_at = 0;
  if (prof_.eos_after > 0 && !a.ignore_eos) eos_at = std::max(prof_.eos_after, a.min_tokens);
  spec.id = id;
  spec.prompt_tokens = a.prompt;
  spec.max_tokens = a.max_tokens;
  spec.free_prefill = a.free_prefill;
  spec.eos_at = eos_at;
  s.out_tokens = output_tokens(spec);
  if (a.chat && opt_.reasoning_tokens > 0)
    s.reasoning = std::clamp<std::int64_t>(opt_.reasoning_tokens, 0, s.out_tokens - 1);
  s.fault = a.fault;
  s.fault_at = std::max<std::int64_t>(1, std::min<std::int64_t>(3, s.out_tokens - 1));
  char idbuf[40];
  std::snprintf(idbuf, sizeof idbuf, "%s-sim%016llx", a.chat ? "chatcmpl" : "cmpl",
                static_cast<unsigned long long>(id));
  s.obj_head =
      std::string("{\"id\":\"") + idbuf + "\",\"object\":\"" +
      (a.chat ? (a.streaming ? "chat.completion.chunk" : "chat.completion") : "text_completion") +
      "\",\"created\":" + std::to_string(time(nullptr)) + ",\"model\":" + jstr(prof_.model);
  if (a.chat) {
    s.head = "data: " + s.obj_head + ",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"";
    s.reasoning_head =
        "data: " + s.obj_head + ",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"";
  } else
    s.head = "data: " + s.obj_head + ",\"choices\":[{\"index\":0,\"text\":\"";
  s.tail = a.chat ? "\"},\"logprobs\":null,\"finish_reason\":"
                  : "\",\"logprobs\":null,\"finish_reason\":";
  evhttp_connection_set_closecb(s.conn, &Server::on_close,
                                reinterpret_cast<void*>(static_cast<std::uintptr_t>(id)));
  return s;
}

// Starts a streaming reply (headers, and chat's role-only first chunk); false when the
// not_sse fault answered with a page instead and the stream is gone.
bool Server::start_stream_reply(Stream& s, ns_t arrival_ns) {
  evkeyvalq* h = evhttp_request_get_output_headers(s.req);
  if (s.fault == Fault::kNotSse) {
    evhttp_add_header(h, "Content-Type", "text/html; charset=utf-8");
    evbuffer* b = evbuffer_new();
    evbuffer_add_printf(
        b, "<html><body>speedmatrix-sim: this is not an event stream (sm_fault)</body></html>\n");
    evhttp_connection_set_closecb(s.conn, nullptr, nullptr);
    evhttp_send_reply(s.req, 200, "OK", b);
    evbuffer_free(b);
    streams_.erase(s.id);
    return false;
  }
  evhttp_add_header(h, "Content-Type", "text/event-stream");
  evhttp_add_header(h, "Cache-Control", "no-cache");
  // When the engine took the request (CLOCK_MONOTONIC): TTFT on the server's own clock.
  evhttp_add_header(h, "X-SM-Arrival-Ns", std::to_string(arrival_ns).c_str());
  evhttp_send_reply_start(s.req, 200, "OK");
  if (s.chat) {  // the role-only first chunk, as vLLM and SGLang send it
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
    evhttp_send_reply_chunk(s.req, out_);
  }
  return true;
}

void Server::handle_generate(evhttp_request* req, bool chat) {
  GenerateArgs a;
  a.chat = chat;
  if (!read_generate(req, a)) return;
  std::string err = engine_.validate(a.prompt, a.max_tokens);
  if (!err.empty()) return reply_error(req, 400, err, "BadRequestError");
  if (reply_fault_status(req, a.fault)) return;

  ns_t arrival_ns = clock_.now();  // the engine's submit time below is the same reading's moment
  RequestSpec spec;
  Stream& s = open_stream(req, a, spec);
  if (a.streaming && !start_stream_reply(s, arrival_ns)) return;
  if (opt_.unpaced) {
    pump_unpaced(s.id);
    return;
  }
  if (prof_.prefix_cache && prof_.mode == "batched") {
    // the chain over prompt + the answer it will generate; the prompt's blocks first
    std::vector<std::uint64_t> ids = a.ids;
    for (std::int64_t k = 0; k < s.out_tokens; ++k) ids.push_back(word_token_id(word_at(s.id, k)));
    spec.block_hashes = block_hashes(ids, prof_.block_size);
    const std::size_t prompt_blocks = a.ids.size() / static_cast<std::size_t>(prof_.block_size);
    spec.output_block_hashes.assign(spec.block_hashes.begin() + prompt_blocks,
                                    spec.block_hashes.end());
    spec.block_hashes.resize(prompt_blocks);
  }
  engine_.submit(spec);
  s.in_engine = true;
}

}  // namespace speedmatrix::sim
