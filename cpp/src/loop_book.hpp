// The bookkeeping both loops share (scheduler.cpp's closed loop, open_loop.cpp's
// open loop): records created in send order, the requests in flight, and the
// live progress counters. Private to cpp/src.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "speedmatrix/cell.hpp"
#include "speedmatrix/scheduler.hpp"

namespace speedmatrix {

class LoopBook {
 public:
  LoopBook(Transport& t, CellRecords& r, const std::atomic<bool>& stop, CellProgress* p)
      : transport_(t), records_(r), stop_(stop), progress_(p) {}

  // Creates record `id` (not yet sent: the open loop's gate holds some).
  std::int32_t add(std::int32_t slot, std::int32_t body, Phase phase, ns_t scheduled_ns) {
    RequestRecord rec;
    rec.slot = slot;
    rec.body = body;
    rec.phase = phase;
    rec.scheduled_ns = scheduled_ns;
    records_.requests.push_back(std::move(rec));
    return static_cast<std::int32_t>(records_.requests.size() - 1);
  }
  // Hands record `id` to the transport.
  void start(std::int32_t id, std::string_view body) {
    live_.push_back(id);
    if (progress_) progress_->in_flight.fetch_add(1, std::memory_order_relaxed);
    transport_.start(id, body);
  }
  // add then start: the shape run_warmup (warmup.hpp) drives.
  std::int32_t launch(std::int32_t slot, std::int32_t body_index, std::string_view body,
                      Phase phase, ns_t scheduled_ns) {
    const std::int32_t id = add(slot, body_index, phase, scheduled_ns);
    start(id, body);
    return id;
  }
  // One transport poll; returns the ids that finished (valid until the next call).
  const std::vector<std::int32_t>& poll(ns_t deadline) {
    finished_.clear();
    transport_.poll(deadline, finished_);
    for (std::int32_t id : finished_) account(id);
    return finished_;
  }
  void cancel(std::int32_t id) {
    transport_.cancel(id);
    account(id);
  }
  // Cancels every request in flight, oldest first.
  void cancel_all() {
    const std::vector<std::int32_t> ids = live_;
    for (std::int32_t id : ids) cancel(id);
  }
  bool stop_requested() const { return stop_.load(std::memory_order_relaxed); }
  const std::atomic<bool>& stop_requested_flag() const { return stop_; }
  std::int32_t in_flight() const { return static_cast<std::int32_t>(live_.size()); }

 private:
  void account(std::int32_t id) {
    // live_ is the in-flight set, oldest first; the oldest usually finish first, so the
    // search is short.
    auto it = std::find(live_.begin(), live_.end(), id);
    const bool was_live = it != live_.end();
    if (was_live) live_.erase(it);
    if (!progress_) return;
    if (was_live) progress_->in_flight.fetch_sub(1, std::memory_order_relaxed);
    const RequestRecord& r = records_.requests[static_cast<std::size_t>(id)];
    if (r.phase != Phase::kWindow) return;
    if (r.outcome == Outcome::kOk) progress_->completed.fetch_add(1, std::memory_order_relaxed);
    if (r.outcome == Outcome::kError) progress_->errors.fetch_add(1, std::memory_order_relaxed);
  }

  Transport& transport_;
  CellRecords& records_;
  const std::atomic<bool>& stop_;
  CellProgress* progress_;
  std::vector<std::int32_t> live_;
  std::vector<std::int32_t> finished_;
};

}  // namespace speedmatrix
