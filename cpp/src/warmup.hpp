// The warm-up both loops share (scheduler.cpp's closed loop, open_loop.cpp's
// open loop), so that both start the window from the same server state.
// Private to cpp/src.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "loop_book.hpp"
#include "speedmatrix/cell.hpp"
#include "speedmatrix/scheduler.hpp"

namespace speedmatrix {

// Every body w = first, first + stride, ... (a loop's share, loops.hpp; all of them by
// default) is sent at once (slot = body = w, Phase::kWarmup), then
// all are awaited up to timeout_ns (<= 0: no bound); what failed or timed out
// is cancelled and sent again, up to `retries` times, each try bounded by the
// same timeout. Sets times.warmup_start_ns and times.warmup_retried, and the
// progress's warm-up counters (progress may be null). Each finished request
// is handed to on_finished(id). Returns false when a stop was requested
// (the caller ends the cell).
template <class OnFinished>
bool run_warmup(const std::vector<std::string_view>& bodies, ns_t timeout_ns, std::int32_t retries,
                LoopBook& loop, Clock& clock, CellRecords& records, CellProgress* progress,
                ScheduleTimes& times, OnFinished on_finished, std::size_t first = 0,
                std::size_t stride = 1) {
  std::vector<std::size_t> pending;
  for (std::size_t i = first; i < bodies.size(); i += stride) pending.push_back(i);
  if (pending.empty()) return !loop.stop_requested();
  times.warmup_start_ns = clock.now();
  if (progress)  // every loop adds its share
    progress->warmup_total.fetch_add(static_cast<std::int32_t>(pending.size()));
  for (std::int32_t attempt = 0; !pending.empty() && attempt <= retries; ++attempt) {
    if (attempt > 0) times.warmup_retried += static_cast<std::int32_t>(pending.size());
    const ns_t start = clock.now();
    std::vector<std::pair<std::int32_t, std::size_t>> live;  // (request id, body)
    live.reserve(pending.size());
    for (std::size_t i : pending) {
      live.emplace_back(loop.launch(static_cast<std::int32_t>(i), static_cast<std::int32_t>(i),
                                    bodies[i], Phase::kWarmup, start),
                        i);
    }
    const ns_t deadline = timeout_ns > 0 ? start + timeout_ns : kNoDeadline;
    std::vector<char> done(records.requests.size(), 0);
    while (loop.in_flight() > 0 && !loop.stop_requested() && clock.now() < deadline) {
      for (std::int32_t id : loop.poll(deadline)) {
        done[static_cast<std::size_t>(id)] = 1;
        on_finished(id);
        if (progress && records.requests[static_cast<std::size_t>(id)].outcome == Outcome::kOk)
          progress->warmup_done.fetch_add(1, std::memory_order_relaxed);
      }
    }
    pending.clear();
    for (auto [id, body] : live) {
      if (!done[static_cast<std::size_t>(id)]) loop.cancel(id);
      if (records.requests[static_cast<std::size_t>(id)].outcome != Outcome::kOk)
        pending.push_back(body);
    }
    if (loop.stop_requested()) break;
  }
  return !loop.stop_requested();
}

}  // namespace speedmatrix
