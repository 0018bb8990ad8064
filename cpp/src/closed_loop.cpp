// The closed loop of a cell (scheduler.hpp run_closed_loop): warm-up, then N
// slots refilled as each finishes, the window's opening, stalls, backoffs and
// the early end, then cancellation; with a chain (chain.hpp), free-running sessions whose
// later turns a feeder pushes. One ClosedLoop object per run; each step of its event loop
// is a short method.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loop_book.hpp"
#include "loop_run.hpp"
#include "speedmatrix/cell.hpp"
#include "speedmatrix/chain.hpp"
#include "speedmatrix/loops.hpp"
#include "speedmatrix/scheduler.hpp"
#include "warmup.hpp"

namespace speedmatrix {
namespace {

struct Refill {
  ns_t due_ns;
  std::int32_t slot;  // this loop's own (local) slot
  ns_t since_ns;      // the failed request's end: a backoff's wait runs from there
  bool backoff;       // imposed by the BackoffPolicy (counted in backoffs / backoff_ns)
  bool operator>(const Refill& o) const { return due_ns > o.due_ns; }
};

// A session's next turn, pushed by the chain's feeder, waiting for its due time.
struct ChainSend {
  ChainBody body;
  bool operator>(const ChainSend& o) const { return body.due_ns > o.body.due_ns; }
};

// Running median of the gaps between a window request's token arrivals (ns
// per token, weighted by tokens), in log buckets of 2^(1/16) (~4.4%): O(1)
// per event, good enough for a threshold 25 times larger.
class GapHistogram {
 public:
  void add(ns_t gap_ns, std::int64_t tokens) {
    if (gap_ns <= 0 || tokens <= 0) return;
    const double per = static_cast<double>(gap_ns) / static_cast<double>(tokens) / 1e3;  // us
    const auto b = static_cast<std::int64_t>(std::floor(16 * std::log2(std::max(per, 1.0))));
    counts_[static_cast<std::size_t>(std::clamp<std::int64_t>(b, 0, kBuckets - 1))] += tokens;
    total_ += tokens;
  }
  double median_ms() const {
    if (total_ == 0) return std::nan("");
    std::int64_t cum = 0;
    for (std::size_t b = 0; b < kBuckets; ++b) {
      cum += counts_[b];
      if (2 * cum >= total_) return std::exp2((static_cast<double>(b) + 0.5) / 16) / 1e3;
    }
    return std::nan("");
  }

 private:
  static constexpr std::size_t kBuckets = 560;  // up to ~35 minutes per token
  std::int64_t counts_[kBuckets] = {};
  std::int64_t total_ = 0;
};

// What the stall rule knows of one streaming request from its token events.
struct TokenPace {
  ns_t first_ns, last_ns;
  std::int64_t later_tokens;  // tokens after the first event's
  StreamSilence silence(ns_t now, ns_t sent_ns) const {
    StreamSilence s;
    s.silent_ns = now - last_ns;
    if (later_tokens > 0) s.gap_ns = (last_ns - first_ns) / later_tokens;
    if (sent_ns != kNever) s.first_wait_ns = first_ns - sent_ns;
    return s;
  }
};

std::string ms_text(double ms) {
  if (std::isnan(ms)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", ms);
  return buf;
}

// "no token for 2100 ms (stall limit 2000 ms: max(2000 ms, 25 x median gap 10.0 ms, own
// pace 25 x 10.0 ms))"
std::string stall_message(const StreamSilence& s, double median_ms, const ClosedLoopPlan& plan) {
  const ns_t limit = stall_limit_ns(s, median_ms, plan.stall_min_ns, plan.stall_gap_factor);
  char factor[32];
  std::snprintf(factor, sizeof factor, "%g", plan.stall_gap_factor);
  const std::string own =
      s.gap_ns > 0
          ? std::string(factor) + " x " + ms_text(static_cast<double>(s.gap_ns) / 1e6)
          : "2 x first token's wait " + ms_text(static_cast<double>(s.first_wait_ns) / 1e6);
  return "no token for " + std::to_string(s.silent_ns / 1'000'000) + " ms (stall limit " +
         std::to_string(limit / 1'000'000) + " ms: max(" +
         std::to_string(plan.stall_min_ns / 1'000'000) + " ms, " + factor + " x median gap " +
         ms_text(median_ms) + ", own pace " + own + "))";
}

class ClosedLoop : LoopRun<ClosedLoopPlan> {
 public:
  ClosedLoop(const ClosedLoopPlan& plan, Transport& transport, Clock& clock, CellRecords& records,
             const std::atomic<bool>& stop, CellProgress* progress)
      : LoopRun(plan, transport, clock, records, stop, progress,
                std::max<std::int32_t>(plan.concurrency, 1)),
        n_(static_cast<std::size_t>(
            group_.share(index_, std::max<std::int32_t>(plan.concurrency, 1)))),
        transport_(transport),
        slot_request_(n_, -1),
        slot_first_token_(n_, kNever),
        stalls_on_(plan.stall_min_ns > 0),
        chain_(plan.chain) {
    times_.stall_median_gap_ms = std::nan("");
  }

  ScheduleTimes run() {
    // Warm-up (warmup.hpp): everything at once, then wait for all (or the
    // timeout); what failed or timed out is sent again, up to warmup_retries times.
    if (!warm_up([&](std::int32_t id) { backoff_after(id); })) return stopped_before_window();
    // Every loop's warm-up is over: the ramp starts at one time for all.
    ramp_start_ = group_.arrive(clock_, loop_.stop_requested_flag());
    if (ramp_start_ == kNever) return stopped_before_window();
    // A push wakes this loop's poll from the feeder's thread (detached before the
    // transport goes: run_loop destroys it after this returns).
    if (chain_) chain_->attach(&transport_);
    struct Detach {
      ChainFeed* chain;
      ~Detach() {
        if (chain) chain->attach(nullptr);
      }
    } detach{chain_};
    start_ramp();
    while (step()) {
    }
    finish();
    return times_;
  }

 private:
  // Global slot (records, the group) of local slot j, and back (n_: not this loop's).
  std::int32_t global_slot(std::size_t j) const {
    return index_ + static_cast<std::int32_t>(j) * loops_;
  }
  std::size_t local_slot(std::int32_t k) const {
    if (k < index_ || (k - index_) % loops_ != 0) return n_;
    return std::min(static_cast<std::size_t>((k - index_) / loops_), n_);
  }
  bool may_start() const { return group_.budget_left(plan_.max_requests); }
  // Local slot j sends global slot k's body, bodies[k % size], if the budget allows.
  void launch_slot(std::size_t slot, ns_t scheduled) {
    if (!group_.take_request(plan_.max_requests)) return;
    const std::int32_t k = global_slot(slot);
    const std::size_t b = static_cast<std::size_t>(k) % plan_.bodies.size();
    slot_request_[slot] =
        loop_.launch(k, static_cast<std::int32_t>(b), plan_.bodies[b], Phase::kWindow, scheduled);
  }

  // Window: N slots, each refilled with its own body as soon as it finishes. The
  // ramp's start is read once, before the first hand-over: requests are timed
  // from when they were sent, not from when the last of N was queued.
  void start_ramp() {
    times_.ramp_start_ns = ramp_start_;
    // sessions (a chain): the window opens at the first turns' send, as a request-count cell's
    const bool steady = plan_.steady_window && plan_.max_requests <= 0 && !chain_;
    if (!steady) open_window(ramp_start_);
    for (std::size_t k = 0; k < n_ && may_start(); ++k) launch_slot(k, ramp_start_);
    next_tick_ = ramp_start_ + plan_.tick_ns;
    last_done_ = ramp_start_;
  }

  // The slot time of an imposed wait [since, until) that lies inside the window
  // [t0, window end]: a wait that began in the ramp (a first wave answered 429 before
  // the window opened) counts from t0 only.
  ns_t window_wait_ns(ns_t since, ns_t until) const {
    if (t0_ == kNever) return 0;
    const ns_t from = std::max(since, t0_);
    return until > from ? until - from : 0;
  }

  void open_window(ns_t at) {
    t0_ = at;
    times_.window_start_ns = t0_;
    end_at_ = plan_.duration_ns > 0 ? t0_ + plan_.duration_ns : kNoDeadline;
    if (plan_.should_end) next_check_ = t0_ + std::max<ns_t>(plan_.min_duration_ns, 0);
    if (!progress_) return;
    // the live figure counts window tokens only: the ramp's are dropped (a t0 in the
    // past keeps the tokens that arrived since); with many loops each drops its own
    std::int64_t before = 0, since = 0;
    records_.events.for_each(0, records_.events.size(),
                             [&](std::size_t, std::int32_t req, ns_t t, std::int32_t tokens) {
                               const auto q = static_cast<std::size_t>(req);
                               if (q < records_.requests.size() &&
                                   std::as_const(records_.requests)[q].phase == Phase::kWindow)
                                 (t >= t0_ ? since : before) += tokens;
                             });
    if (loops_ == 1)
      progress_->tokens.store(since, std::memory_order_relaxed);
    else
      progress_->tokens.fetch_sub(before, std::memory_order_relaxed);
    progress_->window_start_ns.store(t0_, std::memory_order_relaxed);
  }

  void note_streamed(const RequestRecord& rec) {
    const std::size_t slot = local_slot(rec.slot);
    if (rec.phase == Phase::kWindow && rec.first_token_ns != kNever && slot < n_ &&
        slot_first_token_[slot] == kNever) {
      slot_first_token_[slot] = rec.first_token_ns;
      group_.note_first_token(rec.slot, rec.first_token_ns);
    }
  }

  // During the ramp: opens the window at steady state (steady_window_open).
  void try_open_window(ns_t now) {
    for (std::size_t k = 0; k < n_; ++k) {
      if (slot_request_[k] >= 0)
        note_streamed(records_.requests[static_cast<std::size_t>(slot_request_[k])]);
    }
    // Every slot of every loop (LoopGroup::open_window); with a whole wave failed and
    // nothing streaming, at once.
    bool capped = false;
    const ns_t at =
        group_.open_window(ramp_start_, now, plan_.plateau_settle_ns, plan_.ramp_cap_ns, &capped);
    if (at != kNever) {
      times_.ramp_capped = capped;
      open_window(at);
    }
  }

  // Asks should_end when due; true ends the window now.
  bool precision_says_end(ns_t now) {
    if (t0_ == kNever || now < next_check_) return false;
    if (plan_.should_end(t0_, now)) {
      times_.stopped_by = StopReason::kPrecision;
      end_at_ = now;
      return true;
    }
    // The check reads every window event, so it costs more as the window grows (a second
    // at ~400 s of 25K events/s): asked no sooner than 4x its own cost after it ends, it
    // takes at most a fifth of the loop's time, whatever the window.
    const ns_t checked = clock_.now();
    next_check_ = checked + std::max<ns_t>({plan_.check_interval_ns - (checked - now),
                                            4 * (checked - now), 1'000'000});
    return false;
  }

  // Token events of window requests feed the stall rule: each request's pace and the
  // cell's running median gap. Events already spilled to disk (records.hpp) are read back
  // in blocks: a tick's worth.
  void scan_events() {
    const std::size_t m = records_.events.size();
    records_.events.for_each(events_seen_, m,
                             [&](std::size_t, std::int32_t req, ns_t t, std::int32_t tokens) {
                               const auto q = static_cast<std::size_t>(req);
                               // const: an event of a request finished and spilled since the last
                               // tick is read back
                               if (q >= records_.requests.size() ||
                                   std::as_const(records_.requests)[q].phase != Phase::kWindow)
                                 return;
                               auto [it, fresh] = pace_.try_emplace(req, TokenPace{t, t, 0});
                               if (!fresh && t > it->second.last_ns) {
                                 gaps_.add(t - it->second.last_ns, tokens);
                                 it->second.last_ns = t;
                                 it->second.later_tokens += tokens;
                               }
                             });
    events_seen_ = m;
    // Every event of a request no slot holds has now been seen: it gets no more.
    std::erase_if(pace_, [&](const auto& e) {
      const std::size_t slot =
          local_slot(std::as_const(records_.requests)[static_cast<std::size_t>(e.first)].slot);
      return slot >= n_ || slot_request_[slot] != e.first;
    });
  }

  // Cuts the streams the stall rule (stalled_streams) calls stalled; their slots are
  // refilled at once.
  void cut_stalls(ns_t now) {
    scan_events();
    const double median_ms = gaps_.median_ms();
    std::vector<std::size_t> streaming;  // slots whose request has had a token
    std::vector<StreamSilence> silences;
    std::size_t in_flight = 0;
    for (std::size_t k = 0; k < n_; ++k) {
      const std::int32_t id = slot_request_[k];
      if (id >= 0) ++in_flight;
      const auto seen = id >= 0 ? pace_.find(id) : pace_.end();
      if (seen == pace_.end()) continue;
      streaming.push_back(k);
      silences.push_back(
          seen->second.silence(now, records_.requests[static_cast<std::size_t>(id)].sent_ns));
    }
    const std::vector<bool> cut =
        stalled_streams(silences, in_flight, median_ms, plan_.stall_min_ns, plan_.stall_gap_factor,
                        plan_.stall_pause_cap_ns);
    for (std::size_t s = 0; s < streaming.size(); ++s) {
      if (cut[s]) cut_stall(streaming[s], silences[s], median_ms, now);
    }
  }

  void cut_stall(std::size_t slot, const StreamSilence& silence, double median_ms, ns_t now) {
    const std::int32_t id = slot_request_[slot];
    loop_.cancel(id);
    RequestRecord& rec = records_.requests[static_cast<std::size_t>(id)];
    rec.outcome = Outcome::kError;
    rec.error_kind = kStallKind;
    rec.error_message = stall_message(silence, median_ms, plan_);
    if (progress_) progress_->errors.fetch_add(1, std::memory_order_relaxed);
    ++times_.stalls;
    const ns_t wait = backoff_after(id);
    slot_request_[slot] = -1;
    last_done_ = std::max(last_done_, now);
    if (chain_)
      hand_to_chain(id, now, wait);  // the feeder decides the session's next turn
    else if (may_start())
      launch_slot(slot, now);
  }

  void launch_due_refills(ns_t now) {
    while (!refills_.empty() && refills_.top().due_ns <= now) {
      const Refill r = refills_.top();
      refills_.pop();
      if (r.backoff) times_.backoff_ns += window_wait_ns(r.since_ns, r.due_ns);
      if (may_start()) launch_slot(static_cast<std::size_t>(r.slot), r.due_ns);
    }
  }

  // A session's request ended: the chain gets it, with the time its next turn is due (the
  // answer's end + the think time; a failed one no sooner than error_backoff_ns from its send
  // and what the BackoffPolicy asks, as a refill would wait).
  void hand_to_chain(std::int32_t id, ns_t finished_at, ns_t wait) {
    const RequestRecord& rec = std::as_const(records_.requests)[static_cast<std::size_t>(id)];
    FinishedTurn t;
    t.session = rec.slot;
    t.body = rec.body;
    t.turn = rec.body / chain_->sessions();
    t.outcome = rec.outcome;
    t.error_kind = rec.error_kind;
    t.sent_ns = rec.sent_ns;
    t.done_ns = finished_at;
    t.due_ns = finished_at + chain_->think_ns();
    if (rec.outcome == Outcome::kError && rec.sent_ns != kNever)
      t.due_ns = std::max(t.due_ns, rec.sent_ns + plan_.error_backoff_ns);
    if (wait > 0) t.due_ns = std::max(t.due_ns, finished_at + wait);
    // a copy: the cell's outputs keep theirs (CellResult::outputs)
    if (static_cast<std::size_t>(id) < records_.outputs.size())
      t.output = records_.outputs[static_cast<std::size_t>(id)];
    chain_->finished(std::move(t));
  }

  // Takes what the feeder pushed, and sends each session's next turn once due. Its
  // scheduled_ns is the due time even when its body came later: sent - scheduled is then the
  // feeder's lateness, measured (session_send_late_p99_ms), not hidden.
  void launch_chain(ns_t now) {
    taken_.clear();
    chain_->take(taken_);
    for (const ChainBody& b : taken_) chain_due_.push({b});
    while (!chain_due_.empty() && chain_due_.top().body.due_ns <= now) {
      const ChainBody b = chain_due_.top().body;
      chain_due_.pop();
      const std::size_t slot = local_slot(b.session);
      if (slot >= n_ || slot_request_[slot] >= 0) continue;  // never: one turn a session
      slot_request_[slot] = loop_.launch(b.session, b.body, b.text, Phase::kWindow, b.due_ns);
    }
  }

  // Free-running sessions are over: nothing in flight or waiting, and no session will send
  // again (all_done: no push can come any more).
  bool chain_over() const {
    return loop_.in_flight() == 0 && chain_due_.empty() && chain_->all_done();
  }

  ns_t poll_deadline() const {
    ns_t deadline = std::min(end_at_, next_check_);
    if (!refills_.empty()) deadline = std::min(deadline, refills_.top().due_ns);
    if (!chain_due_.empty()) deadline = std::min(deadline, chain_due_.top().body.due_ns);
    if (t0_ == kNever || stalls_on_) deadline = std::min(deadline, next_tick_);
    return deadline;
  }

  // A window request finished: its slot is refilled now or after the wait it is owed.
  void on_finished(std::int32_t id) {
    const ns_t wait = backoff_after(id);
    const RequestRecord& rec = records_.requests[static_cast<std::size_t>(id)];
    if (rec.phase != Phase::kWindow) return;
    const std::size_t slot = local_slot(rec.slot);
    if (slot >= n_) return;  // not a slot of this loop (never)
    if (t0_ == kNever) {
      note_streamed(rec);
      if (rec.outcome == Outcome::kError) group_.note_ramp_failure();
    }
    slot_request_[slot] = -1;
    const ns_t now = clock_.now();
    const ns_t finished_at = rec.done_ns != kNever ? rec.done_ns : now;
    last_done_ = std::max(last_done_, finished_at);
    if (!gave_up_ && backoff_.give_up(finished_at)) {
      gave_up_ = true;
      times_.stop_reason = backoff_.give_up_reason(finished_at);
      group_.abort(times_.stop_reason);  // every loop ends
    }
    if (chain_) {  // a session's turn: no refill, the feeder pushes its next one
      hand_to_chain(id, finished_at, wait);
      return;
    }
    if (gave_up_ || !may_start() || now >= end_at_ || loop_.stop_requested()) return;
    // A failed request's slot waits at least error_backoff_ns from its send,
    // and what the BackoffPolicy asks from its end (a 429, a refused connection).
    ns_t due = finished_at;
    if (rec.outcome == Outcome::kError && rec.sent_ns != kNever)
      due = std::max(due, rec.sent_ns + plan_.error_backoff_ns);
    const bool imposed = wait > 0 && finished_at + wait > due;
    if (imposed) {
      due = finished_at + wait;
      ++times_.backoffs;
    }
    if (due > now) {
      refills_.push({due, static_cast<std::int32_t>(slot), finished_at, imposed});
    } else {
      if (imposed) times_.backoff_ns += window_wait_ns(finished_at, due);
      launch_slot(slot, finished_at);
    }
  }

  // One turn of the event loop; false when the window has ended.
  bool step() {
    const ns_t now = turn_start();
    if (now == kNever) return false;
    if (t0_ == kNever) try_open_window(now);
    if (now >= end_at_) {
      times_.stopped_by = StopReason::kDuration;
      return false;
    }
    if (precision_says_end(now)) return false;
    if (stalls_on_ && now >= next_tick_) cut_stalls(now);
    if (now >= next_tick_) next_tick_ = now + std::max<ns_t>(plan_.tick_ns, 1'000'000);
    launch_due_refills(now);
    if (chain_) launch_chain(now);
    const bool over = chain_ ? chain_over()  // every session done
                             : loop_.in_flight() == 0 && (refills_.empty() || !may_start());
    if (over) {  // budget spent
      times_.stopped_by = StopReason::kRequests;
      return false;
    }
    for (std::int32_t id : loop_.poll(poll_deadline())) on_finished(id);
    if (!gave_up_ && group_.aborted()) {  // another loop gave up
      gave_up_ = true;
      times_.stop_reason = group_.abort_reason();
    }
    if (gave_up_) {
      times_.stopped_by = StopReason::kUnreachable;
      gave_up_at_ = clock_.now();
      return false;
    }
    return true;
  }

  void finish() {
    if (t0_ == kNever) open_window(ramp_start_);  // stopped or spent during the ramp
    if (times_.stopped) {
      times_.window_end_ns = clock_.now();
    } else if (times_.stopped_by == StopReason::kUnreachable) {
      times_.window_end_ns = std::max(gave_up_at_, t0_);
    } else if (times_.stopped_by == StopReason::kDuration ||
               times_.stopped_by == StopReason::kPrecision) {
      times_.window_end_ns = end_at_;
    } else {
      times_.window_end_ns = last_done_;
    }
    // Backoffs still waiting at the end count up to the window's end.
    for (; !refills_.empty(); refills_.pop()) {
      const Refill& r = refills_.top();
      if (r.backoff)
        times_.backoff_ns += window_wait_ns(r.since_ns, std::min(r.due_ns, times_.window_end_ns));
    }
    for (std::int32_t id : slot_request_) {
      if (id >= 0) loop_.cancel(id);
    }
    if (stalls_on_) times_.stall_median_gap_ms = gaps_.median_ms();
    times_.end_ns = clock_.now();
  }

  const std::size_t n_;                     // this loop's slots
  Transport& transport_;                    // woken by the chain's pushes
  std::vector<std::int32_t> slot_request_;  // by slot: its request in flight, or -1
  std::priority_queue<Refill, std::vector<Refill>, std::greater<>> refills_;
  ns_t ramp_start_ = kNever;
  ns_t t0_ = kNever;
  ns_t end_at_ = kNoDeadline;
  ns_t next_check_ = kNoDeadline;
  ns_t next_tick_ = kNoDeadline;
  ns_t last_done_ = kNever;
  std::vector<ns_t> slot_first_token_;  // the ramp: first token per local slot
  const bool stalls_on_;
  // by request id, for the requests in flight at the last scan (so it does not grow with
  // the window: finished ones are dropped once their events have been scanned)
  std::unordered_map<std::int32_t, TokenPace> pace_;
  std::size_t events_seen_ = 0;
  GapHistogram gaps_;
  bool gave_up_ = false;
  ns_t gave_up_at_ = kNever;
  ChainFeed* const chain_;  // free-running sessions, else nullptr
  std::vector<ChainBody> taken_;
  std::priority_queue<ChainSend, std::vector<ChainSend>, std::greater<>> chain_due_;
};

}  // namespace

ScheduleTimes run_closed_loop(const ClosedLoopPlan& plan, Transport& transport, Clock& clock,
                              CellRecords& records, const std::atomic<bool>& stop,
                              CellProgress* progress) {
  return ClosedLoop(plan, transport, clock, records, stop, progress).run();
}

}  // namespace speedmatrix
