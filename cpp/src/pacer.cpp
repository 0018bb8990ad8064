#include "speedmatrix/pacer.hpp"

#include <cmath>

namespace speedmatrix {

ns_t ConstantPacer::due_ns(std::int64_t k) {
  if (rate_ <= 0 || (count_ > 0 && k >= count_)) return kNever;
  return static_cast<ns_t>(std::llround(static_cast<double>(k) * 1e9 / rate_));
}

PoissonPacer::PoissonPacer(double rate_per_s, std::uint64_t seed, std::int64_t count)
    : rng_(seed), gap_s_(rate_per_s > 0 ? rate_per_s : 1.0), count_(rate_per_s > 0 ? count : -1) {}

ns_t PoissonPacer::due_ns(std::int64_t k) {
  if (count_ < 0 || (count_ > 0 && k >= count_)) return kNever;
  // Request 0 is due at once; each later one an exponential gap after the previous.
  while (next_k_ <= k) {
    if (next_k_ > 0) t_s_ += gap_s_(rng_);
    ++next_k_;
  }
  return static_cast<ns_t>(std::llround(t_s_ * 1e9));
}

GammaPacer::GammaPacer(double rate_per_s, double shape, std::uint64_t seed, std::int64_t count)
    : rng_(seed),
      // Mean gap = shape * scale = 1 / rate.
      gap_s_(shape > 0 ? shape : 1.0,
             1.0 / ((shape > 0 ? shape : 1.0) * (rate_per_s > 0 ? rate_per_s : 1.0))),
      count_(rate_per_s > 0 && shape > 0 ? count : -1) {}

ns_t GammaPacer::due_ns(std::int64_t k) {
  if (count_ < 0 || (count_ > 0 && k >= count_)) return kNever;
  while (next_k_ <= k) {
    if (next_k_ > 0) t_s_ += gap_s_(rng_);
    ++next_k_;
  }
  return static_cast<ns_t>(std::llround(t_s_ * 1e9));
}

std::unique_ptr<Pacer> make_pacer(const std::string& arrival, double rate_per_s, double gamma_shape,
                                  std::uint64_t seed, std::string* why) {
  if (!(rate_per_s > 0) || !std::isfinite(rate_per_s)) {
    *why = "rate_per_s must be > 0";
    return nullptr;
  }
  if (arrival == "constant") return std::make_unique<ConstantPacer>(rate_per_s);
  if (arrival == "poisson") return std::make_unique<PoissonPacer>(rate_per_s, seed);
  if (arrival == "gamma") {
    if (!(gamma_shape > 0) || !std::isfinite(gamma_shape)) {
      *why = "gamma_shape must be > 0";
      return nullptr;
    }
    return std::make_unique<GammaPacer>(rate_per_s, gamma_shape, seed);
  }
  *why = "arrival '" + arrival + "' is not constant, poisson or gamma";
  return nullptr;
}

}  // namespace speedmatrix
