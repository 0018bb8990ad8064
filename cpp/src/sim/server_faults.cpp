// The built-in engine's faults (sm_fault per request, --fault-* shares at random):
// which a request gets, the status faults answered before any stream, and the
// faults fired mid-stream.
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <sys/socket.h>

#include <random>
#include <string>
#include <string_view>

#include "server_impl.hpp"

namespace speedmatrix::sim {

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

// The request's own sm_fault, else one drawn by the --fault-* shares (the draw is made
// only then, so a seeded run's faults do not depend on requests that named their own).
bool Server::read_fault(evhttp_request* req, simdjson::dom::object body, GenerateArgs& a) {
  simdjson::dom::element v;
  if (body["sm_fault"].get(v) == simdjson::SUCCESS && !v.is_null()) {
    std::string_view f;
    if (v.get_string().get(f) != simdjson::SUCCESS || !parse_fault(std::string(f), a.fault)) {
      reply_error(req, 400, "unknown sm_fault", "BadRequestError");
      return false;
    }
  } else if (opt_.fault_http500 + opt_.fault_malformed + opt_.fault_drop + opt_.fault_stall > 0) {
    double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    double c = opt_.fault_http500;
    if (u < c)
      a.fault = Fault::kHttp500;
    else if (u < (c += opt_.fault_malformed))
      a.fault = Fault::kMalformed;
    else if (u < (c += opt_.fault_drop))
      a.fault = Fault::kDrop;
    else if (u < (c += opt_.fault_stall))
      a.fault = Fault::kStall;
  }
  return true;
}

// The faults that are an error status instead of a reply; true when it answered.
bool Server::reply_fault_status(evhttp_request* req, Fault fault) {
  if (fault == Fault::kHttp500) {
    reply_error(req, 500, "simulated internal server error (sm_fault)", "InternalServerError");
    return true;
  }
  if (fault == Fault::kHttp429) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
    reply_error(req, 429, "simulated rate limit (sm_fault)", "RateLimitError");
    return true;
  }
  return false;
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

}  // namespace speedmatrix::sim
