#include "myriad/util/format.h"

#include <cstdio>
#include <iomanip>

namespace myriad {
namespace detail {

namespace {

void apply_spec(std::ostream& os, std::string_view spec) {
  size_t i = 0;
  if (i < spec.size() && spec[i] == '<') {
    os << std::left;
    ++i;
  }
  if (i < spec.size() && spec[i] == '0') {
    os.fill('0');
    ++i;
  }
  int width = 0;
  while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9')
    width = width * 10 + (spec[i++] - '0');
  if (width > 0) os << std::setw(width);
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    int precision = 0;
    while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') {
      precision = precision * 10 + (spec[i++] - '0');
    }
    os << std::setprecision(precision);
  }
  if (i < spec.size()) {
    switch (spec[i]) {
      case 'f':
        os << std::fixed;
        break;
      case 'e':
        os << std::scientific;
        break;
      case 'x':
        os << std::hex;
        break;
      default:
        break;
    }
  }
}

}  // namespace

std::string_view format_step(std::ostream& os, std::string_view fmt) {
  size_t open = fmt.find('{');
  if (open == std::string_view::npos) {
    os << fmt << ' ';
    return {};
  }
  size_t close = fmt.find('}', open);
  if (close == std::string_view::npos) {
    os << fmt << ' ';
    return {};
  }
  os << fmt.substr(0, open);
  std::string_view inner = fmt.substr(open + 1, close - open - 1);
  if (!inner.empty() && inner[0] == ':') apply_spec(os, inner.substr(1));
  return fmt.substr(close + 1);
}

}  // namespace detail

std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  char buf[48];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  } else {
    std::snprintf(buf, sizeof(buf),
                  bytes < 10    ? "%.2f %s"
                  : bytes < 100 ? "%.1f %s"
                                : "%.0f %s",
                  bytes, kUnits[unit]);
  }
  return buf;
}

}  // namespace myriad
