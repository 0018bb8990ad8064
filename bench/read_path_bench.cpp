// The client's read path, libcurl against a direct socket, side by side on the same engine and
// streams (issue 22; docs/PERFORMANCE.md "The read path"). A benchmark, not a test.
//
//   read_path_bench [--duration 3] [--repeats 3] [--cases 64:fixed,512:lockstep]
//                   [--max-tokens 4000] [--url http://127.0.0.1:PORT] [--no-ts]
//
// For each case (N streams against `speedmatrix-sim --profile P --stamp`, started here unless
// --url names a running one) it runs, alternating, repeats times:
//   curl    the core itself: a CellRunner (one libcurl multi handle, socket callbacks, one loop
//           on its own thread), the same code as every cell
//   direct  one non-blocking socket per stream and one epoll (level-triggered), one recv() per
//           readiness into a 64 KiB buffer, the core's ChunkedDecoder, SseParser and
//           OpenAIStreamDecoder; no poll() after a read
//   ts      direct, with recvmsg() and SO_TIMESTAMPNS: the kernel's receive time of the last
//           segment each read took, so the delay splits into engine -> kernel and the wait in
//           the socket before the read
// Each measures over the same kind of window: it opens 0.3 s after every stream has had a token
// and lasts --duration; CPU is the loop thread's CPU time in the window, tokens those that
// arrived in it, delay = arrival (CLOCK_MONOTONIC after the read) - the engine's sm_t_ns send
// stamp. Ratios are taken within each repeat (the runs of one repeat are back to back).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "speedmatrix/cell.hpp"
#include "speedmatrix/chunked.hpp"
#include "speedmatrix/clock.hpp"
#include "speedmatrix/openai.hpp"
#include "speedmatrix/sse.hpp"

using namespace speedmatrix;

namespace {

constexpr ns_t kSettleNs = 300'000'000;  // the window opens this long after every stream streams

struct Figures {
  double cpu_us_per_token = NAN;         // the process's CPU time (all its threads)
  double thread_cpu_us_per_token = NAN;  // the loop thread's alone
  double p50_ms = NAN, p99_ms = NAN;     // arrival - sm_t_ns
  double tok_s = 0;
  std::int64_t tokens = 0;
  // ts only: engine send -> kernel receive, and kernel receive -> user read
  double kern_p50_ms = NAN, kern_p99_ms = NAN, wait_p50_ms = NAN, wait_p99_ms = NAN;
  double engine_cores = NAN;   // the engine process's CPU time / the window (when started here)
  double machine_cores = NAN;  // busy CPU time of the whole machine (/proc/stat) / the window
  double reads_per_token = NAN, waits_per_token = NAN;  // direct paths: recv and epoll_wait calls
  std::string error;
};

pid_t g_sim_pid = -1;  // the engine, when this process started it

// CPU seconds so far: the engine's (utime + stime) and the machine's busy time (all CPUs).
struct Probe {
  double engine_s = NAN, busy_s = NAN;
};

Probe probe() {
  Probe p;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (FILE* f = std::fopen("/proc/stat", "r")) {
    unsigned long long v[8] = {};
    if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                    &v[4], &v[5], &v[6], &v[7]) == 8)
      p.busy_s = static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tick;
    std::fclose(f);
  }
  if (g_sim_pid > 0) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(g_sim_pid));
    if (FILE* f = std::fopen(path, "r")) {
      char line[1024];
      if (std::fgets(line, sizeof line, f)) {
        const char* q = std::strrchr(line, ')');
        unsigned long long ut = 0, st = 0;
        if (q && std::sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                             &st) == 2)
          p.engine_s = static_cast<double>(ut + st) / tick;
      }
      std::fclose(f);
    }
  }
  return p;
}

void set_cores(Figures& f, const Probe& a, const Probe& b, ns_t ta, ns_t tb) {
  const double w = static_cast<double>(tb - ta) / 1e9;
  f.engine_cores = (b.engine_s - a.engine_s) / w;
  f.machine_cores = (b.busy_s - a.busy_s) / w;
}

double pct(std::vector<double>& v, double p) {
  if (v.empty()) return NAN;
  const std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(p / 100.0 * v.size()));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// The figures every path takes from its window [ta, tb]: tokens, CPU per token (the
// process's, pa..pb, and the loop thread's, ca..cb, all ns), tok/s and the delay percentiles.
void set_window(Figures& f, std::int64_t tokens, std::vector<double>& delay_ms, ns_t ta, ns_t tb,
                ns_t pa, ns_t pb, ns_t ca, ns_t cb) {
  const auto us_per_token = [tokens](ns_t a, ns_t b) {
    return tokens ? static_cast<double>(b - a) / 1e3 / static_cast<double>(tokens) : NAN;
  };
  f.tokens = tokens;
  f.cpu_us_per_token = us_per_token(pa, pb);
  f.thread_cpu_us_per_token = us_per_token(ca, cb);
  f.tok_s = static_cast<double>(tokens) / (static_cast<double>(tb - ta) / 1e9);
  f.p50_ms = pct(delay_ms, 50);
  f.p99_ms = pct(delay_ms, 99);
}

void sleep_until_ns(ns_t t) {
  for (ns_t now = now_ns(); now < t; now = now_ns())
    std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<ns_t>(t - now, 50'000'000)));
}

struct Url {
  std::string host = "127.0.0.1";
  int port = 0;
};

bool parse_url(const std::string& u, Url& out) {
  const std::string p = "http://";
  if (u.compare(0, p.size(), p) != 0) return false;
  const std::string rest = u.substr(p.size());
  const std::size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return false;
  out.host = rest.substr(0, colon);
  out.port = std::atoi(rest.c_str() + colon + 1);
  return out.port > 0;
}

int connect_to(const Url& u) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(u.port));
  inet_pton(AF_INET, u.host == "localhost" ? "127.0.0.1" : u.host.c_str(), &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // as libcurl does
  return fd;
}

bool send_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t k = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (k <= 0) return false;
    off += static_cast<std::size_t>(k);
  }
  return true;
}

// A blocking GET with Connection: close; the body, or "" on failure.
std::string http_get(const Url& u, const std::string& path) {
  const int fd = connect_to(u);
  if (fd < 0) return "";
  std::string req =
      "GET " + path + " HTTP/1.1\r\nHost: " + u.host + "\r\nConnection: close\r\n\r\n";
  std::string resp;
  if (send_all(fd, req)) {
    char buf[4096];
    for (ssize_t k; (k = recv(fd, buf, sizeof buf, 0)) > 0;) resp.append(buf, k);
  }
  close(fd);
  const std::size_t h = resp.find("\r\n\r\n");
  return h == std::string::npos ? "" : resp.substr(h + 4);
}

// The engine aborts the streams a run leaves; wait until it has none (or 30 s).
void wait_idle(const Url& u) {
  const ns_t end = now_ns() + 30'000'000'000LL;
  while (now_ns() < end) {
    const std::string s = http_get(u, "/sim/state");
    auto zero = [&](const char* key) {
      const std::size_t at = s.find(key);
      if (at == std::string::npos) return false;
      const char next = s[at + std::strlen(key)];
      return next == ',' || next == '}';
    };
    if (zero("\"running\":0") && zero("\"waiting\":0") && zero("\"streams_open\":0")) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string request_body(int max_tokens) {
  return "{\"prompt\":\"hello\",\"max_tokens\":" + std::to_string(max_tokens) +
         ",\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true,"
         "\"continuous_usage_stats\":true}}";
}

// ---- (a) the core: a CellRunner on its own thread, its CPU clock read from outside ----

Figures run_curl(const Url& u, const std::string& body, int n, double duration_s) {
  CellSpec spec;
  spec.http.url = "http://" + u.host + ":" + std::to_string(u.port) + "/v1/completions";
  spec.http.server_stamps = true;
  spec.http.idle_timeout_s = 30;
  spec.bodies = {body};
  spec.concurrency = n;
  spec.duration_s = duration_s + 60;  // ended by stop() below
  spec.client_threads = 1;
  spec.spill_events = 0;  // events read back by index below; a few windows never reach 2^18
  CellRunner runner(spec);
  CellResult res;
  std::atomic<bool> started{false};
  clockid_t cid{};
  std::thread t([&] {
    pthread_getcpuclockid(pthread_self(), &cid);
    started = true;
    res = runner.run();
  });
  while (!started) std::this_thread::yield();
  auto cpu = [&] {
    timespec ts{};
    clock_gettime(cid, &ts);
    return static_cast<ns_t>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
  };
  Figures f;
  const ns_t give_up = now_ns() + 60'000'000'000LL;
  while (runner.progress().window_start_ns.load() == kNever && now_ns() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const ns_t t0 = runner.progress().window_start_ns.load();
  if (t0 == kNever) {
    runner.stop();
    t.join();
    f.error = "the window never opened: " + res.fatal_error;
    return f;
  }
  sleep_until_ns(t0 + kSettleNs);
  const Probe qa = probe();
  const ns_t ta = now_ns(), ca = cpu(), pa = process_cpu_ns();
  sleep_until_ns(ta + static_cast<ns_t>(duration_s * 1e9));
  const ns_t tb = now_ns(), cb = cpu(), pb = process_cpu_ns();
  const Probe qb = probe();
  set_cores(f, qa, qb, ta, tb);
  runner.stop();
  t.join();
  if (!res.fatal_error.empty()) f.error = res.fatal_error;
  std::vector<double> delay;
  std::int64_t tokens = 0;
  for (std::size_t i = 0; i < res.events.size(); ++i) {
    const ns_t at = res.events.t_ns(i);
    if (at < ta || at > tb) continue;
    tokens += res.events.tokens(i);
    const ns_t s = res.events.server_ns(i);
    if (s > 0) delay.push_back(static_cast<double>(at - s) / 1e6);
  }
  set_window(f, tokens, delay, ta, tb, pa, pb, ca, cb);
  return f;
}

// ---- (b), (c) the direct path ----

struct Event {
  ns_t t, server, kernel;
  std::int32_t tokens;
};

struct Stream : ChunkedDecoder::Sink, SseSink {
  int fd = -1;
  bool in_body = false, chunked = false, done = false;
  bool streaming = false;
  std::string head;
  ChunkedDecoder chunks;
  SseParser sse;
  OpenAIStreamDecoder dec{ApiKind::kCompletions};
  ns_t read_ns = 0, kernel_ns = kNever;
  std::vector<Event>* out = nullptr;
  int* streaming_count = nullptr;

  bool on_data(std::string_view piece) override { return sse.feed(piece, *this) == SseStatus::kOk; }
  bool on_event(const SseEvent& ev) override {
    const ChunkResult c = dec.decode(ev.data);
    if (c.kind == ChunkKind::kDone) done = true;
    if (c.tokens > 0) {
      if (!streaming) {
        streaming = true;
        ++*streaming_count;
      }
      out->push_back({read_ns, c.server_ns, kernel_ns, c.tokens});
    }
    return true;
  }
  // The bytes of one read; false when the stream ended or broke.
  bool feed(const char* p, std::size_t n) {
    if (!in_body) {
      head.append(p, n);
      const std::size_t h = head.find("\r\n\r\n");
      if (h == std::string::npos) return head.size() < 65536;
      if (head.compare(0, 12, "HTTP/1.1 200") != 0) return false;
      std::string lower = head.substr(0, h);
      std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
      chunked = lower.find("transfer-encoding: chunked") != std::string::npos;
      in_body = true;
      const std::string rest = head.substr(h + 4);
      head.clear();
      return rest.empty() || feed(rest.data(), rest.size());
    }
    if (chunked) {
      const auto st = chunks.feed(p, n, *this);
      return st == ChunkedDecoder::Status::kOk && !done;
    }
    return sse.feed(p, n, *this) == SseStatus::kOk && !done;
  }
};

// realtime - monotonic, from the tightest of a few back-to-back readings
ns_t realtime_offset() {
  ns_t best_gap = INT64_MAX, off = 0;
  for (int i = 0; i < 20; ++i) {
    timespec r{};
    const ns_t m0 = now_ns();
    clock_gettime(CLOCK_REALTIME, &r);
    const ns_t m1 = now_ns();
    if (m1 - m0 < best_gap) {
      best_gap = m1 - m0;
      off = static_cast<ns_t>(r.tv_sec) * 1'000'000'000LL + r.tv_nsec - (m0 + m1) / 2;
    }
  }
  return off;
}

Figures run_direct(const Url& u, const std::string& body, int n, double duration_s,
                   bool kernel_ts) {
  Figures f;
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: " + u.host + ":" +
                          std::to_string(u.port) +
                          "\r\nAccept: */*\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  std::vector<Event> events;
  events.reserve(static_cast<std::size_t>(n) * static_cast<std::size_t>(duration_s + 5) * 60);
  std::vector<Stream> streams(static_cast<std::size_t>(n));
  int streaming = 0;
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  const ns_t rt_off = kernel_ts ? realtime_offset() : 0;
  for (int i = 0; i < n; ++i) {
    Stream& s = streams[static_cast<std::size_t>(i)];
    s.out = &events;
    s.streaming_count = &streaming;
    s.fd = connect_to(u);
    if (s.fd < 0 || !send_all(s.fd, req)) {
      f.error = "connect/send failed: " + std::string(std::strerror(errno));
      break;
    }
    if (kernel_ts) {
      const int one = 1;
      setsockopt(s.fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
    }
    fcntl(s.fd, F_SETFL, fcntl(s.fd, F_GETFL) | O_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<std::uint32_t>(i);
    epoll_ctl(ep, EPOLL_CTL_ADD, s.fd, &ev);
  }
  std::vector<char> buf(65536);
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(timespec)) * 2];
  std::vector<epoll_event> ready(1024);
  ns_t ta = kNever, tb = kNever, ca = 0, cb = 0, pa = 0, pb = 0;
  Probe qa, qb;
  std::int64_t reads_a = 0, waits_a = 0, reads = 0, waits = 0;
  int open = n;
  const ns_t give_up = now_ns() + 60'000'000'000LL;
  while (f.error.empty() && open > 0) {
    const ns_t now = now_ns();
    if (ta == kNever && streaming == n && tb == kNever) {
      tb = now + kSettleNs;  // first the settle: ta set when it ends
    }
    if (ta == kNever && tb != kNever && now >= tb) {
      qa = probe();
      ta = now_ns();
      ca = thread_cpu_ns();
      pa = process_cpu_ns();
      reads_a = reads;
      waits_a = waits;
      tb = ta + static_cast<ns_t>(duration_s * 1e9);
    } else if (ta != kNever && now >= tb) {
      cb = thread_cpu_ns();
      pb = process_cpu_ns();
      tb = now_ns();
      qb = probe();
      break;
    }
    if (ta == kNever && tb == kNever && now > give_up) {
      f.error = "not every stream streamed within 60 s";
      break;
    }
    const int k = epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), 5);
    ++waits;
    for (int j = 0; j < k; ++j) {
      Stream& s = streams[ready[static_cast<std::size_t>(j)].data.u32];
      ssize_t got;
      if (!kernel_ts) {
        got = recv(s.fd, buf.data(), buf.size(), 0);
        s.read_ns = now_ns();
      } else {
        iovec iov{buf.data(), buf.size()};
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = ctrl;
        mh.msg_controllen = sizeof ctrl;
        got = recvmsg(s.fd, &mh, 0);
        s.read_ns = now_ns();
        s.kernel_ns = kNever;
        for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
          if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
            timespec ts{};
            std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
            s.kernel_ns = static_cast<ns_t>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec - rt_off;
          }
        }
      }
      ++reads;
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (got <= 0 || !s.feed(buf.data(), static_cast<std::size_t>(got))) {
        epoll_ctl(ep, EPOLL_CTL_DEL, s.fd, nullptr);
        close(s.fd);
        s.fd = -1;
        --open;
      }
    }
  }
  for (Stream& s : streams)
    if (s.fd >= 0) close(s.fd);
  close(ep);
  if (ta == kNever || cb == 0) {
    if (f.error.empty()) f.error = "the window never closed (streams ended early?)";
    return f;
  }
  std::vector<double> delay, kern, wait;
  std::int64_t tokens = 0;
  for (const Event& e : events) {
    if (e.t < ta || e.t > tb) continue;
    tokens += e.tokens;
    if (e.server > 0) delay.push_back(static_cast<double>(e.t - e.server) / 1e6);
    if (e.server > 0 && e.kernel != kNever) {
      kern.push_back(static_cast<double>(e.kernel - e.server) / 1e6);
      wait.push_back(static_cast<double>(e.t - e.kernel) / 1e6);
    }
  }
  set_window(f, tokens, delay, ta, tb, pa, pb, ca, cb);
  set_cores(f, qa, qb, ta, tb);
  f.kern_p50_ms = pct(kern, 50);
  f.kern_p99_ms = pct(kern, 99);
  f.wait_p50_ms = pct(wait, 50);
  f.wait_p99_ms = pct(wait, 99);
  if (tokens) {
    f.reads_per_token = static_cast<double>(reads - reads_a) / static_cast<double>(tokens);
    f.waits_per_token = static_cast<double>(waits - waits_a) / static_cast<double>(tokens);
  }
  return f;
}

// ---- the engine ----

struct Sim {
  pid_t pid = -1;
  Url url;
};

Sim start_sim(const std::string& sim_path, const std::string& profile) {
  Sim s;
  int p[2];
  if (pipe(p) != 0) return s;
  const std::string prof =
      std::string(SM_SOURCE_DIR) + "/python/speedmatrix/profiles/" + profile + ".json";
  s.pid = fork();
  if (s.pid == 0) {
    dup2(p[1], 1);
    close(p[0]);
    close(p[1]);
    execl(sim_path.c_str(), sim_path.c_str(), "--profile", prof.c_str(), "--port", "0", "--stamp",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(p[1]);
  std::string line;
  char c;
  while (read(p[0], &c, 1) == 1 && c != '\n') line += c;
  // "speedmatrix-sim listening on 127.0.0.1:PORT"; the pipe stays open (the engine writes no more)
  const std::size_t colon = line.rfind(':');
  if (colon != std::string::npos) s.url.port = std::atoi(line.c_str() + colon + 1);
  for (int i = 0; i < 200 && http_get(s.url, "/health").empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return s;
}

void stop_sim(Sim& s) {
  if (s.pid > 0) {
    kill(s.pid, SIGTERM);
    waitpid(s.pid, nullptr, 0);
  }
  s.pid = -1;
}

void print_row(const char* name, const Figures& f) {
  if (!f.error.empty()) {
    std::printf("  %-7s ERROR %s\n", name, f.error.c_str());
    return;
  }
  std::printf(
      "  %-7s CPU/token %6.2f us (loop thread %6.2f)  delay p50 %6.3f p99 %7.3f ms  %7.0f tok/s",
      name, f.cpu_us_per_token, f.thread_cpu_us_per_token, f.p50_ms, f.p99_ms, f.tok_s);
  if (!std::isnan(f.reads_per_token))
    std::printf("  recv/token %.2f epoll_wait/token %.2f", f.reads_per_token, f.waits_per_token);
  std::printf("\n          engine %.2f cores, machine busy %.2f of %ld cores", f.engine_cores,
              f.machine_cores, sysconf(_SC_NPROCESSORS_ONLN));
  if (!std::isnan(f.kern_p50_ms))
    std::printf(
        "\n          send->kernel p50 %6.3f p99 %7.3f ms  kernel->read p50 %6.3f p99 %7.3f ms",
        f.kern_p50_ms, f.kern_p99_ms, f.wait_p50_ms, f.wait_p99_ms);
  std::printf("\n");
  std::fflush(stdout);
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  double duration = 3;
  int repeats = 3, max_tokens = 4000;
  bool with_ts = true;
  std::string cases = "64:fixed,512:lockstep", url, sim_path = SM_SIM_PATH;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--duration")
      duration = std::atof(next().c_str());
    else if (a == "--repeats")
      repeats = std::atoi(next().c_str());
    else if (a == "--max-tokens")
      max_tokens = std::atoi(next().c_str());
    else if (a == "--cases")
      cases = next();
    else if (a == "--url")
      url = next();
    else if (a == "--sim")
      sim_path = next();
    else if (a == "--no-ts")
      with_ts = false;
    else {
      std::fprintf(stderr,
                   "usage: read_path_bench [--duration S] [--repeats K] [--cases N:profile,...] "
                   "[--max-tokens M] [--url http://HOST:PORT] [--sim PATH] [--no-ts]\n");
      return 2;
    }
  }
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  std::printf(
      "read_path_bench: %s, %ld CPUs, load average %.2f %.2f %.2f, window %g s, %d repeats\n", when,
      sysconf(_SC_NPROCESSORS_ONLN), load[0], load[1], load[2], duration, repeats);
  const std::string body = request_body(max_tokens);
  std::size_t pos = 0;
  while (pos < cases.size()) {
    std::size_t comma = cases.find(',', pos);
    if (comma == std::string::npos) comma = cases.size();
    const std::string c = cases.substr(pos, comma - pos);
    pos = comma + 1;
    const std::size_t colon = c.find(':');
    const int n = std::atoi(c.c_str());
    const std::string profile = colon == std::string::npos ? "fixed" : c.substr(colon + 1);
    Sim sim;
    Url u;
    if (url.empty()) {
      sim = start_sim(sim_path, profile);
      g_sim_pid = sim.pid;
      u = sim.url;
      if (u.port <= 0) {
        std::fprintf(stderr, "read_path_bench: cannot start %s\n", sim_path.c_str());
        return 1;
      }
    } else if (!parse_url(url, u)) {
      std::fprintf(stderr, "read_path_bench: --url wants http://HOST:PORT\n");
      return 2;
    }
    std::printf("\n%d streams, profile %s%s\n", n, profile.c_str(),
                url.empty() ? " (engine started here, --stamp)" : "");
    std::vector<double> cpu_ratio, p99_ratio, p50_ratio, tok_ratio, ts_cpu_ratio;
    std::vector<double> cpu[3], p50[3], p99[3], tok[3], eng[3], busy[3], kp99, wp99, kp50, wp50;
    const char* names[3] = {"curl", "direct", "ts"};
    for (int rep = 0; rep < repeats; ++rep) {
      std::printf(" repeat %d (load %.2f)\n", rep + 1, (getloadavg(load, 1), load[0]));
      Figures fs[3];
      for (int p = 0; p < (with_ts ? 3 : 2); ++p) {
        wait_idle(u);
        fs[p] = p == 0 ? run_curl(u, body, n, duration) : run_direct(u, body, n, duration, p == 2);
        print_row(names[p], fs[p]);
        if (!fs[p].error.empty()) continue;
        cpu[p].push_back(fs[p].cpu_us_per_token);
        p50[p].push_back(fs[p].p50_ms);
        p99[p].push_back(fs[p].p99_ms);
        tok[p].push_back(fs[p].tok_s);
        eng[p].push_back(fs[p].engine_cores);
        busy[p].push_back(fs[p].machine_cores);
      }
      if (fs[0].error.empty() && fs[1].error.empty()) {
        cpu_ratio.push_back(fs[1].cpu_us_per_token / fs[0].cpu_us_per_token);
        p50_ratio.push_back(fs[1].p50_ms / fs[0].p50_ms);
        p99_ratio.push_back(fs[1].p99_ms / fs[0].p99_ms);
        tok_ratio.push_back(fs[1].tok_s / fs[0].tok_s);
        std::printf("  direct/curl: CPU/token %.2f  p50 %.2f  p99 %.2f  tok/s %.3f\n",
                    cpu_ratio.back(), p50_ratio.back(), p99_ratio.back(), tok_ratio.back());
      }
      if (with_ts && fs[2].error.empty()) {
        kp50.push_back(fs[2].kern_p50_ms);
        kp99.push_back(fs[2].kern_p99_ms);
        wp50.push_back(fs[2].wait_p50_ms);
        wp99.push_back(fs[2].wait_p99_ms);
        if (fs[0].error.empty())
          ts_cpu_ratio.push_back(fs[2].cpu_us_per_token / fs[0].cpu_us_per_token);
      }
    }
    std::printf(" median over repeats, %d streams %s:\n", n, profile.c_str());
    for (int p = 0; p < (with_ts ? 3 : 2); ++p)
      std::printf(
          "  %-7s CPU/token %6.2f us  delay p50 %6.3f p99 %7.3f ms  %9.0f tok/s  engine %.2f "
          "cores, machine busy %.2f\n",
          names[p], median(cpu[p]), median(p50[p]), median(p99[p]), median(tok[p]), median(eng[p]),
          median(busy[p]));
    if (with_ts)
      std::printf(
          "  ts      send->kernel p50 %.3f p99 %.3f ms, kernel->read p50 %.3f p99 %.3f ms\n",
          median(kp50), median(kp99), median(wp50), median(wp99));
    std::printf(
        "  ratios (median of per-repeat): direct/curl CPU/token %.2f  p50 %.2f  p99 %.2f  "
        "tok/s %.3f%s",
        median(cpu_ratio), median(p50_ratio), median(p99_ratio), median(tok_ratio),
        with_ts ? "" : "\n");
    if (with_ts) std::printf("  ts/curl CPU/token %.2f\n", median(ts_cpu_ratio));
    std::fflush(stdout);
    if (url.empty()) stop_sim(sim);
  }
  return 0;
}
