#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace myriad {

// Reading large text files fast (millions of lines in seconds): the whole file in memory, lines
// and whitespace-separated fields as views into it, numbers by std::from_chars; no iostreams.

// The fields of one line, separated by spaces, tabs or '\r'; `count` counts them all, also those
// beyond the kKept that are kept.
struct TextFields {
  static constexpr size_t kKept = 16;
  std::array<std::string_view, kKept> at;
  size_t count = 0;
};

TextFields split_fields(std::string_view line);

// Calls on_line(number, fields) for every line of `text` that holds a field, numbered from 1.
template <class OnLine>
void for_each_line(std::string_view text, OnLine on_line) {
  int64_t number = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    ++number;
    const TextFields fields = split_fields(text.substr(pos, end - pos));
    if (fields.count > 0) on_line(number, fields);
    pos = end + 1;
  }
}

// A line of a file, for the errors about it: "'FILE' line N: ...".
struct TextLine {
  const std::string& file;
  int64_t number;
};

// A field as an error shows it: cut short where a corrupt file made it long.
std::string shown_field(std::string_view field);

// `field` whole as an integer, or a finite number; otherwise an Error "'FILE' line N: WHAT 'FIELD'
// is not an integer" (or "a finite number").
int64_t parse_integer_field(std::string_view field, const char* what, const TextLine& at);
double parse_finite_field(std::string_view field, const char* what, const TextLine& at);

}  // namespace myriad
