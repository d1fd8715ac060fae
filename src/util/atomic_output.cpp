#include "myriad/util/atomic_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "myriad/util/error.h"
#include "myriad/util/file_io.h"
#include "myriad/util/log.h"
#include "myriad/util/remove_tree.h"

namespace myriad {

void sync_path(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  MYRIAD_CHECK(fd >= 0, "cannot open '{}' to sync it: {}", path, std::strerror(errno));
  const int rc = fsync(fd);
  close(fd);
  MYRIAD_CHECK(rc == 0, "cannot sync '{}': {}", path, std::strerror(errno));
}

AtomicOutput::AtomicOutput(std::string path) : path_(std::move(path)) {
  temporary_ = str_format("{}.tmp-{}", path_, static_cast<long>(getpid()));
}

AtomicOutput::~AtomicOutput() {
  if (committed_) return;
  const std::string failure = remove_tree(temporary_);
  if (!failure.empty()) log_warn("{}", failure);
}

void AtomicOutput::commit() {
  sync_path(temporary_);
  MYRIAD_CHECK(std::rename(temporary_.c_str(), path_.c_str()) == 0,
               "cannot rename '{}' to '{}': {}", temporary_, path_, std::strerror(errno));
  committed_ = true;
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  sync_path(parent.empty() ? "." : parent.string());
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  AtomicOutput out(path);
  write_whole_file(out.temporary_path(), bytes);
  out.commit();
}

}  // namespace myriad
