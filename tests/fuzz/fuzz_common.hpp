// Shared helpers of the libFuzzer targets (tests/fuzz/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace speedmatrix::fuzz {

// The fuzzer's bytes split in two at a point chosen by the first byte: the parsers are fed
// streams in pieces, so a boundary anywhere must give the same events as one piece.
struct Split {
  std::string_view a, b;
};

inline Split split(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return {};
  std::size_t cut = data[0] % size;
  std::string_view all(reinterpret_cast<const char*>(data) + 1, size - 1);
  cut = cut > all.size() ? all.size() : cut;
  return {all.substr(0, cut), all.substr(cut)};
}

}  // namespace speedmatrix::fuzz
