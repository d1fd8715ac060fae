#include "recordio_writer.h"

#include <cstring>
#include <stdexcept>

namespace myriad::testing {

namespace {

constexpr uint32_t kMagic = 0xced7230a;

template <class T>
std::string bytes_of(const T& value) {
  return std::string(reinterpret_cast<const char*>(&value), sizeof(value));
}

}  // namespace

std::string recordio_magic() {
  return bytes_of(kMagic);
}

RecordIoWriter::RecordIoWriter(const std::string& rec_path, const std::string& idx_path)
    : rec_(rec_path, std::ios::binary), idx_(idx_path) {
  if (!rec_ || !idx_) throw std::runtime_error("cannot create " + rec_path + " or " + idx_path);
}

void RecordIoWriter::write(int64_t key, const std::string& data) {
  idx_ << key << '\t' << offset_ << '\n';
  const auto part = [&](uint32_t flag, size_t begin, size_t end) {
    const uint32_t lrecord = (flag << 29) | static_cast<uint32_t>(end - begin);
    std::string out = recordio_magic() + bytes_of(lrecord) + data.substr(begin, end - begin);
    out.resize((out.size() + 3) / 4 * 4, '\0');
    rec_.write(out.data(), static_cast<std::streamsize>(out.size()));
    offset_ += static_cast<int64_t>(out.size());
  };
  size_t begin = 0;
  for (size_t i = 0; i + 4 <= data.size(); i += 4) {
    if (data.compare(i, 4, recordio_magic()) == 0) {
      part(begin == 0 ? 1 : 2, begin, i);
      begin = i + 4;
    }
  }
  part(begin == 0 ? 0 : 3, begin, data.size());
  rec_.flush();
  idx_.flush();
}

std::string pack_image_record(const std::vector<float>& labels, bool scalar, uint64_t id,
                              const std::string& image) {
  const uint32_t flag = scalar ? 0 : static_cast<uint32_t>(labels.size());
  const float header_label = scalar ? labels.at(0) : 0.0f;
  std::string out = bytes_of(flag) + bytes_of(header_label) + bytes_of(id) + bytes_of(uint64_t{0});
  if (!scalar) out.append(reinterpret_cast<const char*>(labels.data()), 4 * labels.size());
  return out + image;
}

}  // namespace myriad::testing
