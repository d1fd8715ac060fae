#pragma once

#include <ostream>
#include <sstream>
#include <string>
#include <string_view>

namespace myriad {
namespace detail {

// Writes `fmt` up to its next placeholder, applies the placeholder's spec to `os`, and returns
// the rest of the format after the placeholder. A spec is `{}` or
// `{:[<][0][width][.precision][f|e|x]}`.
std::string_view format_step(std::ostream& os, std::string_view fmt);

inline void format_rest(std::ostream& os, std::string_view fmt) {
  os << fmt;
}

template <class Arg, class... Rest>
void format_rest(std::ostream& os, std::string_view fmt, const Arg& arg, const Rest&... rest) {
  const std::ios::fmtflags flags = os.flags();
  const std::streamsize precision = os.precision();
  const char fill = os.fill();
  std::string_view tail = format_step(os, fmt);
  os << arg;
  os.flags(flags);
  os.precision(precision);
  os.fill(fill);
  format_rest(os, tail, rest...);
}

}  // namespace detail

// A small `{}`-style formatter for log and error messages. Extra arguments are appended
// after the text; missing ones leave their placeholders empty.
template <class... Args>
std::string str_format(std::string_view fmt, const Args&... args) {
  std::ostringstream os;
  detail::format_rest(os, fmt, args...);
  return os.str();
}

// Human-readable byte counts: "512 B", "1.50 KiB", "64.0 MiB".
std::string format_bytes(double bytes);

}  // namespace myriad
