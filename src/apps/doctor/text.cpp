#include "text.h"

#include <algorithm>
#include <cstdio>

#include "myriad/util/format.h"

namespace myriad {

std::string rate_text(double bytes_per_second) {
  if (bytes_per_second >= kGB) return str_format("{:.2f} GB/s", bytes_per_second / kGB);
  return str_format("{:.1f} MB/s", bytes_per_second / 1e6);
}

std::string link_class(double bytes_per_second) {
  const double gbits = bytes_per_second * 8.0 / kGB;
  for (const double nominal : {0.1, 1.0, 10.0, 25.0, 40.0, 100.0, 200.0, 400.0, 800.0}) {
    if (gbits > 1.15 * nominal) continue;
    const std::string name = nominal < 1.0      ? "100 Mb Ethernet"
                             : nominal <= 100.0 ? str_format("{} GbE", nominal)
                                                : str_format("{} Gb/s", nominal);
    return (gbits >= 0.5 * nominal ? "about " : "below ") + name;
  }
  return "NVLink or shared-memory class";
}

std::string classes_text(int64_t classes) {
  if (classes >= 1000000000 && classes % 1000000000 == 0)
    return str_format("{}B", classes / 1000000000);
  if (classes >= 1000000 && classes % 100000 == 0)
    return str_format("{}M", static_cast<double>(classes) / 1e6);
  if (classes >= 1000 && classes % 100 == 0)
    return str_format("{}K", static_cast<double>(classes) / 1e3);
  return std::to_string(classes);
}

void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

}  // namespace myriad
