// When the open loop's requests are due: a pacer gives the k-th arrival's offset
// from the window's start. Pure and deterministic (seeded), so a plan can be
// replayed and tested without a clock.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "speedmatrix/clock.hpp"

namespace speedmatrix {

// A pacer says when the k-th request of an open-loop run is due, as an offset
// from the start. Offsets are intended send times: latency is measured from
// them (wrk2's rule against coordinated omission). Pure and deterministic.
class Pacer {
 public:
  virtual ~Pacer() = default;
  // Offset (ns since start) at which request `k` (0, 1, 2, ... called in
  // order) is due, or kNever when the plan ends before it.
  virtual ns_t due_ns(std::int64_t k) = 0;
};

// rate_per_s requests per second, evenly spaced; `count` > 0 bounds the plan.
class ConstantPacer final : public Pacer {
 public:
  explicit ConstantPacer(double rate_per_s, std::int64_t count = 0)
      : rate_(rate_per_s), count_(count) {}
  ns_t due_ns(std::int64_t k) override;

 private:
  double rate_;
  std::int64_t count_;
};

// Arrivals whose gaps (s) are drawn from `Gap`, reproducible by seed: request 0 is due at
// once, each later one a drawn gap after the previous; `count` > 0 bounds the plan and
// `count` < 0 means no arrival at all (the rate or shape given was not positive).
template <class Gap>
class RandomGapPacer : public Pacer {
 public:
  ns_t due_ns(std::int64_t k) override {
    if (count_ < 0 || (count_ > 0 && k >= count_)) return kNever;
    while (next_k_ <= k) {
      if (next_k_ > 0) t_s_ += gap_s_(rng_);
      ++next_k_;
    }
    return static_cast<ns_t>(std::llround(t_s_ * 1e9));
  }

 protected:
  RandomGapPacer(Gap gap_s, std::uint64_t seed, std::int64_t count)
      : rng_(seed), gap_s_(gap_s), count_(count) {}

 private:
  std::mt19937_64 rng_;
  Gap gap_s_;
  std::int64_t count_;
  std::int64_t next_k_ = 0;
  double t_s_ = 0;
};

// Poisson arrivals at rate_per_s (exponential gaps).
class PoissonPacer final : public RandomGapPacer<std::exponential_distribution<double>> {
 public:
  PoissonPacer(double rate_per_s, std::uint64_t seed, std::int64_t count = 0);
};

// Gamma-distributed gaps with mean 1/rate_per_s and shape `shape`: the
// coefficient of variation of the gaps is 1/sqrt(shape), so shape 1 is
// Poisson, < 1 burstier, > 1 more regular (vLLM's "burstiness").
class GammaPacer final : public RandomGapPacer<std::gamma_distribution<double>> {
 public:
  GammaPacer(double rate_per_s, double shape, std::uint64_t seed, std::int64_t count = 0);
};

// Explicit send times (a replayed trace's arrivals, already divided by its
// speed-up): request k is due at schedule_ns[k]; the plan ends after the last.
// Build it with make_schedule_pacer, which checks the times.
class SchedulePacer final : public Pacer {
 public:
  explicit SchedulePacer(std::vector<ns_t> schedule_ns) : schedule_ns_(std::move(schedule_ns)) {}
  ns_t due_ns(std::int64_t k) override;

 private:
  std::vector<ns_t> schedule_ns_;
};

// A SchedulePacer over `schedule_ns`, or null with a one-line reason in *why
// when the list is empty, a time is negative or the times go backwards.
std::unique_ptr<Pacer> make_schedule_pacer(std::vector<ns_t> schedule_ns, std::string* why);

// "constant" | "poisson" | "gamma" (shape used only by gamma). Returns null
// with a one-line reason in *why for an unknown arrival, a rate <= 0 or a
// gamma shape <= 0.
std::unique_ptr<Pacer> make_pacer(const std::string& arrival, double rate_per_s, double gamma_shape,
                                  std::uint64_t seed, std::string* why);

}  // namespace speedmatrix
