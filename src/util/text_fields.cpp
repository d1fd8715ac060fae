#include "myriad/util/text_fields.h"

#include <charconv>
#include <cmath>

#include "myriad/util/error.h"

namespace myriad {

namespace {

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

TextFields split_fields(std::string_view line) {
  TextFields f;
  size_t i = 0;
  while (true) {
    while (i < line.size() && is_blank(line[i])) ++i;
    if (i == line.size()) return f;
    const size_t start = i;
    while (i < line.size() && !is_blank(line[i])) ++i;
    if (f.count < f.at.size()) f.at[f.count] = line.substr(start, i - start);
    ++f.count;
  }
}

std::string shown_field(std::string_view field) {
  constexpr size_t kShown = 40;
  return field.size() <= kShown ? std::string(field) : std::string(field.substr(0, kShown)) + "...";
}

int64_t parse_integer_field(std::string_view field, const char* what, const TextLine& at) {
  int64_t value = 0;
  const char* end = field.data() + field.size();
  const std::from_chars_result r = std::from_chars(field.data(), end, value);
  MYRIAD_CHECK(r.ec == std::errc() && r.ptr == end, "'{}' line {}: {} '{}' is not an integer",
               at.file, at.number, what, shown_field(field));
  return value;
}

double parse_finite_field(std::string_view field, const char* what, const TextLine& at) {
  double value = 0.0;
  const char* end = field.data() + field.size();
  const std::from_chars_result r = std::from_chars(field.data(), end, value);
  MYRIAD_CHECK(r.ec == std::errc() && r.ptr == end && std::isfinite(value),
               "'{}' line {}: {} '{}' is not a finite number", at.file, at.number, what,
               shown_field(field));
  return value;
}

}  // namespace myriad
