// CurlTransport: the cell's streams on one libcurl multi handle driven by epoll,
// one transfer per request (http_common.hpp), finished ones filed as records.
#include "speedmatrix/http.hpp"

#include <curl/curl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include "http_common.hpp"

namespace speedmatrix {
namespace {

constexpr int kMaxEpollEvents = 1024;

}  // namespace

struct CurlTransport::Impl {
  HttpOptions opt;
  CellRecords& records;
  CellProgress* progress;
  CURLM* multi = nullptr;
  CURL* tmpl = nullptr;  // every request's options; each request gets a duplicate
  curl_slist* header_list = nullptr;
  int epfd = -1;
  int wakefd = -1;
  std::atomic<bool> woken{false};
  ns_t timer_ns = kNever;  // libcurl's requested timeout, absolute
  ns_t idle_ns = 0;
  ns_t sweep_every_ns = 0;
  ns_t next_sweep_ns = 0;
  long buffer_size = CURL_MAX_WRITE_SIZE;
  double lag_max_ms = 0;
  std::int64_t connections_opened = 0;
  // request id -> active transfer; only those in flight, so it does not grow with the window
  std::unordered_map<std::int32_t, Transfer*> by_id;
  std::vector<std::unique_ptr<Transfer>> all;
  std::vector<Transfer*> free_list;
  std::vector<Transfer*> active;                      // for the idle sweep
  std::vector<std::int32_t>* finished_out = nullptr;  // set while poll() runs
  std::vector<std::int32_t> pending_failures;         // failed in start(), reported by poll()

  Impl(HttpOptions o, CellRecords& r, CellProgress* p)
      : opt(std::move(o)), records(r), progress(p) {}

  ~Impl() {
    for (auto& t : all) {
      if (t->easy) {
        // Teardown: nothing useful to do with a failure here.
        if (t->id >= 0) (void)curl_multi_remove_handle(multi, t->easy);
        curl_easy_cleanup(t->easy);
      }
    }
    if (multi) curl_multi_cleanup(multi);
    if (tmpl) curl_easy_cleanup(tmpl);
    if (header_list) curl_slist_free_all(header_list);
    if (wakefd >= 0) close(wakefd);
    if (epfd >= 0) close(epfd);
  }

  RequestRecord& rec(std::int32_t id) { return records.requests[static_cast<std::size_t>(id)]; }

  // --- libcurl callbacks ---------------------------------------------------
  static int on_socket(CURL*, curl_socket_t s, int what, void* userp, void* socketp) {
    auto* self = static_cast<Impl*>(userp);
    if (what == CURL_POLL_REMOVE) {
      if (socketp) {
        // The socket may be closed already (EBADF): nothing left to watch.
        epoll_ctl(self->epfd, EPOLL_CTL_DEL, s, nullptr);
        if (curl_multi_assign(self->multi, s, nullptr) != CURLM_OK) return -1;
      }
      return 0;
    }
    epoll_event ev{};
    ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u);
    ev.data.fd = s;
    // -1 tells libcurl the socket cannot be watched: its transfers fail
    // instead of waiting forever.
    if (socketp) {
      if (epoll_ctl(self->epfd, EPOLL_CTL_MOD, s, &ev) != 0 &&
          (errno != ENOENT || epoll_ctl(self->epfd, EPOLL_CTL_ADD, s, &ev) != 0))
        return -1;
    } else {
      if (epoll_ctl(self->epfd, EPOLL_CTL_ADD, s, &ev) != 0 &&
          (errno != EEXIST || epoll_ctl(self->epfd, EPOLL_CTL_MOD, s, &ev) != 0))
        return -1;
      // Any non-null marker: "this socket is in our epoll set".
      if (curl_multi_assign(self->multi, s, self) != CURLM_OK) return -1;
    }
    return 0;
  }

  static int on_timer(CURLM*, long timeout_ms, void* userp) {
    auto* self = static_cast<Impl*>(userp);
    self->timer_ns = timeout_ms < 0 ? kNever : now_ns() + static_cast<ns_t>(timeout_ms) * 1'000'000;
    return 0;
  }

  static size_t on_header(char* ptr, size_t size, size_t nmemb, void* userp) {
    auto* t = static_cast<Transfer*>(userp);
    const size_t n = size * nmemb;
    Impl* self = t->engine;
    const ns_t now = now_ns();
    t->last_activity_ns = now;
    if (!t->headers_started) {
      t->headers_started = true;
      self->rec(t->id).first_byte_ns = now;
    }
    const std::string_view line(ptr, n);
    if (line.substr(0, 5) == "HTTP/") {
      // A status line (also after 1xx): restart header state.
      const std::size_t sp = line.find(' ');
      t->status = sp == std::string_view::npos ? 0 : std::strtol(line.data() + sp + 1, nullptr, 10);
      t->event_stream_type = false;
      t->content_encoding.clear();
      t->chunked = false;
      t->retry_after_ns = kNever;
    } else if (iequals_prefix(line, "retry-after:")) {
      t->retry_after_ns =
          parse_retry_after(line.substr(12), static_cast<std::int64_t>(time(nullptr)));
    } else if (iequals_prefix(line, "transfer-encoding:")) {
      // "chunked" is always the last coding when present (RFC 9112 6.1).
      std::string_view v = line.substr(18);
      while (!v.empty() && (v.back() == '\n' || v.back() == '\r' || v.back() == ' '))
        v.remove_suffix(1);
      t->chunked = v.size() >= 7 && iequals_prefix(v.substr(v.size() - 7), "chunked");
    } else if (iequals_prefix(line, "content-encoding:")) {
      std::string_view v = line.substr(17);
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      while (!v.empty() && (v.back() == '\n' || v.back() == '\r' || v.back() == ' '))
        v.remove_suffix(1);
      t->content_encoding = iequals_prefix(v, "identity") ? "" : std::string(v.substr(0, 40));
    } else if (iequals_prefix(line, "content-type:")) {
      std::string_view v = line.substr(13);
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      t->event_stream_type = iequals_prefix(v, "text/event-stream");
    }
    return n;
  }

  // Called once per send of the request, on a new or a reused connection; a
  // second call means libcurl re-sent it after the reused connection died
  // before any response byte (see Transfer).
  static int on_prereq(void* clientp, char*, char*, int, int) {
    auto* t = static_cast<Transfer*>(clientp);
    if (++t->sends > 1) t->engine->rec(t->id).retries = t->sends - 1;
    return CURL_PREREQFUNC_OK;
  }

  static size_t on_write(char* ptr, size_t size, size_t nmemb, void* userp) {
    auto* t = static_cast<Transfer*>(userp);
    const size_t n = size * nmemb;
    // One clock read per write callback, before any parsing, shared by every
    // event in the buffer. With transfer decoding off (acquire()), libcurl
    // calls back once per socket read, whatever number of HTTP chunks the
    // read carries, so the events that arrived together share one stamp. Not
    // once per socket_action: libcurl reads again in the same call while data
    // keeps arriving, and bytes that arrive later must not get an earlier stamp.
    t->last_activity_ns = t->last_read_ns = now_ns();
    if (!t->chunked) return t->on_data(std::string_view(ptr, n)) ? n : 0;
    switch (t->chunks.feed(ptr, n, *t)) {
      case ChunkedDecoder::Status::kOk:
      case ChunkedDecoder::Status::kDone:
        return n;
      case ChunkedDecoder::Status::kStopped:
        return 0;  // on_data set the verdict
      case ChunkedDecoder::Status::kError:
        t->err_kind = "bad_chunking";
        t->err_msg = std::string("malformed chunked encoding: ") + t->chunks.error();
        return 0;
    }
    return n;
  }

  // --- transfers -----------------------------------------------------------
  Transfer* acquire() {
    if (!free_list.empty()) {
      Transfer* t = free_list.back();
      free_list.pop_back();
      return t;
    }
    auto t = std::make_unique<Transfer>(opt.max_event_bytes, opt.api);
    t->engine = this;
    t->opt = &opt;
    t->records = &records;
    t->progress = progress;
    all.push_back(std::move(t));
    return all.back().get();
  }

  // The options every request shares, set once on the template handle.
  void make_template() {
    tmpl = curl_easy_init();
    if (!tmpl) throw std::runtime_error("curl_easy_init failed");
    CURL* e = tmpl;
    CURLcode rc = CURLE_OK;
    const char* failed = nullptr;
    auto set = [&](CURLoption o, auto v, const char* name) {
      if (rc == CURLE_OK && (rc = curl_easy_setopt(e, o, v)) != CURLE_OK) failed = name;
    };
    set(CURLOPT_URL, opt.url.c_str(), "CURLOPT_URL");
    set(CURLOPT_POST, 1L, "CURLOPT_POST");
    set(CURLOPT_HTTPHEADER, header_list, "CURLOPT_HTTPHEADER");
    // One stream per connection: cancelling one closes exactly its connection.
    set(CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1), "CURLOPT_HTTP_VERSION");
    set(CURLOPT_NOSIGNAL, 1L, "CURLOPT_NOSIGNAL");
    set(CURLOPT_TCP_NODELAY, 1L, "CURLOPT_TCP_NODELAY");
    set(CURLOPT_TCP_KEEPALIVE, 1L, "CURLOPT_TCP_KEEPALIVE");
    set(CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opt.connect_timeout_s * 1000),
        "CURLOPT_CONNECTTIMEOUT_MS");
    set(CURLOPT_BUFFERSIZE, buffer_size, "CURLOPT_BUFFERSIZE");
    // Raw chunked bodies: libcurl still follows the chunks to find the end of
    // the response (keep-alive), but calls back once per socket read instead
    // of once per chunk; Transfer::chunks decodes them (see on_write).
    set(CURLOPT_HTTP_TRANSFER_DECODING, 0L, "CURLOPT_HTTP_TRANSFER_DECODING");
    set(CURLOPT_WRITEFUNCTION, &Impl::on_write, "CURLOPT_WRITEFUNCTION");
    set(CURLOPT_HEADERFUNCTION, &Impl::on_header, "CURLOPT_HEADERFUNCTION");
    set(CURLOPT_PREREQFUNCTION, &Impl::on_prereq, "CURLOPT_PREREQFUNCTION");
    if (!opt.tls_verify) {
      set(CURLOPT_SSL_VERIFYPEER, 0L, "CURLOPT_SSL_VERIFYPEER");
      set(CURLOPT_SSL_VERIFYHOST, 0L, "CURLOPT_SSL_VERIFYHOST");
    }
    if (!opt.ca_file.empty()) set(CURLOPT_CAINFO, opt.ca_file.c_str(), "CURLOPT_CAINFO");
    if (rc != CURLE_OK)
      throw std::runtime_error(std::string("curl_easy_setopt(") + failed +
                               "): " + curl_easy_strerror(rc));
  }

  // A fresh easy handle for t's next request (see Transfer for why), pointed
  // at t and at the body. Returns "" or why it could not be made.
  std::string arm(Transfer* t, std::string_view body) {
    if (t->easy) curl_easy_cleanup(t->easy);
    t->easy = curl_easy_duphandle(tmpl);
    if (!t->easy) return "curl_easy_duphandle failed";
    CURL* e = t->easy;
    CURLcode rc = CURLE_OK;
    auto set = [&](CURLoption o, auto v) {
      if (rc == CURLE_OK) rc = curl_easy_setopt(e, o, v);
    };
    set(CURLOPT_WRITEDATA, t);
    set(CURLOPT_HEADERDATA, t);
    set(CURLOPT_PREREQDATA, t);
    set(CURLOPT_PRIVATE, t);
    set(CURLOPT_ERRORBUFFER, t->errbuf);
    // The body is sent from the caller's buffer: no copy per request.
    set(CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    set(CURLOPT_POSTFIELDS, body.data());
    if (rc != CURLE_OK) return std::string("curl_easy_setopt: ") + curl_easy_strerror(rc);
    return {};
  }

  void release(Transfer* t) {
    if (t->id >= 0) by_id.erase(t->id);
    t->id = -1;
    auto it = std::find(active.begin(), active.end(), t);
    if (it != active.end()) {
      *it = active.back();
      active.pop_back();
    }
    free_list.push_back(t);
  }

  // Fills the record of a transfer that ended (code from CURLMSG_DONE, or
  // `forced_kind` for our own stall/cancel verdicts), detaches it, and
  // reports it finished.
  void finish(Transfer* t, CURLcode code, const char* forced_kind, std::string forced_msg) {
    const ns_t now = now_ns();
    long new_connections = 0;
    if (curl_easy_getinfo(t->easy, CURLINFO_NUM_CONNECTS, &new_connections) == CURLE_OK) {
      connections_opened += new_connections;
    }
    if (const CURLMcode mc = curl_multi_remove_handle(multi, t->easy); mc != CURLM_OK)
      throw std::runtime_error(std::string("curl_multi_remove_handle: ") + curl_multi_strerror(mc));
    RequestRecord& r = rec(t->id);
    const StreamSummary& s = t->decoder.summary();
    r.http_status = static_cast<std::int32_t>(t->status);
    r.output_tokens = s.output_tokens;
    r.prompt_tokens = s.prompt_tokens;
    r.token_source = s.source;
    r.finish_reason = s.finish_reason;

    std::string kind;
    std::string msg;
    if (forced_kind) {
      kind = forced_kind;
      msg = std::move(forced_msg);
    } else if (!t->err_kind.empty()) {
      kind = t->err_kind;
      msg = t->err_msg;
      if (kind == "not_sse" && msg.empty()) msg = error_message_from_body(t->collected);
    } else if (t->status >= 400) {
      kind = "http_" + std::to_string(t->status);
      msg = t->collected.empty() ? "HTTP " + std::to_string(t->status)
                                 : error_message_from_body(t->collected);
      if (t->retry_after_ns != kNever) {
        const auto i = static_cast<std::size_t>(t->id);
        if (records.retry_after_ns.size() <= i) records.retry_after_ns.resize(i + 1, kNever);
        records.retry_after_ns[i] = t->retry_after_ns;
        msg += " (Retry-After " + std::to_string(t->retry_after_ns / 1'000'000) + " ms)";
      }
    } else if (t->stream_finished && (code == CURLE_OK || code == CURLE_PARTIAL_FILE ||
                                      code == CURLE_RECV_ERROR || code == CURLE_GOT_NOTHING)) {
      // Complete: the connection may have broken after the last event; the
      // stream was whole, so that does not make the request fail.
    } else if (code == CURLE_OK) {
      if (t->status != 0 && (t->status < 200 || t->status >= 300)) {
        kind = "transport";
        msg = "unexpected HTTP status " + std::to_string(t->status);
      } else if (t->body == Transfer::Body::kNotSse || t->body == Transfer::Body::kUnknown) {
        kind = "not_sse";
        msg = t->collected.empty() ? "empty response body" : error_message_from_body(t->collected);
      } else {
        kind = "incomplete_stream";
        msg = t->parser.has_partial() ? "the stream ended in the middle of an event"
                                      : "the stream ended without [DONE] or a finish reason";
      }
    } else {
      curl_off_t connect_us = 0;
      curl_easy_getinfo(t->easy, CURLINFO_CONNECT_TIME_T, &connect_us);
      kind = kind_of(code, connect_us > 0);
      msg = std::string(curl_easy_strerror(code));
      if (t->errbuf[0]) msg += std::string(": ") + t->errbuf;
    }

    if (kind.empty()) {
      r.outcome = Outcome::kOk;
      r.done_ns = t->last_read_ns != kNever ? t->last_read_ns : now;
    } else if (kind == "cancelled") {
      r.outcome = Outcome::kCancelled;
      r.done_ns = now;
    } else {
      r.outcome = Outcome::kError;
      r.error_kind = std::move(kind);
      r.error_message = one_line(std::move(msg));
      r.done_ns = now;
    }
    const std::int32_t id = t->id;
    release(t);
    // A cancellation is the caller's own act; everything else is reported by poll().
    if (finished_out && r.outcome != Outcome::kCancelled) finished_out->push_back(id);
  }

  void drain_messages() {
    int left = 0;
    while (CURLMsg* m = curl_multi_info_read(multi, &left)) {
      if (m->msg != CURLMSG_DONE) continue;
      Transfer* t = nullptr;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&t));
      const CURLcode code = m->data.result;  // read before remove_handle invalidates m
      if (t && t->id >= 0) finish(t, code, nullptr, {});
    }
  }

  void socket_action(curl_socket_t s, int mask) {
    int running = 0;
    const CURLMcode mc = curl_multi_socket_action(multi, s, mask, &running);
    if (mc != CURLM_OK && mc != CURLM_BAD_SOCKET) {
      throw std::runtime_error(std::string("curl_multi_socket_action: ") + curl_multi_strerror(mc));
    }
  }

  void sweep(ns_t now) {
    // Walk a copy: finish() edits `active`.
    std::vector<Transfer*> stalled;
    for (Transfer* t : active) {
      if (now - t->last_activity_ns > idle_ns) stalled.push_back(t);
    }
    for (Transfer* t : stalled) {
      finish(t, CURLE_OK, "stall",
             "no bytes for " + std::to_string(opt.idle_timeout_s) + " s (idle timeout)");
    }
  }
};

// ---------------------------------------------------------------------------
CurlTransport::CurlTransport(HttpOptions options, CellRecords& records, CellProgress* progress) {
  if (std::string why = check_url(options.url); !why.empty()) throw std::invalid_argument(why);
  impl_ = std::make_unique<Impl>(std::move(options), records, progress);
  Impl& m = *impl_;
  const HttpOptions& o = m.opt;

  m.epfd = epoll_create1(EPOLL_CLOEXEC);
  m.wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (m.epfd < 0 || m.wakefd < 0)
    throw std::runtime_error(std::string("epoll/eventfd: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = m.wakefd;
  if (epoll_ctl(m.epfd, EPOLL_CTL_ADD, m.wakefd, &ev) != 0)
    throw std::runtime_error(std::string("epoll_ctl: ") + std::strerror(errno));

  m.multi = curl_multi_init();
  if (!m.multi) throw std::runtime_error("curl_multi_init failed");
  const long n = std::max<long>(o.max_concurrency, 1);
  CURLMcode mc = CURLM_OK;
  auto mset = [&](CURLMoption opt, auto v) {
    if (mc == CURLM_OK) mc = curl_multi_setopt(m.multi, opt, v);
  };
  mset(CURLMOPT_SOCKETFUNCTION, &Impl::on_socket);
  mset(CURLMOPT_SOCKETDATA, &m);
  mset(CURLMOPT_TIMERFUNCTION, &Impl::on_timer);
  mset(CURLMOPT_TIMERDATA, &m);
  // Never cap connections below the concurrency, and keep them all cached so
  // every refill reuses its kept-alive connection.
  mset(CURLMOPT_MAX_HOST_CONNECTIONS, 0L);
  mset(CURLMOPT_MAX_TOTAL_CONNECTIONS, 0L);
  mset(CURLMOPT_MAXCONNECTS, n + 16);
  if (mc != CURLM_OK)
    throw std::runtime_error(std::string("curl_multi_setopt: ") + curl_multi_strerror(mc));

  // Receive buffer: large for few streams (long non-streamed error bodies,
  // fat chunks), bounded in total for thousands. libcurl allocates it per easy
  // handle, so per request, and only what reads touch becomes resident: the
  // ceiling is the total. 64 MB in total was 64 of the soak's 94 MB of heap in
  // use (1024 streams); SSE reads are a few hundred bytes, so 16 MB in total
  // (16 KB a stream at 1024) costs nothing and lowers the ceiling.
  m.buffer_size = std::clamp<long>((16L << 20) / n, 4L << 10, 512L << 10);

  // Headers built once and shared by every transfer. "Expect:" turns off
  // 100-continue, which would stall a large prompt upload for a round trip.
  auto add = [&](const std::string& h) {
    curl_slist* l = curl_slist_append(m.header_list, h.c_str());
    if (!l) throw std::runtime_error("curl_slist_append failed");
    m.header_list = l;
  };
  add("Content-Type: application/json");
  add("Accept: text/event-stream");
  add("Expect:");
  if (!o.api_key.empty()) add("Authorization: Bearer " + o.api_key);
  for (const std::string& h : o.headers) add(h);

  m.make_template();

  m.idle_ns = static_cast<ns_t>(std::max(o.idle_timeout_s, 0.001) * 1e9);
  m.sweep_every_ns = std::clamp<ns_t>(m.idle_ns / 10, 5'000'000, 250'000'000);
  m.next_sweep_ns = now_ns() + m.sweep_every_ns;
}

CurlTransport::~CurlTransport() = default;

void CurlTransport::start(std::int32_t id, std::string_view body) {
  Impl& m = *impl_;
  Transfer* t = m.acquire();
  const ns_t now = now_ns();
  t->reset_for(id, m.opt.api, now);
  m.by_id[id] = t;
  m.active.push_back(t);
  RequestRecord& r = m.rec(id);
  r.sent_ns = now;
  if (std::string why = m.arm(t, body); !why.empty()) {
    r.outcome = Outcome::kError;
    r.error_kind = "transport";
    r.error_message = std::move(why);
    r.done_ns = now;
    m.release(t);
    // Reported at the next poll, as the contract says.
    m.pending_failures.push_back(id);
    return;
  }
  const CURLMcode mc = curl_multi_add_handle(m.multi, t->easy);
  if (mc != CURLM_OK) {
    r.outcome = Outcome::kError;
    r.error_kind = "transport";
    r.error_message = std::string("curl_multi_add_handle: ") + curl_multi_strerror(mc);
    r.done_ns = now;
    m.release(t);
    m.pending_failures.push_back(id);
  }
}

void CurlTransport::cancel(std::int32_t id) {
  Impl& m = *impl_;
  const auto it = m.by_id.find(id);
  if (it == m.by_id.end()) return;
  Transfer* t = it->second;
  // Removing an unfinished transfer closes its connection: the server sees
  // the disconnect and can abort the request.
  m.finish(t, CURLE_OK, "cancelled", {});
}

void CurlTransport::poll(ns_t deadline_ns, std::vector<std::int32_t>& finished) {
  Impl& m = *impl_;
  const std::size_t before = finished.size();
  m.finished_out = &finished;
  finished.insert(finished.end(), m.pending_failures.begin(), m.pending_failures.end());
  m.pending_failures.clear();
  epoll_event events[kMaxEpollEvents];
  for (;;) {
    ns_t now = now_ns();
    if (m.timer_ns != kNever && m.timer_ns <= now) {
      m.timer_ns = kNever;
      m.socket_action(CURL_SOCKET_TIMEOUT, 0);
      m.drain_messages();
      continue;
    }
    if (now >= m.next_sweep_ns) {
      m.sweep(now);
      m.next_sweep_ns = now + m.sweep_every_ns;
    }
    if (finished.size() > before || now >= deadline_ns || m.woken.exchange(false)) break;

    ns_t wake_at = std::min(deadline_ns, m.next_sweep_ns);
    if (m.timer_ns != kNever) wake_at = std::min(wake_at, m.timer_ns);
    const ns_t wait = std::max<ns_t>(wake_at - now, 0);
    const timespec ts{static_cast<time_t>(wait / 1'000'000'000),
                      static_cast<long>(wait % 1'000'000'000)};
    const int n = epoll_pwait2(m.epfd, events, kMaxEpollEvents, &ts, nullptr);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("epoll_pwait2: ") + std::strerror(errno));
    }
    if (n == 0) {
      const double lag_ms = static_cast<double>(now_ns() - wake_at) / 1e6;
      m.lag_max_ms = std::max(m.lag_max_ms, lag_ms);
      continue;
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == m.wakefd) {
        std::uint64_t v;
        while (read(m.wakefd, &v, sizeof v) > 0) {
        }
        m.woken.store(true);
        continue;
      }
      const std::uint32_t e = events[i].events;
      const int mask = (e & EPOLLIN ? CURL_CSELECT_IN : 0) | (e & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                       (e & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
      m.socket_action(fd, mask);
    }
    m.drain_messages();
  }
  m.finished_out = nullptr;
}

void CurlTransport::wake() noexcept {
  const std::uint64_t one = 1;
  impl_->woken.store(true);
  [[maybe_unused]] ssize_t r = write(impl_->wakefd, &one, sizeof one);
}

double CurlTransport::loop_lag_max_ms() const noexcept { return impl_->lag_max_ms; }

std::int64_t CurlTransport::connections_opened() const noexcept {
  return impl_->connections_opened;
}

}  // namespace speedmatrix
