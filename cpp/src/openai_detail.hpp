// What openai.cpp (the stream decoder) and openai_errors.cpp (error bodies) share. Private
// to cpp/src.
#pragma once

#include <string>
#include <string_view>

namespace speedmatrix::detail {

// Turns any text into one line of at most 500 bytes: control characters become spaces,
// runs of whitespace collapse, and a cut never splits a UTF-8 sequence.
std::string one_line(std::string_view in);

}  // namespace speedmatrix::detail
