#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace myriad {

// MXNet's indexed RecordIO (dmlc-core), as insightface ships MS1MV2/MS1MV3/Glint360K/WebFace:
// FILE.rec holds records, each one or more parts of [magic 0xced7230a][lrecord: flag << 29 |
// length][data][zero padding to 4 bytes]; a record whose data contained the magic word at an
// aligned position is split there (flags 1 start, 2 middle, 3 end; 0 a whole record) and the
// magic is put back on reading. FILE.idx is text, "key<TAB>byte offset" per line.
class RecordIoReader {
 public:
  // Reads and checks the index: keys unique, offsets inside the .rec file. Errors name the file
  // and line.
  RecordIoReader(const std::string& rec_path, const std::string& idx_path);
  ~RecordIoReader();
  RecordIoReader(const RecordIoReader&) = delete;
  RecordIoReader& operator=(const RecordIoReader&) = delete;

  // Keys in index order.
  const std::vector<int64_t>& keys() const { return keys_; }
  bool has(int64_t key) const;
  // The record's data. A bad magic, length or flag sequence, or a record running past the end
  // of the file, is an Error naming the key. Safe to call from several threads.
  std::string read(int64_t key) const;

  const std::string& path() const { return rec_path_; }

 private:
  std::string rec_path_;
  int fd_ = -1;
  int64_t file_size_ = 0;
  std::vector<int64_t> keys_;
  std::vector<std::pair<int64_t, int64_t>> offsets_;  // (key, offset), sorted by key
};

// An image record as MXNet's recordio.pack writes it: header {uint32 flag, float32 label,
// uint64 id, uint64 id2}, then `flag` float32 labels when flag > 0, then the image bytes.
struct ImageRecord {
  std::vector<float> labels;  // the header label when flag is 0, else the `flag` labels
  uint64_t id = 0;
  uint64_t id2 = 0;
  std::string image;
};

// Splits a record's data; one too short for its header or label count is an Error naming `what`.
ImageRecord parse_image_record(const std::string& data, const std::string& what);

}  // namespace myriad
