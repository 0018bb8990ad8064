// The engine model: front-end, FIFO waiting queue, admission by running cap and
// KV pool, prefix cache, chunked prefill and one shared decode step per
// iteration. See sim.hpp for the timeline.
#include <algorithm>
#include <cmath>
#include <list>
#include <queue>
#include <stdexcept>

#include "speedmatrix/sim.hpp"

namespace speedmatrix::sim {

ns_t decode_step_ns(const Profile& p, std::int64_t batch, std::int64_t kv_tokens) {
  double b = static_cast<double>(batch);
  double kv = static_cast<double>(kv_tokens);
  double ms = p.step_base_ms + p.step_per_seq_ms * b + p.step_per_seq2_ms * b * b +
              p.step_per_kv_token_ns * 1e-6 * kv + (batch >= 2 ? p.step_batched_ms : 0.0) +
              (batch >= 1 ? p.step_per_ctx_token_ns * 1e-6 * kv / b : 0.0);
  return static_cast<ns_t>(std::llround(std::max(ms, 0.0) * 1e6));
}

ns_t prefill_ns(const Profile& p, std::int64_t pos, std::int64_t n) {
  if (n <= 0) return 0;
  // Sum over positions pos .. pos+n-1 of (a + c * position), in ns.
  double mean_pos = static_cast<double>(pos) + (static_cast<double>(n) - 1.0) / 2.0;
  double per_token_ns = p.prefill_per_token_us * 1e3 + p.prefill_per_token_ctx_ns * mean_pos / 1e3;
  return static_cast<ns_t>(std::llround(std::max(per_token_ns, 0.0) * static_cast<double>(n)));
}

namespace {

enum class Stage : std::uint8_t { kFrontend, kWaiting, kPrefill, kDecode };

struct Req {
  RequestSpec spec;
  Stage stage = Stage::kFrontend;
  ns_t ready_ns = 0;        // leaves the front-end
  std::int64_t cached = 0;  // prompt tokens served by the cache
  std::int64_t pos = 0;     // prompt tokens computed or cached so far
  std::int64_t generated = 0;
  std::int64_t reserved = 0;      // KV tokens reserved at admission
  std::size_t pinned_blocks = 0;  // leading block_hashes pinned in the cache
  ns_t next_ns = 0;               // fixed mode: time of the next token
  ns_t fe_arrive_ns = 0;          // earliest front-end start (arrival + fixed overhead)
  ns_t fe_cost_ns = 0;            // serial front-end work (per prompt token)
};

struct Block {
  std::int32_t refs = 0;
  std::list<std::uint64_t>::iterator lru;  // valid when refs == 0
};

struct Piece {
  RequestId id;
  std::int64_t n;
};

}  // namespace

struct Engine::Impl {
  Profile p;
  Clock& clock;
  bool fixed;
  std::unordered_map<RequestId, Req> reqs;
  std::deque<RequestId> frontend, waiting, prefill;
  std::vector<RequestId> decode;
  ns_t fe_free = 0;
  std::int64_t reserved = 0;
  std::unordered_map<std::uint64_t, Block> cache;
  std::list<std::uint64_t> lru;  // evictable blocks, least recently used first
  EngineState st;
  std::deque<StepRecord> trace;

  // After an abort, the serial front-end's queue moves up: the work the aborted
  // request had reserved is given back (a request already past the front-end
  // keeps its time; one in progress now ends now).
  void reschedule_frontend(ns_t now) {
    ns_t free = now;
    for (RequestId id : frontend) {
      Req& q = reqs.at(id);
      if (q.fe_cost_ns == 0) continue;  // free-prefill requests skip the queue
      const ns_t start = q.ready_ns - q.fe_cost_ns;
      if (start <= now) {  // started (or done) before the abort: unchanged
        free = std::max(free, q.ready_ns);
        continue;
      }
      q.ready_ns = std::max(q.fe_arrive_ns, free) + q.fe_cost_ns;
      free = q.ready_ns;
    }
    fe_free = free;
  }

  // The iteration in flight.
  bool busy = false;
  bool prefill_applied = false;
  ns_t it_start = 0, it_prefill_end = 0, it_end = 0;
  std::vector<Piece> it_pieces;
  std::vector<RequestId> it_decode;
  std::int64_t it_kv = 0;
  std::int64_t it_prefill_tokens = 0;

  // fixed mode: (next token time, id), earliest first; stale entries skipped.
  using Item = std::pair<ns_t, RequestId>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;

  Impl(Profile prof, Clock& c) : p(std::move(prof)), clock(c), fixed(p.mode == "fixed") {
    st.kv_capacity_tokens = p.kv_tokens;
  }

  std::int64_t cached_free_tokens() const {
    return static_cast<std::int64_t>(lru.size()) * p.block_size;
  }

  void pin(std::uint64_t h) {
    auto [it, fresh] = cache.try_emplace(h);
    if (!fresh && it->second.refs == 0) lru.erase(it->second.lru);
    it->second.refs++;
  }
  void unpin(std::uint64_t h) {
    auto it = cache.find(h);
    if (it == cache.end()) return;
    if (--it->second.refs == 0) it->second.lru = lru.insert(lru.end(), h);
  }
  void evict_to_fit() {
    while (!lru.empty() && reserved + cached_free_tokens() > p.kv_tokens) {
      cache.erase(lru.front());
      lru.pop_front();
    }
  }

  void release(Req& r) {
    reserved -= r.reserved;
    r.reserved = 0;
    // Tail blocks first, so LRU eviction trims prompts from their end (as a
    // radix cache evicts leaves) and the shared head stays matchable.
    for (std::size_t i = r.pinned_blocks; i-- > 0;) unpin(r.spec.block_hashes[i]);
    r.pinned_blocks = 0;
  }

  // Admits the head of the waiting queue while it fits (strict FIFO).
  void admit() {
    while (!waiting.empty()) {
      std::int64_t running = static_cast<std::int64_t>(prefill.size() + decode.size());
      if (running >= p.max_running) return;
      Req& r = reqs.at(waiting.front());
      std::int64_t need = r.spec.prompt_tokens + r.spec.max_tokens;
      if (reserved + need > p.kv_tokens) return;
      std::size_t matched = 0;
      if (p.prefix_cache) {
        while (matched < r.spec.block_hashes.size() && cache.count(r.spec.block_hashes[matched]))
          ++matched;
        for (std::size_t i = 0; i < matched; ++i) pin(r.spec.block_hashes[i]);
      }
      r.pinned_blocks = matched;
      // The last prompt token is always computed: it produces the first token.
      r.cached = std::min<std::int64_t>(static_cast<std::int64_t>(matched) * p.block_size,
                                        std::max<std::int64_t>(r.spec.prompt_tokens - 1, 0));
      r.pos = r.cached;
      r.reserved = need;
      reserved += need;
      evict_to_fit();
      st.cache_query_tokens += r.spec.prompt_tokens;
      st.cache_hit_tokens += r.cached;
      st.prompt_tokens_total += r.spec.prompt_tokens;
      r.stage = Stage::kPrefill;
      prefill.push_back(r.spec.id);
      waiting.pop_front();
    }
  }

  // Starts the next iteration at model time t (the engine is free at t).
  void start_iteration(ns_t t) {
    while (!frontend.empty() && reqs.at(frontend.front()).ready_ns <= t) {
      RequestId id = frontend.front();
      frontend.pop_front();
      reqs.at(id).stage = Stage::kWaiting;
      waiting.push_back(id);
    }
    admit();
    it_pieces.clear();
    ns_t pre = 0;
    std::int64_t budget = p.chunk_tokens;
    it_prefill_tokens = 0;
    for (RequestId id : prefill) {
      if (budget <= 0) break;
      Req& r = reqs.at(id);
      std::int64_t n = std::min(r.spec.prompt_tokens - r.pos, budget);
      if (n <= 0) continue;
      if (!r.spec.free_prefill) pre += prefill_ns(p, r.pos, n);
      it_pieces.push_back({id, n});
      budget -= n;
      it_prefill_tokens += n;
    }
    if (!it_pieces.empty())
      pre += static_cast<ns_t>(std::llround(p.prefill_chunk_overhead_ms * 1e6));
    it_decode = decode;
    it_kv = 0;
    for (RequestId id : it_decode) {
      const Req& r = reqs.at(id);
      it_kv += r.spec.prompt_tokens + r.generated;
    }
    ns_t dec = it_decode.empty()
                   ? 0
                   : decode_step_ns(p, static_cast<std::int64_t>(it_decode.size()), it_kv);
    if (it_pieces.empty() && it_decode.empty()) {
      busy = false;
      return;
    }
    busy = true;
    prefill_applied = false;
    it_start = t;
    it_prefill_end = t + pre;
    it_end = it_prefill_end + dec;
  }

  void emit(Req& r, ns_t t, std::vector<Event>& out) {
    r.generated++;
    st.generation_tokens_total++;
    bool done = r.generated >= output_tokens(r.spec);
    out.push_back(
        {r.spec.id, done ? EventKind::kFinished : EventKind::kToken, t, r.generated, r.cached});
    if (done) {
      if (p.prefix_cache && r.pinned_blocks == r.spec.block_hashes.size()) {
        for (std::uint64_t h : r.spec.output_block_hashes) {
          r.spec.block_hashes.push_back(h);
          pin(h);  // unpinned by release() below: cached, evictable
        }
        r.pinned_blocks = r.spec.block_hashes.size();
      }
      st.requests_finished++;
      if (r.generated < r.spec.max_tokens) st.requests_stopped++;
      release(r);
      if (!fixed && r.stage == Stage::kDecode)
        decode.erase(std::find(decode.begin(), decode.end(), r.spec.id));
      reqs.erase(r.spec.id);
    }
  }

  void apply_prefill(std::vector<Event>& out) {
    prefill_applied = true;
    for (const Piece& pc : it_pieces) {
      auto it = reqs.find(pc.id);
      if (it == reqs.end() || it->second.stage != Stage::kPrefill) continue;  // aborted
      Req& r = it->second;
      r.pos += pc.n;
      st.prefill_tokens_total += pc.n;
      if (r.pos < r.spec.prompt_tokens) continue;
      prefill.erase(std::find(prefill.begin(), prefill.end(), r.spec.id));
      if (p.prefix_cache) {
        for (std::size_t i = r.pinned_blocks; i < r.spec.block_hashes.size(); ++i)
          pin(r.spec.block_hashes[i]);
        r.pinned_blocks = r.spec.block_hashes.size();
        evict_to_fit();
      }
      r.stage = Stage::kDecode;
      decode.push_back(r.spec.id);
      emit(r, it_prefill_end, out);  // the prefill's last token yields the first output token
    }
  }

  void apply_decode(std::vector<Event>& out) {
    if (!it_decode.empty()) {
      st.steps++;
      trace.push_back({it_end, static_cast<std::int32_t>(it_decode.size()), it_kv,
                       it_end - it_prefill_end, it_prefill_end - it_start, it_prefill_tokens});
      while (trace.size() > static_cast<std::size_t>(p.trace_capacity)) trace.pop_front();
    }
    for (RequestId id : it_decode) {
      auto it = reqs.find(id);
      if (it == reqs.end() || it->second.stage != Stage::kDecode) continue;
      emit(it->second, it_end, out);
    }
  }

  void advance_batched(ns_t now, std::vector<Event>& out) {
    while (true) {
      if (busy) {
        if (!prefill_applied) {
          if (it_prefill_end > now) return;
          apply_prefill(out);
          continue;
        }
        if (it_end > now) return;
        apply_decode(out);
        start_iteration(it_end);
        continue;
      }
      // Idle: the next iteration starts when the next request leaves the front-end.
      if (frontend.empty()) return;
      ns_t t = reqs.at(frontend.front()).ready_ns;
      if (t > now) return;
      start_iteration(t);
    }
  }

  void advance_fixed(ns_t now, std::vector<Event>& out) {
    while (!heap.empty() && heap.top().first <= now) {
      auto [t, id] = heap.top();
      heap.pop();
      auto it = reqs.find(id);
      if (it == reqs.end() || it->second.next_ns != t) continue;
      Req& r = it->second;
      ns_t itl = static_cast<ns_t>(std::llround(p.fixed_itl_ms * 1e6));
      RequestId rid = r.spec.id;
      emit(r, t, out);
      auto again = reqs.find(rid);
      if (again != reqs.end()) {
        again->second.next_ns = t + itl;
        heap.push({t + itl, rid});
      }
    }
  }
};

Engine::Engine(Profile profile, Clock& clock)
    : impl_(std::make_unique<Impl>(std::move(profile), clock)) {}
Engine::~Engine() = default;

const Profile& Engine::profile() const { return impl_->p; }
const std::deque<StepRecord>& Engine::trace() const { return impl_->trace; }

std::string Engine::validate(std::int64_t prompt_tokens, std::int64_t max_tokens) const {
  const Profile& p = impl_->p;
  if (prompt_tokens <= 0) return "The prompt is empty: at least one token is required.";
  if (max_tokens < 1)
    return "max_tokens must be at least 1, got " + std::to_string(max_tokens) + ".";
  if (prompt_tokens + max_tokens > p.context_length)
    return "This model's maximum context length is " + std::to_string(p.context_length) +
           " tokens. However, you requested " + std::to_string(prompt_tokens + max_tokens) +
           " tokens (" + std::to_string(prompt_tokens) + " in the messages, " +
           std::to_string(max_tokens) +
           " in the completion). Please reduce the length of the "
           "messages or completion.";
  if (!impl_->fixed && prompt_tokens + max_tokens > p.kv_tokens)
    return "The request needs " + std::to_string(prompt_tokens + max_tokens) +
           " KV tokens, more than the pool's " + std::to_string(p.kv_tokens) + " (context length).";
  return "";
}

void Engine::submit(const RequestSpec& spec) {
  Impl& m = *impl_;
  ns_t now = m.clock.now();
  if (m.reqs.count(spec.id)) throw std::logic_error("duplicate request id");
  Req& r = m.reqs[spec.id];
  r.spec = spec;
  m.st.requests_submitted++;
  if (m.fixed) {
    r.stage = Stage::kDecode;
    r.next_ns = now + static_cast<ns_t>(std::llround(m.p.fixed_ttft_ms * 1e6));
    m.heap.push({r.next_ns, spec.id});
    m.st.prompt_tokens_total += spec.prompt_tokens;
    return;
  }
  r.fe_arrive_ns = now + static_cast<ns_t>(std::llround(m.p.frontend_overhead_ms * 1e6));
  r.fe_cost_ns = spec.free_prefill
                     ? 0
                     : static_cast<ns_t>(std::llround(m.p.frontend_per_token_us * 1e3 *
                                                      static_cast<double>(spec.prompt_tokens)));
  ns_t start = std::max(r.fe_arrive_ns, m.fe_free);
  if (spec.free_prefill) start = now;
  r.ready_ns = start + r.fe_cost_ns;
  if (!spec.free_prefill) m.fe_free = r.ready_ns;
  r.stage = Stage::kFrontend;
  m.frontend.push_back(spec.id);
}

void Engine::abort(RequestId id) {
  Impl& m = *impl_;
  auto it = m.reqs.find(id);
  if (it == m.reqs.end()) return;
  Req& r = it->second;
  auto drop = [id](auto& q) {
    auto f = std::find(q.begin(), q.end(), id);
    if (f != q.end()) q.erase(f);
  };
  if (!m.fixed) {
    switch (r.stage) {
      case Stage::kFrontend:
        drop(m.frontend);
        m.reschedule_frontend(m.clock.now());
        break;
      case Stage::kWaiting:
        drop(m.waiting);
        break;
      case Stage::kPrefill:
        drop(m.prefill);
        break;
      case Stage::kDecode:
        drop(m.decode);
        break;
    }
    m.release(r);
  }
  m.reqs.erase(it);
  m.st.requests_aborted++;
}

std::int64_t Engine::flush_cache() {
  Impl& m = *impl_;
  std::int64_t dropped = m.cached_free_tokens();
  for (std::uint64_t h : m.lru) m.cache.erase(h);
  m.lru.clear();
  return dropped;
}

void Engine::advance(std::vector<Event>& out) {
  ns_t now = impl_->clock.now();
  if (impl_->fixed)
    impl_->advance_fixed(now, out);
  else
    impl_->advance_batched(now, out);
}

ns_t Engine::next_deadline() const {
  const Impl& m = *impl_;
  if (m.fixed) {
    // Stale heap entries (aborted) only make the wake-up early, never late.
    return m.heap.empty() ? kNever : m.heap.top().first;
  }
  if (m.busy) return m.prefill_applied ? m.it_end : m.it_prefill_end;
  if (!m.frontend.empty()) return m.reqs.at(m.frontend.front()).ready_ns;
  return kNever;
}

EngineState Engine::state() const {
  const Impl& m = *impl_;
  EngineState s = m.st;
  if (m.fixed) {
    s.running = static_cast<std::int64_t>(m.reqs.size());
    for (const auto& [id, r] : m.reqs) s.kv_used_tokens += r.spec.prompt_tokens + r.generated;
    return s;
  }
  // A request past its front-end time is waiting even before the next iteration
  // starts and moves it into the queue.
  ns_t now = m.clock.now();
  std::int64_t ready = 0;
  for (RequestId id : m.frontend) ready += m.reqs.at(id).ready_ns <= now;
  s.frontend = static_cast<std::int64_t>(m.frontend.size()) - ready;
  s.waiting = static_cast<std::int64_t>(m.waiting.size()) + ready;
  s.prefilling = static_cast<std::int64_t>(m.prefill.size());
  s.running = static_cast<std::int64_t>(m.prefill.size() + m.decode.size());
  for (RequestId id : m.prefill) s.kv_used_tokens += m.reqs.at(id).pos;
  for (RequestId id : m.decode) {
    const Req& r = m.reqs.at(id);
    s.kv_used_tokens += r.spec.prompt_tokens + r.generated;
  }
  s.kv_reserved_tokens = m.reserved;
  s.kv_cached_tokens = m.cached_free_tokens();
  return s;
}

}  // namespace speedmatrix::sim
