#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "myriad/util/strings.h"

namespace myriad {

// How myriad-doctor writes its figures and tables.

inline constexpr double kGB = 1e9;
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// "1.25 GB/s", or below 1 GB/s "850.0 MB/s".
std::string rate_text(double bytes_per_second);

// The nominal link a figure corresponds to: "about 10 GbE", "below 1 GbE".
std::string link_class(double bytes_per_second);

// A class count as the options write it: "1B", "30M", "100K", "37".
std::string classes_text(int64_t classes);

// Prints `rows` to stdout, columns padded to their widest cell.
void print_table(const std::vector<std::vector<std::string>>& rows);

}  // namespace myriad
