#include "speedmatrix/clock.hpp"

namespace speedmatrix {
namespace {

ns_t read_clock(clockid_t id) noexcept {
  timespec ts;
  if (clock_gettime(id, &ts) != 0) return kNever;
  return static_cast<ns_t>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

}  // namespace

ns_t thread_cpu_ns() noexcept { return read_clock(CLOCK_THREAD_CPUTIME_ID); }

ns_t process_cpu_ns() noexcept { return read_clock(CLOCK_PROCESS_CPUTIME_ID); }

}  // namespace speedmatrix
