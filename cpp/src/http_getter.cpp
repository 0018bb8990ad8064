// HttpGetter: one blocking GET at a time on a kept-alive connection (the cell's
// /metrics sampler), with the transport's headers and TLS settings.
#include <curl/curl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "http_common.hpp"

namespace speedmatrix {

struct HttpGetter::Impl {
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  std::string body;
  std::string init_error;  // why the handle cannot be used; get() reports it
  char errbuf[CURL_ERROR_SIZE];

  static size_t on_write(char* ptr, size_t size, size_t nmemb, void* userp) {
    auto* self = static_cast<Impl*>(userp);
    const size_t n = size * nmemb;
    if (self->body.size() + n > (64u << 20)) return 0;  // a /metrics page is never this large
    self->body.append(ptr, n);
    return n;
  }
};

HttpGetter::HttpGetter(std::vector<std::string> headers, std::string api_key, double timeout_s,
                       bool tls_verify, const std::string& ca_file)
    : impl_(std::make_unique<Impl>()) {
  global_init();
  impl_->easy = curl_easy_init();
  if (!impl_->easy) {
    impl_->init_error = "curl_easy_init failed";
    return;
  }
  if (!api_key.empty()) headers.push_back("Authorization: Bearer " + api_key);
  for (const std::string& h : headers) {
    curl_slist* l = curl_slist_append(impl_->headers, h.c_str());
    if (!l) {
      impl_->init_error = "curl_slist_append failed";
      return;
    }
    impl_->headers = l;
  }
  CURL* e = impl_->easy;
  CURLcode rc = CURLE_OK;
  auto set = [&](CURLoption o, auto v) {
    if (rc == CURLE_OK) rc = curl_easy_setopt(e, o, v);
  };
  set(CURLOPT_HTTPHEADER, impl_->headers);
  set(CURLOPT_NOSIGNAL, 1L);
  set(CURLOPT_TCP_NODELAY, 1L);
  set(CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_s * 1000));
  set(CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout_s * 1000));
  set(CURLOPT_ACCEPT_ENCODING, "");
  set(CURLOPT_WRITEFUNCTION, &Impl::on_write);
  set(CURLOPT_WRITEDATA, impl_.get());
  set(CURLOPT_ERRORBUFFER, impl_->errbuf);
  if (!tls_verify) {
    set(CURLOPT_SSL_VERIFYPEER, 0L);
    set(CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!ca_file.empty()) set(CURLOPT_CAINFO, ca_file.c_str());
  if (rc != CURLE_OK)
    impl_->init_error = std::string("curl_easy_setopt: ") + curl_easy_strerror(rc);
}

HttpGetter::~HttpGetter() {
  if (impl_->easy) curl_easy_cleanup(impl_->easy);
  if (impl_->headers) curl_slist_free_all(impl_->headers);
}

bool HttpGetter::get(const std::string& url, std::string* body, std::string* error) {
  Impl& m = *impl_;
  if (!m.init_error.empty()) {
    if (error) *error = m.init_error;
    return false;
  }
  m.body.clear();
  m.errbuf[0] = '\0';
  CURLcode rc = curl_easy_setopt(m.easy, CURLOPT_URL, url.c_str());
  if (rc == CURLE_OK) rc = curl_easy_perform(m.easy);
  if (rc != CURLE_OK) {
    if (error)
      *error = one_line(std::string(curl_easy_strerror(rc)) +
                        (m.errbuf[0] ? std::string(": ") + m.errbuf : ""));
    return false;
  }
  long status = 0;
  if (curl_easy_getinfo(m.easy, CURLINFO_RESPONSE_CODE, &status) != CURLE_OK) status = 0;
  if (status < 200 || status >= 300) {
    if (error) *error = "HTTP " + std::to_string(status);
    return false;
  }
  if (body) body->swap(m.body);
  return true;
}

}  // namespace speedmatrix
