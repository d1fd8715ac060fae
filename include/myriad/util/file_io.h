#pragma once

#include <cstdint>
#include <string>

namespace myriad {

// A file descriptor open for reading (O_CLOEXEC), closed with the object; an Error naming the
// file when it cannot be opened.
class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(const std::string& path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  int fd() const { return fd_; }
  int64_t size() const;

 private:
  std::string path_;
  int fd_;
};

// The whole file; an Error naming it when it cannot be opened or read.
std::string read_whole_file(const std::string& path);

// pread() and pwrite() of `bytes` bytes at `offset` of `fd`, resumed after short transfers and
// EINTR; an Error naming `path`, the byte and the reason otherwise (an early end of file included).
void read_at(int fd, void* data, int64_t bytes, int64_t offset, const std::string& path);
void write_at(int fd, const void* data, int64_t bytes, int64_t offset, const std::string& path);

// Creates or truncates `path` and writes `bytes` into it; an Error naming the file otherwise.
void write_whole_file(const std::string& path, const std::string& bytes);

}  // namespace myriad
