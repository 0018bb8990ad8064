// The chunked-transfer decoder: table cases fed whole, at every split point
// and byte by byte; malformed framing; the sink stopping early.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "speedmatrix/chunked.hpp"

namespace speedmatrix {
namespace {

struct Collect : ChunkedDecoder::Sink {
  std::string body;
  std::vector<std::string> pieces;
  std::size_t stop_after = 0;  // > 0: refuse the piece after this many
  bool on_data(std::string_view piece) override {
    if (stop_after && pieces.size() == stop_after) return false;
    body.append(piece);
    pieces.emplace_back(piece);
    return true;
  }
};

struct Case {
  const char* name;
  std::string wire;
  std::string body;  // decoded
  bool done;         // the terminating chunk and trailers were complete
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"one_chunk", "5\r\nhello\r\n0\r\n\r\n", "hello", true},
      {"sse_events", "f\r\ndata: {\"a\":1}\n\n\r\nf\r\ndata: {\"b\":2}\n\n\r\n0\r\n\r\n",
       "data: {\"a\":1}\n\ndata: {\"b\":2}\n\n", true},
      {"upper_and_lower_hex", "A\r\n0123456789\r\na\r\nabcdefghij\r\n0\r\n\r\n",
       "0123456789abcdefghij", true},
      {"leading_zeros", "0005\r\nhello\r\n000\r\n\r\n", "hello", true},
      {"extensions", "5;name=value\r\nhello\r\n3 ; x=\"y;z\"\r\nabc\r\n0;last\r\n\r\n", "helloabc",
       true},
      {"trailers", "3\r\nabc\r\n0\r\nX-Checksum: 1\r\nX-Other: 2\r\n\r\n", "abc", true},
      {"bare_lf", "3\nabc\n0\n\n", "abc", true},
      {"crlf_inside_data", "4\r\n\r\n\r\n\r\n0\r\n\r\n", "\r\n\r\n", true},
      {"unfinished", "5\r\nhel", "hel", false},
      {"no_terminator", "3\r\nabc\r\n", "abc", false},
  };
  return c;
}

ChunkedDecoder::Status feed_split(ChunkedDecoder& d, const std::string& wire, std::size_t at,
                                  Collect& out) {
  auto s = d.feed(wire.data(), at, out);
  if (s == ChunkedDecoder::Status::kError) return s;
  return d.feed(wire.data() + at, wire.size() - at, out);
}

TEST(Chunked, EveryCaseAtEverySplitPoint) {
  for (const Case& c : cases()) {
    for (std::size_t at = 0; at <= c.wire.size(); ++at) {
      ChunkedDecoder d;
      Collect out;
      const auto s = feed_split(d, c.wire, at, out);
      EXPECT_EQ(out.body, c.body) << c.name << " split at " << at;
      EXPECT_EQ(s, c.done ? ChunkedDecoder::Status::kDone : ChunkedDecoder::Status::kOk) << c.name;
      EXPECT_EQ(d.done(), c.done) << c.name;
      EXPECT_EQ(d.has_partial(), !c.done && c.name != std::string("no_terminator")) << c.name;
    }
  }
}

TEST(Chunked, ByteByByte) {
  for (const Case& c : cases()) {
    ChunkedDecoder d;
    Collect out;
    for (char ch : c.wire) ASSERT_NE(d.feed(&ch, 1, out), ChunkedDecoder::Status::kError) << c.name;
    EXPECT_EQ(out.body, c.body) << c.name;
    EXPECT_EQ(d.done(), c.done) << c.name;
  }
}

TEST(Chunked, OneReadOfSeveralChunksGivesEachPieceInOrder) {
  ChunkedDecoder d;
  Collect out;
  EXPECT_EQ(d.feed("2\r\nab\r\n1\r\nc\r\n3\r\ndef\r\n", out), ChunkedDecoder::Status::kOk);
  EXPECT_EQ(out.pieces, (std::vector<std::string>{"ab", "c", "def"}));
  EXPECT_FALSE(d.has_partial());
}

TEST(Chunked, BytesAfterTheLastChunkAreIgnored) {
  ChunkedDecoder d;
  Collect out;
  EXPECT_EQ(d.feed("1\r\na\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n", out), ChunkedDecoder::Status::kDone);
  EXPECT_EQ(out.body, "a");
  EXPECT_EQ(d.feed("more", out), ChunkedDecoder::Status::kDone);
  EXPECT_EQ(out.body, "a");
}

TEST(Chunked, MalformedFramingIsAnErrorThatSticks) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"zz\r\n", "chunk size is not hexadecimal"},
      {"\r\n", "chunk size missing"},
      {";ext\r\n", "chunk size missing"},
      {"3\r\nabcX", "chunk data not followed by CRLF"},
      {"3\r\nabc\rX", "chunk data not followed by CRLF"},
      {"1 2\r\n", "chunk size is not hexadecimal"},
      {"1000000000000000\r\n", "chunk size too large"},
      {std::string(9000, '0'), "chunk size line too long"},
      {"0\r\n" + std::string(9000, 'x'), "trailer line too long"},
  };
  for (const auto& [wire, why] : bad) {
    ChunkedDecoder d;
    Collect out;
    EXPECT_EQ(d.feed(wire, out), ChunkedDecoder::Status::kError) << wire.substr(0, 20);
    EXPECT_EQ(std::string(d.error()), why) << wire.substr(0, 20);
    EXPECT_EQ(d.feed("1\r\na\r\n", out), ChunkedDecoder::Status::kError);
    d.reset();
    EXPECT_EQ(d.feed("1\r\na\r\n0\r\n\r\n", out), ChunkedDecoder::Status::kDone);
  }
}

TEST(Chunked, SinkCanStopTheFeed) {
  ChunkedDecoder d;
  Collect out;
  out.stop_after = 1;
  EXPECT_EQ(d.feed("1\r\na\r\n1\r\nb\r\n", out), ChunkedDecoder::Status::kStopped);
  EXPECT_EQ(out.body, "a");
}

TEST(Chunked, LargeChunkAcrossManyReads) {
  const std::string data(1 << 20, 'x');
  char head[32];
  std::snprintf(head, sizeof head, "%zx\r\n", data.size());
  const std::string wire = head + data + "\r\n0\r\n\r\n";
  ChunkedDecoder d;
  Collect out;
  for (std::size_t i = 0; i < wire.size(); i += 16384) {
    d.feed(wire.data() + i, std::min<std::size_t>(16384, wire.size() - i), out);
  }
  EXPECT_TRUE(d.done());
  EXPECT_EQ(out.body.size(), data.size());
}

}  // namespace
}  // namespace speedmatrix
