#include "speedmatrix/prom.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <unordered_map>

namespace speedmatrix {
namespace {

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_blank(char c) { return c == ' ' || c == '\t'; }

void skip_blanks(std::string_view s, std::size_t* i) {
  while (*i < s.size() && is_blank(s[*i])) ++*i;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// Go's ParseFloat forms that the exposition format allows: decimal and
// exponent forms, "NaN", "+Inf", "-Inf" (case-insensitive, "Inf"/"Infinity").
bool parse_value(std::string_view s, double* out) {
  if (s.empty()) return false;
  bool neg = false;
  std::string_view body = s;
  if (body[0] == '+' || body[0] == '-') {
    neg = body[0] == '-';
    body.remove_prefix(1);
  }
  if (iequals(body, "inf") || iequals(body, "infinity")) {
    *out = neg ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    return true;
  }
  if (iequals(body, "nan")) {
    *out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (body.empty() || body[0] == '+' || body[0] == '-') return false;
  double v = 0;
  auto [p, ec] = std::from_chars(body.data(), body.data() + body.size(), v);
  if (ec != std::errc() || p != body.data() + body.size()) return false;
  *out = neg ? -v : v;
  return true;
}

// Parses `{name="value",...}` starting at s[*i] == '{'.
bool parse_labels(std::string_view s, std::size_t* i, PromSample* out) {
  ++*i;  // '{'
  while (true) {
    skip_blanks(s, i);
    if (*i >= s.size()) return false;
    if (s[*i] == '}') {
      ++*i;
      return true;
    }
    const std::size_t name_start = *i;
    if (!is_name_start(s[*i])) return false;
    while (*i < s.size() && is_name_char(s[*i])) ++*i;
    std::string name(s.substr(name_start, *i - name_start));
    skip_blanks(s, i);
    if (*i >= s.size() || s[*i] != '=') return false;
    ++*i;
    skip_blanks(s, i);
    if (*i >= s.size() || s[*i] != '"') return false;
    ++*i;
    std::string value;
    while (true) {
      if (*i >= s.size()) return false;
      const char c = s[(*i)++];
      if (c == '"') break;
      if (c == '\\') {
        if (*i >= s.size()) return false;
        const char e = s[(*i)++];
        value += e == 'n' ? '\n' : e;  // \\ -> \, \" -> ", \n -> newline; others kept as is
      } else {
        value += c;
      }
    }
    out->labels.emplace_back(std::move(name), std::move(value));
    skip_blanks(s, i);
    if (*i < s.size() && s[*i] == ',')
      ++*i;
    else if (*i < s.size() && s[*i] != '}')
      return false;
  }
}

bool parse_line(std::string_view line, PromSample* out) {
  std::size_t i = 0;
  skip_blanks(line, &i);
  const std::size_t name_start = i;
  if (i >= line.size() || !is_name_start(line[i])) return false;
  while (i < line.size() && is_name_char(line[i])) ++i;
  out->name.assign(line.substr(name_start, i - name_start));
  std::size_t before = i;
  skip_blanks(line, &i);
  if (i < line.size() && line[i] == '{') {
    if (!parse_labels(line, &i, out)) return false;
    before = i;
    skip_blanks(line, &i);
  }
  if (i == before || i >= line.size()) return false;  // the value needs a blank before it
  const std::size_t value_start = i;
  while (i < line.size() && !is_blank(line[i])) ++i;
  if (!parse_value(line.substr(value_start, i - value_start), &out->value)) return false;
  skip_blanks(line, &i);
  if (i < line.size()) {  // optional integer timestamp (ms); read and dropped
    const std::size_t ts_start = i;
    while (i < line.size() && !is_blank(line[i])) ++i;
    std::int64_t ts = 0;
    std::string_view t = line.substr(ts_start, i - ts_start);
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), ts);
    if (ec != std::errc() || p != t.data() + t.size()) return false;
    skip_blanks(line, &i);
    if (i < line.size()) return false;
  }
  return true;
}

}  // namespace

std::vector<PromSample> parse_prometheus(std::string_view text, int* bad_lines) {
  std::vector<PromSample> out;
  int bad = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::size_t first = 0;
    while (first < line.size() && is_blank(line[first])) ++first;
    if (first == line.size() || line[first] == '#') continue;  // blank, HELP, TYPE, comments
    PromSample s;
    if (parse_line(line, &s)) {
      out.push_back(std::move(s));
    } else {
      ++bad;
    }
  }
  if (bad_lines) *bad_lines = bad;
  return out;
}

std::vector<double> reduce_by_name(const std::vector<PromSample>& samples,
                                   const std::vector<std::string>& names,
                                   const std::vector<Reduce>& how) {
  std::vector<double> out(names.size(), 0.0);
  std::vector<bool> found(names.size(), false);
  std::unordered_map<std::string_view, std::vector<std::size_t>> wanted;
  for (std::size_t j = 0; j < names.size(); ++j) wanted[names[j]].push_back(j);
  for (const PromSample& s : samples) {
    if (std::isnan(s.value)) continue;  // a NaN sample carries no value
    auto it = wanted.find(s.name);
    if (it == wanted.end()) continue;
    for (std::size_t j : it->second) {
      const bool take_max = j < how.size() && how[j] == Reduce::kMax;
      if (!found[j]) {
        out[j] = s.value;
      } else if (take_max) {
        out[j] = std::max(out[j], s.value);
      } else {
        out[j] += s.value;
      }
      found[j] = true;
    }
  }
  for (std::size_t j = 0; j < names.size(); ++j) {
    if (!found[j]) out[j] = std::numeric_limits<double>::quiet_NaN();
  }
  return out;
}

}  // namespace speedmatrix
