// The deterministic vocabulary of the built-in engine: one token = one word.
#include <cstring>

#include "speedmatrix/sim.hpp"

namespace speedmatrix::sim {

std::string token_word(std::uint64_t id) {
  // Bijective base-26 of id + 1: 0 -> "a", 25 -> "z", 26 -> "aa", ...
  char buf[24];
  int n = 0;
  std::uint64_t v = id + 1;
  while (v > 0) {
    v -= 1;
    buf[n++] = static_cast<char>('a' + v % 26);
    v /= 26;
  }
  return std::string(buf, buf + n);  // little-endian digits: unique either way
}

std::uint64_t word_token(const char* s, std::size_t n, std::int64_t vocab_size) {
  bool letters = n > 0 && n <= 13;
  for (std::size_t i = 0; letters && i < n; ++i) letters = s[i] >= 'a' && s[i] <= 'z';
  if (letters) {
    std::uint64_t v = 0;
    for (std::size_t i = n; i-- > 0;) v = v * 26 + static_cast<std::uint64_t>(s[i] - 'a' + 1);
    if (v >= 1 && v - 1 < static_cast<std::uint64_t>(vocab_size)) return v - 1;
  }
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 1099511628211ULL;
  return h % static_cast<std::uint64_t>(vocab_size);
}

std::vector<std::uint64_t> block_hashes(const std::vector<std::uint64_t>& ids, std::int32_t block) {
  std::vector<std::uint64_t> out;
  if (block <= 0) return out;
  out.reserve(ids.size() / block);
  std::uint64_t h = 0x9E3779B97F4A7C15ULL;
  for (std::size_t i = 0; i + block <= ids.size(); i += block) {
    for (std::int32_t k = 0; k < block; ++k) {
      h ^= ids[i + k] + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
      h *= 0xff51afd7ed558ccdULL;
    }
    out.push_back(h ^ (h >> 33));
  }
  return out;
}

}  // namespace speedmatrix::sim
