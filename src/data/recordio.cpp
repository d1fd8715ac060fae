#include "myriad/data/recordio.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "myriad/util/error.h"

namespace myriad {

namespace {

constexpr uint32_t kMagic = 0xced7230a;
constexpr int64_t kHeaderBytes = 24;  // uint32 flag, float32 label, uint64 id, uint64 id2

uint32_t read_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

int64_t padded(int64_t length) {
  return (length + 3) / 4 * 4;
}

}  // namespace

RecordIoReader::RecordIoReader(const std::string& rec_path, const std::string& idx_path)
    : rec_path_(rec_path) {
  fd_ = open(rec_path.c_str(), O_RDONLY);
  MYRIAD_CHECK(fd_ >= 0, "cannot open '{}': {}", rec_path, std::strerror(errno));
  struct stat info {};
  if (fstat(fd_, &info) != 0) {
    close(fd_);
    MYRIAD_THROW("cannot stat '{}': {}", rec_path, std::strerror(errno));
  }
  file_size_ = info.st_size;
  try {
    std::ifstream in(idx_path);
    MYRIAD_CHECK(in.good(), "cannot open the index '{}'", idx_path);
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::istringstream fields(line);
      int64_t key = 0, offset = 0;
      std::string rest;
      MYRIAD_CHECK(fields >> key >> offset && !(fields >> rest),
                   "'{}' line {}: expected 'key<TAB>offset', found '{}'", idx_path, number, line);
      MYRIAD_CHECK(offset >= 0 && offset <= file_size_ - 8,
                   "'{}' line {}: record {} starts at byte {}, past the end of '{}' ({} bytes): "
                   "the .rec is truncated or belongs to another index",
                   idx_path, number, key, offset, rec_path, file_size_);
      keys_.push_back(key);
      offsets_.emplace_back(key, offset);
    }
    MYRIAD_CHECK(!keys_.empty(), "the index '{}' lists no records", idx_path);
    std::sort(offsets_.begin(), offsets_.end());
    for (size_t i = 1; i < offsets_.size(); ++i) {
      MYRIAD_CHECK(offsets_[i].first != offsets_[i - 1].first, "'{}' lists record {} twice",
                   idx_path, offsets_[i].first);
    }
  } catch (...) {
    close(fd_);
    throw;
  }
}

RecordIoReader::~RecordIoReader() {
  close(fd_);
}

bool RecordIoReader::has(int64_t key) const {
  const auto it =
      std::lower_bound(offsets_.begin(), offsets_.end(), std::make_pair(key, int64_t{0}));
  return it != offsets_.end() && it->first == key;
}

std::string RecordIoReader::read(int64_t key) const {
  const auto it =
      std::lower_bound(offsets_.begin(), offsets_.end(), std::make_pair(key, int64_t{0}));
  MYRIAD_CHECK(it != offsets_.end() && it->first == key, "'{}' has no record {} in its index",
               rec_path_, key);
  const auto pread_exact = [&](char* out, int64_t bytes, int64_t at) {
    MYRIAD_CHECK(at + bytes <= file_size_,
                 "record {} of '{}' is truncated: it runs past the end of the file (byte {} of {})",
                 key, rec_path_, at + bytes, file_size_);
    for (int64_t done = 0; done < bytes;) {
      const ssize_t got = pread(fd_, out + done, static_cast<size_t>(bytes - done), at + done);
      MYRIAD_CHECK(got > 0, "reading record {} of '{}': {}", key, rec_path_,
                   got == 0 ? "unexpected end of file" : std::strerror(errno));
      done += got;
    }
  };
  std::string data;
  int64_t at = it->second;
  for (int part = 0;; ++part) {
    char head[8];
    pread_exact(head, 8, at);
    MYRIAD_CHECK(read_u32(head) == kMagic,
                 "record {} of '{}' is corrupt: no RecordIO magic at byte {} (found 0x{:x})", key,
                 rec_path_, at, read_u32(head));
    const uint32_t lrecord = read_u32(head + 4);
    const uint32_t flag = lrecord >> 29;
    const int64_t length = lrecord & ((1u << 29) - 1);
    const bool first = part == 0;
    MYRIAD_CHECK(flag <= 3 && (first ? flag <= 1 : flag >= 2),
                 "record {} of '{}' is corrupt: part {} has continuation flag {}", key, rec_path_,
                 part, flag);
    MYRIAD_CHECK(length <= file_size_ - (at + 8),
                 "record {} of '{}' is truncated: part {} of {} bytes at byte {} runs past the end "
                 "of the file ({} bytes)",
                 key, rec_path_, part, length, at, file_size_);
    if (!first) data.append(reinterpret_cast<const char*>(&kMagic), 4);
    const size_t start = data.size();
    data.resize(start + static_cast<size_t>(length));
    pread_exact(data.data() + start, length, at + 8);
    at += 8 + padded(length);
    if (flag == 0 || flag == 3) break;
  }
  return data;
}

ImageRecord parse_image_record(const std::string& data, const std::string& what) {
  MYRIAD_CHECK(static_cast<int64_t>(data.size()) >= kHeaderBytes,
               "{} is corrupt: {} bytes, shorter than an image record header", what, data.size());
  ImageRecord record;
  const uint32_t flag = read_u32(data.data());
  float label;
  std::memcpy(&label, data.data() + 4, sizeof(label));
  std::memcpy(&record.id, data.data() + 8, sizeof(record.id));
  std::memcpy(&record.id2, data.data() + 16, sizeof(record.id2));
  int64_t at = kHeaderBytes;
  if (flag == 0) {
    record.labels = {label};
  } else {
    MYRIAD_CHECK(kHeaderBytes + 4 * static_cast<int64_t>(flag) <= static_cast<int64_t>(data.size()),
                 "{} is corrupt: its header promises {} labels in {} bytes", what, flag,
                 data.size());
    record.labels.resize(flag);
    std::memcpy(record.labels.data(), data.data() + at, 4 * static_cast<size_t>(flag));
    at += 4 * static_cast<int64_t>(flag);
  }
  for (const float l : record.labels) {
    MYRIAD_CHECK(std::isfinite(l), "{} is corrupt: label {} is not a number", what, l);
  }
  record.image = data.substr(static_cast<size_t>(at));
  return record;
}

}  // namespace myriad
