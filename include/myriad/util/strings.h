#pragma once

#include <string>
#include <vector>

namespace myriad {

// The items with `separator` between them.
std::string join(const std::vector<std::string>& items, const std::string& separator);

}  // namespace myriad
