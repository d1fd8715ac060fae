#pragma once

#include <string>

namespace myriad {

// fsync of a file or directory.
void sync_path(const std::string& path);

// Writes a file or directory under a temporary name next to `path` and renames it into place on
// commit(), so readers never see a partial output. Without commit() (an error unwound the writer)
// the temporary is removed, whole.
class AtomicOutput {
 public:
  explicit AtomicOutput(std::string path);
  ~AtomicOutput();
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;

  const std::string& temporary_path() const { return temporary_; }
  // fsyncs the temporary, renames it to the final path and fsyncs the directory holding it.
  void commit();

 private:
  std::string path_;
  std::string temporary_;
  bool committed_ = false;
};

// Writes `bytes` to `path` (created or truncated): an Error naming it where it cannot.
void write_file(const std::string& path, const std::string& bytes);
// Writes `bytes` to `path` through an AtomicOutput.
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace myriad
