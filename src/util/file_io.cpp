#include "myriad/util/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "myriad/util/error.h"

namespace myriad {

ReadOnlyFile::ReadOnlyFile(const std::string& path)
    : path_(path), fd_(open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
  MYRIAD_CHECK(fd_ >= 0, "cannot open '{}': {}", path, std::strerror(errno));
}

ReadOnlyFile::~ReadOnlyFile() {
  close(fd_);
}

int64_t ReadOnlyFile::size() const {
  struct stat info {};
  MYRIAD_CHECK(fstat(fd_, &info) == 0, "cannot stat '{}': {}", path_, std::strerror(errno));
  return info.st_size;
}

std::string read_whole_file(const std::string& path) {
  const ReadOnlyFile file(path);
  std::string bytes(static_cast<size_t>(file.size()), '\0');
  read_at(file.fd(), bytes.data(), file.size(), 0, path);
  return bytes;
}

void read_at(int fd, void* data, int64_t bytes, int64_t offset, const std::string& path) {
  auto* at = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = pread(fd, at, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    MYRIAD_CHECK(n > 0, "cannot read '{}' at byte {}: {}", path, offset,
                 n < 0 ? std::strerror(errno) : "the file ends there (truncated?)");
    at += n;
    bytes -= n;
    offset += n;
  }
}

void write_at(int fd, const void* data, int64_t bytes, int64_t offset, const std::string& path) {
  const auto* at = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = pwrite(fd, at, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    MYRIAD_CHECK(n > 0, "cannot write '{}' at byte {}: {}", path, offset,
                 n < 0 ? std::strerror(errno) : "no progress");
    at += n;
    bytes -= n;
    offset += n;
  }
}

void write_whole_file(const std::string& path, const std::string& bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MYRIAD_CHECK(fd >= 0, "cannot create '{}': {}", path, std::strerror(errno));
  try {
    write_at(fd, bytes.data(), static_cast<int64_t>(bytes.size()), 0, path);
  } catch (...) {
    close(fd);
    throw;
  }
  MYRIAD_CHECK(close(fd) == 0, "cannot write '{}': {}", path, std::strerror(errno));
}

}  // namespace myriad
