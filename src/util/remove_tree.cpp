#include "myriad/util/remove_tree.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "myriad/util/format.h"

namespace myriad {

namespace {

// nftw takes a plain function, so the first failure is kept per thread.
thread_local std::string first_failure;

// A directory that cannot be read keeps its entries, so removing it fails and is reported.
int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (std::remove(path) != 0 && errno != ENOENT && first_failure.empty())
    first_failure = str_format("cannot remove '{}': {}", path, std::strerror(errno));
  return 0;  // keep going: remove as much as possible
}

}  // namespace

std::string remove_tree(const std::string& path) {
  struct stat info;
  if (lstat(path.c_str(), &info) != 0) {
    return errno == ENOENT ? std::string()
                           : str_format("cannot remove '{}': {}", path, std::strerror(errno));
  }
  first_failure.clear();
  if (nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && first_failure.empty())
    first_failure = str_format("cannot remove '{}': {}", path, std::strerror(errno));
  return first_failure;
}

}  // namespace myriad
