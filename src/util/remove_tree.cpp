#include "myriad/util/remove_tree.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "myriad/util/format.h"

namespace myriad {

namespace {

// nftw takes a plain function, so the walk's first failure is reached through a per-thread
// pointer to the caller's string. A thread_local std::string would be destroyed before atexit
// handlers run (tests clean up from one), and writing into it then corrupts the heap.
thread_local std::string* first_failure = nullptr;

// A directory that cannot be read keeps its entries, so removing it fails and is reported.
int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (std::remove(path) != 0 && errno != ENOENT && first_failure->empty())
    *first_failure = str_format("cannot remove '{}': {}", path, std::strerror(errno));
  return 0;  // keep going: remove as much as possible
}

}  // namespace

std::string remove_tree(const std::string& path) {
  struct stat info;
  if (lstat(path.c_str(), &info) != 0) {
    return errno == ENOENT ? std::string()
                           : str_format("cannot remove '{}': {}", path, std::strerror(errno));
  }
  std::string failure;
  first_failure = &failure;
  const int walked = nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  first_failure = nullptr;
  if (walked != 0 && failure.empty())
    failure = str_format("cannot remove '{}': {}", path, std::strerror(errno));
  return failure;
}

}  // namespace myriad
