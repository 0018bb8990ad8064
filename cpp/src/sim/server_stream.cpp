// The built-in engine's streams: each token's chunk, non-streaming replies, the
// engine's events dispatched to their streams, the timer at the engine's next
// deadline, unpaced bursts, and clients that go away.
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <string>

#include "server_impl.hpp"

namespace speedmatrix::sim {

void Server::usage_json(std::string& out, const Stream& s, std::int64_t completion) {
  out += "\"usage\":{\"prompt_tokens\":";
  append_int(out, s.prompt_tokens);
  out += ",\"total_tokens\":";
  append_int(out, s.prompt_tokens + completion);
  out += ",\"completion_tokens\":";
  append_int(out, completion);
  // With the prefix cache on (batched mode), every usage says how many prompt tokens it
  // served, 0 included: a delivered hit rate of nothing is a figure, not an unknown.
  if ((prof_.prefix_cache && prof_.mode == "batched") || s.cached > 0) {
    out += ",\"prompt_tokens_details\":{\"cached_tokens\":";
    append_int(out, s.cached);
    out += '}';
  }
  if (s.reasoning > 0) {
    out += ",\"completion_tokens_details\":{\"reasoning_tokens\":";
    append_int(out, std::min(completion, s.reasoning));
    out += '}';
  }
  out += '}';
}

// Appends one token event (and, for the last, the usage event and [DONE]) to out_.
void Server::send_token(Stream& s, ns_t, bool last) {
  std::string& c = scratch_;
  c.assign(kChunkHead, ' ');  // room for the HTTP chunk-size line, see write_chunk()
  const bool reasoning = s.sent < s.reasoning;  // never the last token (open_stream)
  if (reasoning && opt_.reasoning_hidden) {     // generated, not streamed
    s.sent++;
    tokens_sent_++;
    return;
  }
  const std::size_t wi = word_at(s.id, s.sent);
  const std::string& w = words_[wi];
  c += reasoning ? s.reasoning_head : s.head;
  if (s.sent == 0)
    c.append(w, 1, std::string::npos);  // no leading space on the first token
  else
    c += w;
  c += s.tail;
  c += !last ? "null" : s.out_tokens < s.max_tokens ? "\"stop\"" : "\"length\"";
  if (s.return_ids) {  // vLLM's CompletionResponseStreamChoice.token_ids: this chunk's
    c += ",\"token_ids\":[";
    append_int(c, static_cast<std::int64_t>(word_token_id(wi)));
    c += ']';
  }
  c += "}]";
  s.sent++;
  tokens_sent_++;
  if (s.continuous_usage) {
    c += ',';
    usage_json(c, s, s.sent);
  }
  if (opt_.stamp) {
    c += ",\"sm_t_ns\":";
    append_int(c, now_ns());
  }
  c += "}\n\n";
  if (last && s.include_usage) {
    c += "data: ";
    c += s.obj_head;
    c += ",\"choices\":[],";
    usage_json(c, s, s.sent);
    if (opt_.stamp) {
      c += ",\"sm_t_ns\":";
      append_int(c, now_ns());
    }
    c += "}\n\n";
  }
  if (last && s.fault != Fault::kNoDone) c += "data: [DONE]\n\n";
  // The caller sends scratch_ (write_chunk) or queues it (unpaced bursts).
}

// Writes scratch_ (kChunkHead spare bytes, then the events) as one HTTP/1.1 chunk
// straight into the connection's output buffer: one contiguous append, where
// evhttp_send_reply_chunk would format the size line with printf and start a new
// buffer chain per token.
void Server::write_chunk(Stream& s) {
  std::string& c = scratch_;
  std::size_t n = c.size() - kChunkHead;
  if (n == 0) return;
  char hex[16];
  auto r = std::to_chars(hex, hex + sizeof hex, n, 16);
  std::size_t h = static_cast<std::size_t>(r.ptr - hex);
  std::size_t start = kChunkHead - h - 2;
  std::memcpy(&c[start], hex, h);
  c[kChunkHead - 2] = '\r';
  c[kChunkHead - 1] = '\n';
  c += "\r\n";
  bufferevent* bev = evhttp_connection_get_bufferevent(s.conn);
  if (!(bufferevent_get_enabled(bev) & EV_WRITE)) bufferevent_enable(bev, EV_WRITE);
  evbuffer* out = bufferevent_get_output(bev);
  evbuffer_add(out, c.data() + start, c.size() - start);
  // Stamped: the chunk goes to the socket now, so "sm_t_ns" is its send time. Left to the
  // loop, a lockstep step's 512 chunks would be written only after all were formatted,
  // and the last stream's stamp would precede its write by the whole step's writes
  // (~5 ms here): the client's receive delay would carry the engine's send queue. What
  // the socket does not take now (a full send buffer: a client that lags) the bufferevent
  // writes later, and that delay is the client's own.
  if (opt_.stamp) {
    evutil_socket_t fd = bufferevent_getfd(bev);
    if (fd >= 0) evbuffer_write(out, fd);
  }
}

void Server::send_nonstream(Stream& s) {
  std::string text;
  for (std::int64_t k = 0; k < s.out_tokens; ++k) {
    const std::string& w = words_[word_at(s.id, k)];
    if (k == 0)
      text.append(w, 1, std::string::npos);
    else
      text += w;
  }
  std::string c = s.obj_head;
  const char* reason = s.out_tokens < s.max_tokens ? "stop" : "length";
  if (s.chat)
    c += ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"" + text +
         "\"},\"logprobs\":null,\"finish_reason\":\"" + reason + "\"}],";
  else
    c += ",\"choices\":[{\"index\":0,\"text\":\"" + text +
         "\",\"logprobs\":null,\"finish_reason\":\"" + reason + "\"}],";
  tokens_sent_ += s.out_tokens;
  s.sent = s.out_tokens;
  usage_json(c, s, s.out_tokens);
  if (opt_.stamp) {
    c += ",\"sm_t_ns\":";
    append_int(c, now_ns());
  }
  c += '}';
  if (s.fault == Fault::kMalformed) c = "{\"id\": \"broken";
  evhttp_connection_set_closecb(s.conn, nullptr, nullptr);
  reply_json(s.req, 200, c);
}

void Server::finish_stream(Stream& s) {
  evhttp_connection_set_closecb(s.conn, nullptr, nullptr);
  evhttp_send_reply_end(s.req);
}

void Server::close_stream(RequestId id, bool abort_engine) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  if (abort_engine && it->second.in_engine) engine_.abort(id);
  streams_.erase(it);
}

void Server::dispatch(const Event& ev) {
  auto it = streams_.find(ev.id);
  if (it == streams_.end()) return;
  Stream& s = it->second;
  s.cached = ev.cached_tokens;
  bool last = ev.kind == EventKind::kFinished;
  if (last) s.in_engine = false;
  if (s.stalled) {
    if (last) s.in_engine = false;
    return;
  }
  if (!s.streaming) {
    if (!last) return;
    if (s.fault == Fault::kDrop || s.fault == Fault::kStall) {
      if (s.fault == Fault::kDrop) {
        bufferevent* bev = evhttp_connection_get_bufferevent(s.conn);
        evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
        if (fd >= 0) shutdown(fd, SHUT_RDWR);
      }
      s.stalled = true;
      return;
    }
    send_nonstream(s);
    streams_.erase(it);
    return;
  }
  send_token(s, ev.t_ns, last);
  write_chunk(s);
  if (fire_fault(s)) {
    if (s.in_engine) {
      engine_.abort(s.id);
      s.in_engine = false;
    }
    if (!s.stalled) streams_.erase(s.id);
    return;
  }
  if (last) {
    finish_stream(s);
    streams_.erase(it);
  }
}

void Server::on_close(evhttp_connection*, void* arg) {
  RequestId id = static_cast<RequestId>(reinterpret_cast<std::uintptr_t>(arg));
  if (!g_server) return;  // the server is being torn down
  g_server->release_request(id);
  g_server->close_stream(id, true);
  g_server->arm();
}

// A client that goes away mid-reply (EOF or reset on a reply not yet ended) makes
// libevent detach the request from its connection and leave it to us: it is freed
// neither with the connection nor later (~2.9 KB a stream). A request still attached
// is freed with its connection, after this callback.
void Server::release_request(RequestId id) {
  auto it = streams_.find(id);
  if (it == streams_.end() || !it->second.req) return;
  if (evhttp_request_get_connection(it->second.req) == nullptr) evhttp_request_free(it->second.req);
  it->second.req = nullptr;
}

// Unpaced: write a burst of tokens, then wait for the socket to drain.
void Server::pump_unpaced(RequestId id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  Stream& s = it->second;
  if (!s.streaming) {
    send_nonstream(s);
    streams_.erase(it);
    return;
  }
  constexpr int kBurst = 256;
  for (int k = 0; k < kBurst; ++k) {
    bool last = s.sent + 1 >= s.out_tokens;
    send_token(s, 0, last);
    evbuffer_add(out_, scratch_.data() + kChunkHead, scratch_.size() - kChunkHead);
    if (s.fault != Fault::kNone && s.sent == s.fault_at) {
      evhttp_send_reply_chunk(s.req, out_);
      if (fire_fault(s)) {
        if (!s.stalled) streams_.erase(id);
        return;
      }
    }
    if (last) {
      evhttp_send_reply_chunk(s.req, out_);
      finish_stream(s);
      streams_.erase(id);
      return;
    }
  }
  // One HTTP chunk for the burst; the callback comes when the socket has taken it all.
  evhttp_send_reply_chunk_with_cb(s.req, out_, &Server::on_drained,
                                  reinterpret_cast<void*>(static_cast<std::uintptr_t>(id)));
}

void Server::on_drained(evhttp_connection*, void* arg) {
  if (g_server)
    g_server->pump_unpaced(static_cast<RequestId>(reinterpret_cast<std::uintptr_t>(arg)));
}

void Server::tick() {
  last_tick_ns_ = clock_.now();
  events_.clear();
  engine_.advance(events_);
  for (const Event& ev : events_) dispatch(ev);
  arm();
}

void Server::arm() {
  ns_t d = engine_.next_deadline();
  if (d == kNever) {
    evtimer_del(timer_);
    return;
  }
  // Thousands of streams in fixed mode have thousands of distinct deadlines; waking
  // for each costs more than the tokens. Wake-ups are at least kMinGapNs apart (events
  // leave at most that late); a lone stream's deadlines are never moved.
  constexpr ns_t kMinGapNs = 50'000;
  ns_t now = clock_.now();
  ns_t wait = std::max<ns_t>(0, std::max(d, last_tick_ns_ + kMinGapNs) - now);
  if (d <= now && now - last_tick_ns_ >= kMinGapNs) wait = 0;
  timeval tv{static_cast<time_t>(wait / 1'000'000'000),
             static_cast<suseconds_t>((wait % 1'000'000'000) / 1000)};
  evtimer_add(timer_, &tv);
}

}  // namespace speedmatrix::sim
