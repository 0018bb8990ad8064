#include "speedmatrix/records.hpp"

#include <algorithm>
#include <limits>

namespace speedmatrix {

void NsColumn::push_back(ns_t t) {
  if (blocks_.empty() || t < blocks_.back().base ||
      static_cast<std::uint64_t>(t - blocks_.back().base) >
          std::numeric_limits<std::uint32_t>::max()) {
    blocks_.push_back({t, offsets_.size()});
  }
  offsets_.push_back(static_cast<std::uint32_t>(t - blocks_.back().base));
}

ns_t NsColumn::operator[](std::size_t i) const {
  // the last block whose first entry is <= i
  auto it = std::upper_bound(blocks_.begin(), blocks_.end(), i,
                             [](std::size_t v, const Block& b) { return v < b.first; });
  return std::prev(it)->base + static_cast<ns_t>(offsets_[i]);
}

std::vector<ns_t> NsColumn::to_vector() const {
  std::vector<ns_t> out(offsets_.size());
  for (std::size_t b = 0; b < blocks_.size(); ++b) {
    std::size_t end = b + 1 < blocks_.size() ? blocks_[b + 1].first : offsets_.size();
    for (std::size_t i = blocks_[b].first; i < end; ++i)
      out[i] = blocks_[b].base + static_cast<ns_t>(offsets_[i]);
  }
  return out;
}

std::size_t NsColumn::memory_bytes() const noexcept {
  return offsets_.capacity() * sizeof(std::uint32_t) + blocks_.capacity() * sizeof(Block);
}

void CountColumn::push_back(std::int32_t v) {
  if (v >= 0 && v < kEscape) {
    small_.push_back(static_cast<std::uint16_t>(v));
  } else {
    large_.emplace_back(small_.size(), v);
    small_.push_back(kEscape);
  }
}

std::int32_t CountColumn::operator[](std::size_t i) const {
  if (small_[i] != kEscape) return small_[i];
  auto it = std::lower_bound(large_.begin(), large_.end(), i,
                             [](const auto& e, std::size_t v) { return e.first < v; });
  return it->second;
}

std::vector<std::int32_t> CountColumn::to_vector() const {
  std::vector<std::int32_t> out(small_.begin(), small_.end());
  for (const auto& [i, v] : large_) out[i] = v;
  return out;
}

std::size_t CountColumn::memory_bytes() const noexcept {
  return small_.capacity() * sizeof(std::uint16_t) +
         large_.capacity() * sizeof(std::pair<std::size_t, std::int32_t>);
}

void StampColumn::push_back(ns_t v) {
  if (!dense_ && v != kNever) {
    values_.assign(n_, kNever);
    dense_ = true;
  }
  if (dense_) values_.push_back(v);
  ++n_;
}

std::vector<ns_t> StampColumn::to_vector() const {
  return dense_ ? values_ : std::vector<ns_t>(n_, kNever);
}

void EventColumns::reserve(std::size_t n) {
  request.reserve(n);
  t_ns.reserve(n);
  tokens.reserve(n);
  server_ns.reserve(n);
}

std::size_t EventColumns::memory_bytes() const noexcept {
  return request.capacity() * sizeof(std::int32_t) + t_ns.memory_bytes() + tokens.memory_bytes() +
         server_ns.memory_bytes();
}

}  // namespace speedmatrix
