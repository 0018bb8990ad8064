// Error messages of the OpenAI-compatible servers: one line from any text, and the
// non-streaming error bodies (an HTTP 4xx/5xx answer) of every shape servers use.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "openai_detail.hpp"
#include "speedmatrix/openai.hpp"

namespace speedmatrix {

namespace detail {

constexpr std::size_t kMaxMessageBytes = 500;  // one_line's bound

std::string one_line(std::string_view in) {
  std::string out;
  out.reserve(std::min(in.size(), kMaxMessageBytes));
  bool space = false;
  for (unsigned char c : in) {
    if (c < 0x20 || c == 0x7f || c == ' ') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += static_cast<char>(c);
    if (out.size() > kMaxMessageBytes) break;
  }
  if (out.size() > kMaxMessageBytes) {
    std::size_t cut = kMaxMessageBytes - 3;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
    out.resize(cut);
    out += "...";
  }
  return out;
}

}  // namespace detail

using detail::one_line;

// ---------------------------------------------------------------------------
// Non-streaming error bodies (cold path).

namespace {

std::string json_scalar_text(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_null()) return "";
  return j.dump();
}

// FastAPI validation errors: "detail": [{"loc": [...], "msg": "...", "type":
// "..."}].
std::string detail_text(const nlohmann::json& d) {
  if (!d.is_array()) return json_scalar_text(d);
  std::string out;
  for (const auto& item : d) {
    if (!out.empty()) out += "; ";
    if (item.is_object() && item.contains("msg")) {
      if (item.contains("loc") && item["loc"].is_array()) {
        std::string loc;
        for (const auto& l : item["loc"]) loc += (loc.empty() ? "" : ".") + json_scalar_text(l);
        out += loc + ": ";
      }
      out += json_scalar_text(item["msg"]);
    } else {
      out += json_scalar_text(item);
    }
  }
  return out;
}

// "message [type, code=...]" plus the context-size figures llama.cpp adds.
std::string format_error_object(const nlohmann::json& o) {
  std::string msg = o.contains("message") ? json_scalar_text(o["message"]) : "";
  if (msg.empty() && o.contains("detail")) msg = detail_text(o["detail"]);
  if (msg.empty() && o.contains("msg")) msg = json_scalar_text(o["msg"]);
  std::string extra;
  auto add = [&](const char* key, const std::string& value) {
    if (value.empty() || msg.find(value) != std::string::npos) return;
    extra += (extra.empty() ? "" : ", ") + std::string(key) + value;
  };
  if (o.contains("type")) add("", json_scalar_text(o["type"]));
  if (o.contains("error_type")) add("", json_scalar_text(o["error_type"]));
  if (o.contains("code")) add("code=", json_scalar_text(o["code"]));
  for (const char* k : {"n_prompt_tokens", "n_ctx"}) {
    if (o.contains(k)) add((std::string(k) + "=").c_str(), json_scalar_text(o[k]));
  }
  if (msg.empty()) msg = o.dump();
  return extra.empty() ? msg : msg + " [" + extra + "]";
}

}  // namespace

std::string error_message_from_body(std::string_view body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return one_line(body);
  std::string msg;
  if (j.is_object()) {
    auto it = j.find("error");
    if (it != j.end() && it->is_object()) {
      msg = format_error_object(*it);  // {"error": {"message", "type", "code"}}
    } else if (it != j.end() && it->is_string()) {
      nlohmann::json o = {{"message", *it}};  // TGI / Ollama: {"error": "text", "error_type": ...}
      if (j.contains("error_type")) o["error_type"] = j["error_type"];
      msg = format_error_object(o);
    } else if (j.contains("message") || j.contains("detail") || j.contains("msg")) {
      msg = format_error_object(j);  // {"object": "error", "message", ...}, FastAPI {"detail"}
    } else {
      msg = j.dump();
    }
  } else if (j.is_string()) {
    msg = j.get<std::string>();
  } else {
    msg = j.dump();
  }
  return one_line(msg);
}

}  // namespace speedmatrix
