#include "speedmatrix/chain.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "speedmatrix/scheduler.hpp"

namespace speedmatrix {

ChainFeed::ChainFeed(std::int32_t sessions, std::int32_t turns, double think_time_s)
    : sessions_(std::max<std::int32_t>(sessions, 1)),
      turns_(std::max<std::int32_t>(turns, 1)),
      think_ns_(think_time_s > 0 ? static_cast<ns_t>(think_time_s * 1e9) : 0),
      state_(static_cast<std::size_t>(sessions_), State::kRunning),
      turn_(static_cast<std::size_t>(sessions_), 0),
      due_ns_(static_cast<std::size_t>(sessions_), kNever),
      bodies_(static_cast<std::size_t>(sessions_) * static_cast<std::size_t>(turns_)),
      ready_ns_(bodies_.size(), kNever) {}

bool ChainFeed::next_finished(FinishedTurn* out, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto wait = std::chrono::duration<double>(std::max(timeout_s, 0.0));
  finished_cv_.wait_for(lock, wait, [this] { return !finished_.empty() || closed_; });
  if (finished_.empty()) return false;
  *out = std::move(finished_.front());
  finished_.pop_front();
  return true;
}

bool ChainFeed::push(std::int32_t session, std::string body) {
  const ns_t ready = now_ns();  // stamped on arrival, before the lock: what the feeder took
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || session < 0 || session >= sessions_) return false;
  const auto s = static_cast<std::size_t>(session);
  if (state_[s] != State::kWaiting) return false;
  const std::int32_t turn = turn_[s] + 1;
  const std::int32_t index = turn * sessions_ + session;
  const auto i = static_cast<std::size_t>(index);
  // Written once, here; the loop reads it through a string_view from take() on, never
  // under the lock, which is safe because nothing writes bodies_[i] again and bodies_
  // never reallocates.
  bodies_[i] = std::move(body);
  ready_ns_[i] = ready;
  state_[s] = State::kRunning;
  turn_[s] = turn;
  pushed_.push_back(ChainBody{session, turn, index, due_ns_[s], ready, bodies_[i]});
  wake_locked();
  return true;
}

bool ChainFeed::end_session(std::int32_t session) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || session < 0 || session >= sessions_) return false;
  const auto s = static_cast<std::size_t>(session);
  if (state_[s] != State::kWaiting) return false;
  state_[s] = State::kDone;
  ++done_;
  wake_locked();  // the loop may now find every session done
  return true;
}

bool ChainFeed::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

std::vector<ns_t> ChainFeed::ready_ns() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_ns_;
}

void ChainFeed::attach(Transport* transport) {
  std::lock_guard<std::mutex> lock(mu_);
  transport_ = transport;
}

void ChainFeed::finished(FinishedTurn turn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (turn.session < 0 || turn.session >= sessions_) return;
    const auto s = static_cast<std::size_t>(turn.session);
    if (state_[s] != State::kRunning) return;  // never: one request a session at a time
    due_ns_[s] = turn.due_ns;
    if (turn.turn + 1 >= turns_) {
      state_[s] = State::kDone;
      ++done_;
    } else {
      state_[s] = State::kWaiting;
    }
    finished_.push_back(std::move(turn));
  }
  finished_cv_.notify_all();
}

void ChainFeed::take(std::vector<ChainBody>& out) {
  std::lock_guard<std::mutex> lock(mu_);
  out.insert(out.end(), pushed_.begin(), pushed_.end());
  pushed_.clear();
}

bool ChainFeed::all_done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ == sessions_;
}

void ChainFeed::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    transport_ = nullptr;
  }
  finished_cv_.notify_all();
}

void ChainFeed::wake_locked() noexcept {
  // Transport::wake is thread-safe (an eventfd write); under the lock so that the loop
  // cannot detach and destroy the transport between the read of the pointer and the call.
  if (transport_) transport_->wake();
}

}  // namespace speedmatrix
