#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace myriad::testing {

// Writes MXNet indexed RecordIO the way dmlc-core's RecordIOWriter and MXIndexedRecordIO do,
// independently of myriad's reader: a record whose data holds the magic word at a 4-byte aligned
// position is split there into flagged parts.
class RecordIoWriter {
 public:
  RecordIoWriter(const std::string& rec_path, const std::string& idx_path);
  void write(int64_t key, const std::string& data);
  int64_t bytes_written() const { return offset_; }

 private:
  std::ofstream rec_;
  std::ofstream idx_;
  int64_t offset_ = 0;
};

// MXNet's recordio.pack: a scalar label gives flag 0; a label vector gives flag = its length,
// the labels stored after the header.
std::string pack_image_record(const std::vector<float>& labels, bool scalar, uint64_t id,
                              const std::string& image);

// The magic word's bytes, for tests that plant it inside record data.
std::string recordio_magic();

}  // namespace myriad::testing
