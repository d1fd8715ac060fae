#pragma once

#include <string>

namespace myriad {

// Removes `path` and everything under it, like `rm -rf` (symbolic links are removed, never
// followed); a missing path is not an error. Returns "" on success, else what failed.
//
// std::filesystem::remove_all is not used: PyTorch's wheels export an older libstdc++'s
// recursive_directory_iterator from libtorch_cpu (pytorch/pytorch#133437), and remove_all of a
// directory crashes when it binds to that copy.
std::string remove_tree(const std::string& path);

}  // namespace myriad
