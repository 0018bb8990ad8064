// Monotonic time in nanoseconds. Every duration speedmatrix reports is a
// difference of two readings of this clock; the wall clock is never used to
// measure. CLOCK_MONOTONIC is system-wide, so readings taken in the built-in
// engine's process and in the client's process on one machine compare directly.
#pragma once

#include <cstdint>
#include <ctime>

namespace speedmatrix {

using ns_t = std::int64_t;  // nanoseconds on CLOCK_MONOTONIC; -1 = "never happened"

inline constexpr ns_t kNever = -1;

// ~17 ns through the vDSO. Read once per socket read, before any parsing.
inline ns_t now_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<ns_t>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

// An injectable clock, so the scheduler and the engine model can be driven by
// a fake clock in tests.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual ns_t now() = 0;
};

class SystemClock final : public Clock {
 public:
  ns_t now() override { return now_ns(); }
};

// Thread CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), for the
// client's self-check.
ns_t thread_cpu_ns() noexcept;
// CPU time of the whole process (user + system).
ns_t process_cpu_ns() noexcept;

}  // namespace speedmatrix
