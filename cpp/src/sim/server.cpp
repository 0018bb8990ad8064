// The built-in engine's HTTP side: one libevent loop, evhttp for HTTP/1.1, a
// timer that fires at the engine model's next absolute deadline, chunked
// streaming replies and disconnect detection (close -> abort). This file: the
// loop, the listening socket, HTTP plumbing and routing (server_impl.hpp names
// the other parts).
#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "server_impl.hpp"

namespace speedmatrix::sim {

using nlohmann::json;

Server* g_server = nullptr;

namespace {

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

}  // namespace

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

// --- loop ------------------------------------------------------------------------

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

int run_server(const ServerOptions& opts) {
  signal(SIGPIPE, SIG_IGN);
  Server s(opts);
  return s.run();
}

}  // namespace speedmatrix::sim
