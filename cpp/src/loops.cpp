#include "speedmatrix/loops.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <tuple>
#include <utility>

namespace speedmatrix {

LoopGroup::LoopGroup(std::int32_t loops, std::int32_t slots)
    : loops_(std::max<std::int32_t>(loops, 1)),
      slots_(std::max<std::int32_t>(slots, 0)),
      first_token_ns_(static_cast<std::size_t>(slots_), kNever),
      transports_(static_cast<std::size_t>(loops_), nullptr) {}

std::int32_t LoopGroup::share(std::int32_t i, std::int32_t total) const noexcept {
  if (i < 0 || i >= loops_ || total <= i) return 0;
  return (total - i + loops_ - 1) / loops_;
}

void LoopGroup::attach(std::int32_t i, Transport* transport) {
  std::lock_guard<std::mutex> lock(mu_);
  transports_[static_cast<std::size_t>(i)] = transport;
}

void LoopGroup::wake_all() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (Transport* t : transports_) {
    if (t) t->wake();
  }
}

ns_t LoopGroup::arrive(Clock& clock, const std::atomic<bool>& stop) {
  std::unique_lock<std::mutex> lock(mu_);
  if (++arrived_ == loops_) {
    ramp_start_ns_ = clock.now();
    arrived_cv_.notify_all();
  }
  while (ramp_start_ns_ == kNever) {
    if (stop.load(std::memory_order_relaxed) || aborted()) return kNever;
    arrived_cv_.wait_for(lock, std::chrono::milliseconds(20));
  }
  return ramp_start_ns_;
}

void LoopGroup::note_first_token(std::int32_t slot, ns_t first_token_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto k = static_cast<std::size_t>(slot);
  if (k < first_token_ns_.size() && first_token_ns_[k] == kNever) {
    first_token_ns_[k] = first_token_ns;
    any_streamed_ = true;
  }
}

void LoopGroup::note_ramp_failure() {
  std::lock_guard<std::mutex> lock(mu_);
  ++ramp_failures_;
}

ns_t LoopGroup::open_window(ns_t ramp_start_ns, ns_t now_ns, ns_t settle_ns, ns_t cap_ns,
                            bool* capped) {
  std::lock_guard<std::mutex> lock(mu_);
  ns_t t0 = t0_.load(std::memory_order_relaxed);
  if (t0 == kNever) {
    t0 = steady_window_open(first_token_ns_, ramp_start_ns, now_ns, settle_ns, cap_ns, &capped_);
    // Nothing streams and a whole wave failed: no steady state is coming, and the window
    // (which records the failures) should not wait for the cap.
    if (t0 == kNever && !any_streamed_ && ramp_failures_ >= slots_) t0 = now_ns;
    if (t0 != kNever) t0_.store(t0, std::memory_order_release);
  }
  if (capped) *capped = capped_;
  return t0;
}

bool LoopGroup::take_request(std::int64_t max_requests) noexcept {
  if (max_requests <= 0) return true;
  return started_.fetch_add(1, std::memory_order_relaxed) < max_requests;
}

bool LoopGroup::budget_left(std::int64_t max_requests) const noexcept {
  return max_requests <= 0 || started_.load(std::memory_order_relaxed) < max_requests;
}

void LoopGroup::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  arrived_cv_.notify_all();
  wake_all();
}

std::string LoopGroup::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_reason_;
}

DealtPacer::DealtPacer(std::unique_ptr<Pacer> global, std::int32_t loop, std::int32_t loops)
    : global_(std::move(global)), loop_(loop), loops_(std::max<std::int32_t>(loops, 1)) {}

ns_t DealtPacer::due_ns(std::int64_t k) {
  const std::int64_t want = global_index(k);
  ns_t due = kNever;
  while (next_global_ <= want) {
    due = global_->due_ns(next_global_++);
    if (due == kNever) {
      next_global_ = std::numeric_limits<std::int64_t>::max();  // the plan has ended
      return kNever;
    }
  }
  return due;
}

std::int32_t auto_client_threads(std::int32_t asked, std::int64_t streams, std::int32_t cores) {
  if (asked > 0) return std::min<std::int32_t>(asked, 1024);
  const std::int64_t want = (std::max<std::int64_t>(streams, 1) + 255) / 256;
  return static_cast<std::int32_t>(std::clamp<std::int64_t>(want, 1, std::max(cores - 1, 1)));
}

namespace {

// Sort key of a request in the merge.
struct RequestKey {
  std::uint8_t phase;
  ns_t sent_ns;  // never sent: last
  std::int32_t loop, id;
  bool operator<(const RequestKey& o) const {
    return std::tie(phase, sent_ns, loop, id) < std::tie(o.phase, o.sent_ns, o.loop, o.id);
  }
};

}  // namespace

void merge_loop_records(std::vector<CellRecords>& parts, CellRecords& out) {
  std::vector<RequestKey> keys;
  std::size_t total = 0;
  for (const CellRecords& p : parts) total += p.requests.size();
  keys.reserve(total);
  for (std::size_t l = 0; l < parts.size(); ++l) {
    parts[l].requests.for_each(
        0, parts[l].requests.size(), [&](std::size_t i, const RequestRecord& r) {
          keys.push_back({static_cast<std::uint8_t>(r.phase),
                          r.sent_ns == kNever ? std::numeric_limits<ns_t>::max() : r.sent_ns,
                          static_cast<std::int32_t>(l), static_cast<std::int32_t>(i)});
        });
  }
  std::sort(keys.begin(), keys.end());
  std::vector<std::vector<std::int32_t>> new_id(parts.size());
  for (std::size_t l = 0; l < parts.size(); ++l) new_id[l].assign(parts[l].requests.size(), -1);
  for (std::size_t n = 0; n < keys.size(); ++n) {
    const RequestKey& k = keys[n];
    const auto l = static_cast<std::size_t>(k.loop);
    new_id[l][static_cast<std::size_t>(k.id)] = static_cast<std::int32_t>(n);
    out.requests.push_back(std::as_const(parts[l].requests)[static_cast<std::size_t>(k.id)]);
    if ((n & 4095) == 4095) out.requests.spill_finished(std::numeric_limits<ns_t>::max());
  }
  keys = {};
  for (CellRecords& p : parts) p.requests = RequestLog();
  for (std::size_t l = 0; l < parts.size(); ++l) {  // kept outputs follow their requests
    for (std::size_t i = 0; i < parts[l].outputs.size(); ++i) {
      const std::int32_t to = new_id[l][i];
      if (to >= 0) out.output(to) = std::move(parts[l].outputs[i]);
    }
    parts[l].outputs = {};
  }

  // Events: an N-way merge by time over the plain columns (mappings when spilled).
  std::vector<EventColumns::Plain> ev;
  ev.reserve(parts.size());
  for (CellRecords& p : parts) ev.push_back(p.events.take_plain());
  std::vector<std::size_t> at(parts.size(), 0);
  for (;;) {
    std::size_t best = parts.size();
    for (std::size_t l = 0; l < parts.size(); ++l) {
      if (at[l] < ev[l].t_ns.size() &&
          (best == parts.size() || ev[l].t_ns.data()[at[l]] < ev[best].t_ns.data()[at[best]]))
        best = l;
    }
    if (best == parts.size()) break;
    const std::size_t i = at[best]++;
    const EventColumns::Plain& e = ev[best];
    const std::int32_t req = e.request.data()[i];
    const std::vector<std::int32_t>& ids = new_id[best];
    const std::int32_t mapped =
        req >= 0 && static_cast<std::size_t>(req) < ids.size() ? ids[req] : req;
    out.events.push(mapped, e.t_ns.data()[i], e.tokens.data()[i],
                    e.server_ns.size() > i ? e.server_ns.data()[i] : kNever);
  }
  parts.clear();
}

ScheduleTimes merge_loop_times(const std::vector<ScheduleTimes>& parts) {
  if (parts.empty()) return {};
  ScheduleTimes m = parts.front();
  m.stalls = m.backoffs = m.backoff_ns = 0;
  m.warmup_retried = 0;
  for (const ScheduleTimes& p : parts) {
    if (p.warmup_start_ns != kNever &&
        (m.warmup_start_ns == kNever || p.warmup_start_ns < m.warmup_start_ns))
      m.warmup_start_ns = p.warmup_start_ns;
    m.window_end_ns = std::max(m.window_end_ns, p.window_end_ns);
    m.end_ns = std::max(m.end_ns, p.end_ns);
    m.ramp_capped = m.ramp_capped || p.ramp_capped;
    m.stalls += p.stalls;
    m.backoffs += p.backoffs;
    m.backoff_ns += p.backoff_ns;
    m.warmup_retried += p.warmup_retried;
  }
  const auto ended_by = [&](StopReason r) {
    for (const ScheduleTimes& p : parts) {
      if (p.stopped_by == r) return &p;
    }
    return static_cast<const ScheduleTimes*>(nullptr);
  };
  if (const ScheduleTimes* p = ended_by(StopReason::kStop)) {
    m.stopped = true;
    m.stopped_by = StopReason::kStop;
  } else if ((p = ended_by(StopReason::kUnreachable))) {
    m.stopped_by = StopReason::kUnreachable;
    for (const ScheduleTimes& q : parts) {
      if (!q.stop_reason.empty()) m.stop_reason = q.stop_reason;
    }
  }
  return m;
}

bool pin_to_cpu(std::int32_t i) noexcept {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  const int n = CPU_COUNT(&allowed);
  if (n <= 0) return false;
  int want = i % n;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &allowed)) continue;
    if (want-- > 0) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    return pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
  }
  return false;
}

}  // namespace speedmatrix
