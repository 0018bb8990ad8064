#include "speedmatrix/pacer.hpp"

#include <cmath>
#include <cstddef>

namespace speedmatrix {

ns_t ConstantPacer::due_ns(std::int64_t k) {
  if (rate_ <= 0 || (count_ > 0 && k >= count_)) return kNever;
  return static_cast<ns_t>(std::llround(static_cast<double>(k) * 1e9 / rate_));
}

PoissonPacer::PoissonPacer(double rate_per_s, std::uint64_t seed, std::int64_t count)
    : RandomGapPacer(std::exponential_distribution<double>(rate_per_s > 0 ? rate_per_s : 1.0), seed,
                     rate_per_s > 0 ? count : -1) {}

GammaPacer::GammaPacer(double rate_per_s, double shape, std::uint64_t seed, std::int64_t count)
    : RandomGapPacer(
          // Mean gap = shape * scale = 1 / rate.
          std::gamma_distribution<double>(
              shape > 0 ? shape : 1.0,
              1.0 / ((shape > 0 ? shape : 1.0) * (rate_per_s > 0 ? rate_per_s : 1.0))),
          seed, rate_per_s > 0 && shape > 0 ? count : -1) {}

ns_t SchedulePacer::due_ns(std::int64_t k) {
  if (k < 0 || static_cast<std::size_t>(k) >= schedule_ns_.size()) return kNever;
  return schedule_ns_[static_cast<std::size_t>(k)];
}

std::unique_ptr<Pacer> make_schedule_pacer(std::vector<ns_t> schedule_ns, std::string* why) {
  if (schedule_ns.empty()) {
    *why = "schedule_ns is empty";
    return nullptr;
  }
  for (std::size_t i = 0; i < schedule_ns.size(); ++i) {
    if (schedule_ns[i] < 0 || (i > 0 && schedule_ns[i] < schedule_ns[i - 1])) {
      *why = "schedule_ns[" + std::to_string(i) + "] is negative or earlier than the one before";
      return nullptr;
    }
  }
  return std::make_unique<SchedulePacer>(std::move(schedule_ns));
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
