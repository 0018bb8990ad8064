// A chain feed (CellSpec::chain): the bodies of a closed-loop cell's later turns, fed
// from outside while the cell runs, so that N sessions of T turns run free, each sending
// its next turn as soon as its own answer arrived (plus the think time), never waiting
// for the others (issue 23; python/speedmatrix/sessions.py builds the bodies).
//
// The closed loop (closed_loop.cpp) sends the N first-turn bodies (CellSpec::bodies,
// session s = slot s) and, when a session's request finishes, hands it here
// (`finished`: outcome, times, and the kept output). A feeder on another thread takes it
// (`next_finished`), builds the next turn's body from the answer and `push`es it; the loop
// `take`s it and sends it no earlier than its due time (the answer's end + the think
// time). The cell ends when `all_done` (every session did its T turns or was ended), at
// its duration, or on a stop; then the cell `close`s the feed and the feeder's wait ends.
//
// Body index of session s's turn k: k x sessions + s (one flat set of records).
// Thread-safe: one mutex guards everything; a push wakes the loop through its
// Transport::wake (an eventfd), so the loop never polls the feed in a spin.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "speedmatrix/clock.hpp"
#include "speedmatrix/openai.hpp"
#include "speedmatrix/records.hpp"

namespace speedmatrix {

class Transport;  // scheduler.hpp

// One finished turn, as the feeder sees it.
struct FinishedTurn {
  std::int32_t session = 0;
  std::int32_t turn = 0;
  std::int32_t body = 0;  // turn x sessions + session
  Outcome outcome = Outcome::kPending;
  std::string error_kind;  // "" unless outcome is kError
  ns_t sent_ns = kNever;
  ns_t done_ns = kNever;
  ns_t due_ns = kNever;  // the session's next turn is sent no sooner (done + think, or a backoff)
  RequestOutput output;  // what its stream delivered (CellSpec::keep_output), else empty
};

// One pushed body, as the loop takes it.
struct ChainBody {
  std::int32_t session = 0;
  std::int32_t turn = 0;
  std::int32_t body = 0;
  ns_t due_ns = kNever;    // send no sooner than this (the request's scheduled_ns)
  ns_t ready_ns = kNever;  // when the feeder pushed it (body_ready_ns)
  std::string_view text;   // lives as long as the feed (never written again once pushed)
};

class ChainFeed {
 public:
  // REQUIRES: sessions >= 1, turns >= 1. think_time_s < 0 counts as 0.
  ChainFeed(std::int32_t sessions, std::int32_t turns, double think_time_s);
  ChainFeed(const ChainFeed&) = delete;
  ChainFeed& operator=(const ChainFeed&) = delete;

  std::int32_t sessions() const noexcept { return sessions_; }
  std::int32_t turns() const noexcept { return turns_; }
  ns_t think_ns() const noexcept { return think_ns_; }

  // --- the feeder's side (any thread) ---
  // Waits up to timeout_s for a finished turn: true with *out filled (in the order they
  // finished); false on the timeout, or when the feed is closed and every finished turn was
  // taken (closed() then says so).
  bool next_finished(FinishedTurn* out, double timeout_s);
  // The body of `session`'s next turn (the one after its last finished turn); stamps its
  // body_ready_ns and wakes the loop. False, and the body dropped, when the session is not
  // waiting for one: out of range, its last turn done, ended, already pushed, or closed.
  bool push(std::int32_t session, std::string body);
  // Ends a session that waits for its next body: it sends no more turns. False when it was
  // not waiting (out of range, running, done, closed).
  bool end_session(std::int32_t session);
  bool closed() const;
  // body_ready_ns by body index (sessions x turns): when each later turn's body was pushed;
  // kNever for the first turn's (given up front) and for a turn never pushed.
  std::vector<ns_t> ready_ns() const;

  // --- the loop's side (one loop: the cell runs one when it has a chain) ---
  // The transport a push wakes; nullptr detaches (before the transport goes).
  void attach(Transport* transport);
  // A session's request finished (done, failed, cut as a stall): hands it to the feeder.
  // Its session then waits for its next body, or is done after its last turn.
  void finished(FinishedTurn turn);
  // Moves the bodies pushed since the last call into `out` (appended).
  void take(std::vector<ChainBody>& out);
  // Every session did its turns or was ended.
  bool all_done() const;
  // The cell ended: no more pushes; a waiting next_finished returns once the queue is empty.
  void close();

 private:
  enum class State : std::uint8_t { kRunning, kWaiting, kDone };
  void wake_locked() noexcept;

  const std::int32_t sessions_, turns_;
  const ns_t think_ns_;
  mutable std::mutex mu_;
  std::condition_variable finished_cv_;
  std::deque<FinishedTurn> finished_;  // not yet taken by the feeder
  std::vector<State> state_;           // by session
  std::vector<std::int32_t> turn_;     // by session: its running or last finished turn
  std::vector<ns_t> due_ns_;           // by session: when its next turn may be sent
  std::int32_t done_ = 0;              // sessions in kDone
  std::vector<std::string> bodies_;    // by body index; sized once, so texts never move
  std::vector<ns_t> ready_ns_;         // by body index
  std::vector<ChainBody> pushed_;      // not yet taken by the loop
  Transport* transport_ = nullptr;
  bool closed_ = false;
};

}  // namespace speedmatrix
