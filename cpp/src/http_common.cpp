// libcurl's process-wide set-up, and the pure pieces of HTTP the core reads:
// Retry-After, a cell's URL, header names and libcurl's error kinds.
#include "http_common.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <ctime>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>

namespace speedmatrix {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
      throw std::runtime_error("curl_global_init failed");
  });
}

std::string one_line(std::string s, std::size_t max) {
  for (char& c : s) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  if (s.size() > max) s.resize(max);
  return s;
}

ns_t parse_retry_after(std::string_view value, std::int64_t now_unix_s) {
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == '\n' || value.back() == '\r' || value.back() == ' ' ||
                            value.back() == '\t'))
    value.remove_suffix(1);
  if (value.empty() || value.size() > 64) return kNever;
  constexpr std::int64_t kMostS = 365LL * 24 * 3600;  // beyond any bound applied to it
  if (std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    std::int64_t s = 0;
    for (char c : value) {
      s = s * 10 + (c - '0');
      if (s > kMostS) return kMostS * 1'000'000'000;
    }
    return s * 1'000'000'000;
  }
  // An HTTP-date (RFC 9110 10.2.3), read by libcurl's date parser; measured
  // against the wall clock, so a client with a wrong clock gets a wrong wait
  // (bounded by the caller's cap).
  global_init();
  const std::string date(value);
  const time_t at = curl_getdate(date.c_str(), nullptr);
  if (at == static_cast<time_t>(-1)) return kNever;
  const std::int64_t s =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(at) - now_unix_s, 0, kMostS);
  return s * 1'000'000'000;
}

std::string check_url(const std::string& url) {
  global_init();
  CURLU* u = curl_url();
  if (!u) return "out of memory";
  std::string why;
  const CURLUcode rc = curl_url_set(u, CURLUPART_URL, url.c_str(), 0);
  if (rc != CURLUE_OK) {
    why = std::string("invalid URL: ") + curl_url_strerror(rc);
  } else {
    char* scheme = nullptr;
    if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK && scheme) {
      const std::string_view s(scheme);
      if (s != "http" && s != "https")
        why = "unsupported URL scheme " + std::string(s) + " (http or https)";
      curl_free(scheme);
    }
  }
  curl_url_cleanup(u);
  return why;
}

bool iequals_prefix(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    char a = s[i];
    if (a >= 'A' && a <= 'Z') a = static_cast<char>(a - 'A' + 'a');
    if (a != prefix[i]) return false;
  }
  return true;
}

const char* kind_of(CURLcode code, bool connected) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
      return "connect";
    case CURLE_OPERATION_TIMEDOUT:
      return connected ? "stall" : "connect_timeout";
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_SSL_SHUTDOWN_FAILED:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CLIENTCERT:
    case CURLE_USE_SSL_FAILED:
      return "tls";
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
      return "connection_reset";
    default:
      return "transport";
  }
}

}  // namespace speedmatrix
