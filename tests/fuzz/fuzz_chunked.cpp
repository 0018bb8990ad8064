// libFuzzer target: the chunked transfer decoder fed hostile framing in two pieces. Checks:
// no crash, no out-of-bounds read (ASan), no signed overflow in chunk sizes (UBSan), and
// decoded bytes never more than the bytes given.
#include <cstdlib>

#include "fuzz_common.hpp"
#include "speedmatrix/chunked.hpp"

namespace {

struct Sink : speedmatrix::ChunkedDecoder::Sink {
  std::size_t bytes = 0;
  bool on_data(std::string_view piece) override {
    volatile char c = 0;
    for (char ch : piece) c = static_cast<char>(c ^ ch);  // every byte is readable
    (void)c;
    bytes += piece.size();
    return true;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto [a, b] = speedmatrix::fuzz::split(data, size);
  speedmatrix::ChunkedDecoder d;
  Sink sink;
  auto st = d.feed(a, sink);
  if (st == speedmatrix::ChunkedDecoder::Status::kOk) d.feed(b, sink);
  if (sink.bytes > size) std::abort();
  (void)d.has_partial();
  (void)d.error();
  return 0;
}
