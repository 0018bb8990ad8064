// A tiny HTTP/1.1 server on 127.0.0.1 for the engine's tests: one thread per
// connection, keep-alive, and handlers that stream SSE with chosen timing and
// faults. Test-only; blocking sockets keep it short.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "speedmatrix/clock.hpp"

namespace speedmatrix::testing {

struct HttpRequest {
  std::string method, path, body;
  std::map<std::string, std::string> query;
  std::map<std::string, std::string> headers;  // names lower-cased
  int query_int(const std::string& k, int dflt) const {
    auto it = query.find(k);
    return it == query.end() ? dflt : std::atoi(it->second.c_str());
  }
};

class Conn {
 public:
  explicit Conn(int fd, const std::atomic<bool>& stop) : fd_(fd), stop_(stop) {}
  bool send_all(std::string_view s) {
    while (!s.empty()) {
      const ssize_t n = ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return closed_ = true, false;
      s.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }
  bool start_sse() {
    return send_all(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
  }
  bool chunk(std::string_view s) {
    char len[32];
    std::snprintf(len, sizeof len, "%zx\r\n", s.size());
    return send_all(std::string(len) + std::string(s) + "\r\n");
  }
  bool end_chunks() { return send_all("0\r\n\r\n"); }
  // `extra`: more header lines, each ending "\r\n".
  void respond(int status, std::string_view type, std::string_view body,
               std::string_view extra = {}) {
    send_all("HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: " + std::string(type) +
             "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + std::string(extra) +
             "\r\n" + std::string(body));
  }
  // Abortive close: the server closes the socket after the handler returns,
  // and with a zero linger the peer gets a RST instead of a FIN.
  void reset() {
    linger l{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    closed_ = true;
  }
  void close_after() { closed_ = true; }
  // Waits up to `ms`; false when the client went away (or the server stops).
  bool wait_ms(int ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      if (stop_) return false;
      const auto left_us = std::chrono::duration_cast<std::chrono::microseconds>(
                               until - std::chrono::steady_clock::now())
                               .count();
      if (left_us <= 0) return true;
      pollfd p{fd_, POLLIN | POLLRDHUP, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<long>((left_us + 999) / 1000, 20))) > 0) {
        char c;
        if (::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) <= 0) return closed_ = true, false;
      }
    }
  }
  bool closed() const { return closed_; }
  int fd() const { return fd_; }

 private:
  int fd_;
  const std::atomic<bool>& stop_;
  bool closed_ = false;
};

class LoopbackServer {
 public:
  using Handler = std::function<void(Conn&, const HttpRequest&)>;

  explicit LoopbackServer(Handler h) : handler_(std::move(h)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_fd_, 4096) != 0) {
      std::perror("loopback server");
      std::abort();
    }
    socklen_t len = sizeof a;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  ~LoopbackServer() {
    stop_ = true;
    accept_thread_.join();
    ::close(listen_fd_);
    {
      // Not held while joining: a finishing handler takes mu_ in finish().
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : fds_) {
        if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
      }
    }
    for (auto& t : threads_) t.join();
  }

  int port() const { return port_; }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }

  std::atomic<int> connections{0};
  std::atomic<int> requests{0};
  // Closes a kept-alive connection the way llama.cpp's server (cpp-httplib)
  // can: the next request arrives just as the server gives the connection up,
  // so it is read and answered with a close, no response byte. Set before the
  // first request; counts the requests it dropped so.
  std::atomic<bool> drop_reused{false};
  std::atomic<int> dropped{0};
  std::mutex last_mu;
  HttpRequest last;  // the last request received (under last_mu)

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      ++connections;
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(fd);
      threads_.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    std::string buf;
    char tmp[65536];
    Conn conn(fd, stop_);
    int served = 0;  // requests answered on this connection
    while (!stop_ && !conn.closed()) {
      // Headers.
      std::size_t end;
      while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
        const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
        if (n <= 0) return finish(fd);
        buf.append(tmp, static_cast<std::size_t>(n));
      }
      HttpRequest req;
      const std::string head = buf.substr(0, end);
      buf.erase(0, end + 4);
      const std::size_t sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
      req.method = head.substr(0, sp1);
      std::string target = head.substr(sp1 + 1, sp2 - sp1 - 1);
      if (const std::size_t q = target.find('?'); q != std::string::npos) {
        std::string qs = target.substr(q + 1);
        target.resize(q);
        std::size_t pos = 0;
        while (pos <= qs.size()) {
          std::size_t amp = qs.find('&', pos);
          if (amp == std::string::npos) amp = qs.size();
          const std::string kv = qs.substr(pos, amp - pos);
          if (const std::size_t eq = kv.find('='); eq != std::string::npos)
            req.query[kv.substr(0, eq)] = kv.substr(eq + 1);
          pos = amp + 1;
        }
      }
      req.path = target;
      std::size_t line = head.find("\r\n");
      while (line != std::string::npos) {
        const std::size_t next = head.find("\r\n", line + 2);
        const std::string h =
            head.substr(line + 2, next == std::string::npos ? std::string::npos : next - line - 2);
        if (const std::size_t c = h.find(':'); c != std::string::npos) {
          std::string k = h.substr(0, c);
          for (char& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
          std::string v = h.substr(c + 1);
          while (!v.empty() && v.front() == ' ') v.erase(0, 1);
          req.headers[k] = v;
        }
        line = next;
      }
      // Body.
      const std::size_t want =
          req.headers.count("content-length") ? std::stoul(req.headers["content-length"]) : 0;
      while (buf.size() < want) {
        const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
        if (n <= 0) return finish(fd);
        buf.append(tmp, static_cast<std::size_t>(n));
      }
      req.body = buf.substr(0, want);
      buf.erase(0, want);
      ++requests;
      {
        std::lock_guard<std::mutex> lock(last_mu);
        last = req;
      }
      if (drop_reused && served > 0) {
        ++dropped;
        // cpp-httplib's drain_and_close_socket(): FIN first, then close.
        ::shutdown(fd, SHUT_WR);
        break;
      }
      ++served;
      handler_(conn, req);
      if (conn.closed()) break;
    }
    finish(fd);
  }

  void finish(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int& f : fds_) {
      if (f == fd) {
        ::close(fd);
        f = -1;
      }
    }
  }

  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
};

// --- SSE payloads in the OpenAI completions shape ---------------------------
inline std::string sse_data(std::string_view json) { return "data: " + std::string(json) + "\n\n"; }
inline std::string token_event(std::string_view text, ns_t stamp = -1) {
  std::string j = R"({"object":"text_completion","choices":[{"index":0,"text":")" +
                  std::string(text) + R"(","finish_reason":null}])";
  if (stamp >= 0) j += R"(,"sm_t_ns":)" + std::to_string(stamp);
  return sse_data(j + "}");
}
inline std::string finish_event(int completion_tokens, int prompt_tokens = 7) {
  return sse_data(
             R"({"object":"text_completion","choices":[{"index":0,"text":"","finish_reason":"length"}]})") +
         sse_data(R"({"object":"text_completion","choices":[],"usage":{"prompt_tokens":)" +
                  std::to_string(prompt_tokens) + R"(,"completion_tokens":)" +
                  std::to_string(completion_tokens) + R"(,"total_tokens":)" +
                  std::to_string(prompt_tokens + completion_tokens) + "}}") +
         "data: [DONE]\n\n";
}

// The routes the tests use. Query: n (tokens), itl_ms, ttft_ms.
//   /sse       n tokens ITL apart after ttft_ms, finish + usage + [DONE]; a body
//              "n=K" overrides n (bodies of one cell answer at their own lengths)
//   /500       a JSON error body        /json      200 application/json (not SSE)
//   /malformed a broken event           /nodone    tokens, then the stream just ends
//   /reset     tokens, then a RST       /stall     one token, then silence
//   /big       one event of n bytes     /error_event an error object mid-stream
//   /upload    one token whose text is the received body size
//   /burst     n token events, each its own HTTP chunk, in one write; then finish
//   /unchunked n tokens ITL apart with no Transfer-Encoding (body ends at close)
//   /badchunk  one token, then a chunk whose size line is not hexadecimal
//   /metrics   a Prometheus page
//   /429, /503 that status with a JSON error; ra=V adds "Retry-After: V"
// Every token event is stamped with its send time (sm_t_ns), also kept in
// log.sent_ns.
struct RouteLog {
  std::atomic<int> disconnects{0};  // handlers that saw the client go away mid-stream
  std::mutex mu;
  std::vector<ns_t> sent_ns;
};

inline LoopbackServer::Handler openai_routes(RouteLog& log) {
  return [&log](Conn& c, const HttpRequest& r) {
    const int itl = r.query_int("itl_ms", 10), ttft = r.query_int("ttft_ms", 0);
    const int n = r.body.rfind("n=", 0) == 0 ? std::atoi(r.body.c_str() + 2) : r.query_int("n", 5);
    auto stamp_token = [&](int i) {
      const ns_t t = now_ns();
      {
        std::lock_guard<std::mutex> lock(log.mu);
        log.sent_ns.push_back(t);
      }
      return c.chunk(token_event("w" + std::to_string(i), t));
    };
    auto gone = [&] { ++log.disconnects; };
    if (r.path == "/sse") {
      c.start_sse();
      if (ttft && !c.wait_ms(ttft)) return gone();
      for (int i = 0; i < n; ++i) {
        if (i && !c.wait_ms(itl)) return gone();
        if (!stamp_token(i)) return gone();
      }
      c.chunk(finish_event(n));
      c.end_chunks();
    } else if (r.path == "/500") {
      c.respond(500, "application/json",
                R"({"error":{"message":"engine overloaded","type":"server_error","code":500}})");
    } else if (r.path == "/429" || r.path == "/503") {
      const auto ra = r.query.find("ra");
      // '+' stands for a space in an HTTP-date given in the query
      std::string v = ra == r.query.end() ? std::string() : ra->second;
      for (char& ch : v) ch = ch == '+' ? ' ' : ch;
      c.respond(r.path == "/429" ? 429 : 503, "application/json",
                R"({"error":{"message":"slow down","type":"rate_limit","code":429}})",
                v.empty() ? std::string() : "Retry-After: " + v + "\r\n");
    } else if (r.path == "/json") {
      c.respond(200, "application/json", R"({"id":"x","choices":[{"text":"not streamed"}]})");
    } else if (r.path == "/malformed") {
      c.start_sse();
      stamp_token(0);
      c.chunk("data: {\"choices\":[{\"text\":\"broken\n\n");
      c.end_chunks();
    } else if (r.path == "/nodone") {
      c.start_sse();
      stamp_token(0);
      stamp_token(1);
      c.end_chunks();
    } else if (r.path == "/reset") {
      c.start_sse();
      stamp_token(0);
      stamp_token(1);
      c.wait_ms(20);
      c.reset();
    } else if (r.path == "/stall") {
      c.start_sse();
      stamp_token(0);
      if (!c.wait_ms(5000)) return gone();
      c.close_after();
    } else if (r.path == "/big") {
      c.start_sse();
      c.chunk(token_event(std::string(static_cast<std::size_t>(n), 'x')));
      c.chunk(finish_event(1));
      c.end_chunks();
    } else if (r.path == "/error_event") {
      c.start_sse();
      stamp_token(0);
      c.chunk(sse_data(R"({"error":{"message":"out of KV cache","type":"internal","code":500}})"));
      c.end_chunks();
    } else if (r.path == "/upload") {
      c.start_sse();
      c.chunk(token_event(std::to_string(r.body.size())));
      c.chunk(finish_event(1));
      c.end_chunks();
    } else if (r.path == "/burst") {
      c.start_sse();
      std::string wire;
      const ns_t t = now_ns();
      for (int i = 0; i < n; ++i) {
        const std::string ev = token_event("w" + std::to_string(i), t);
        char len[32];
        std::snprintf(len, sizeof len, "%zx\r\n", ev.size());
        wire += std::string(len) + ev + "\r\n";
      }
      c.send_all(wire);
      c.chunk(finish_event(n));
      c.end_chunks();
    } else if (r.path == "/unchunked") {
      c.send_all("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n");
      for (int i = 0; i < n; ++i) {
        if (i && !c.wait_ms(itl)) return gone();
        c.send_all(token_event("w" + std::to_string(i), now_ns()));
      }
      c.send_all(finish_event(n));
      c.close_after();
    } else if (r.path == "/badchunk") {
      c.start_sse();
      stamp_token(0);
      c.send_all("zz\r\nxx\r\n");
      c.close_after();
    } else if (r.path == "/metrics") {
      c.respond(200, "text/plain; version=0.0.4",
                "# TYPE sglang:num_running_reqs gauge\n"
                "sglang:num_running_reqs{tp_rank=\"0\"} 3\n"
                "sglang:num_running_reqs{tp_rank=\"1\"} 4\n"
                "sglang:num_queue_reqs 1\n"
                "sglang:token_usage{dp_rank=\"0\"} 0.25\n"
                "sglang:token_usage{dp_rank=\"1\"} 0.75\n");
    } else {
      c.respond(404, "text/plain", "no such route");
    }
  };
}

// A port on 127.0.0.1 where nothing listens (connections are refused).
inline int refused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace speedmatrix::testing
