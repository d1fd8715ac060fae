#include "myriad/train/tensorboard_writer.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "myriad/util/clock.h"
#include "myriad/util/crc32c.h"
#include "myriad/util/error.h"

namespace myriad {

namespace {

// Protocol buffers wire format: field keys and varints, fixed 32/64-bit little-endian values,
// length-delimited bytes.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (field << 3) | type);
}

template <class T>
void put_fixed(std::string& out, uint32_t field, WireType type, T value) {
  put_key(out, field, type);
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// tensorflow.Event fields.
constexpr uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
// tensorflow.Summary.value, and Summary.Value's tag and simple_value.
constexpr uint32_t kSummaryValue = 1, kTag = 1, kSimpleValue = 2;

}  // namespace

std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time) {
  std::string summary_value;
  put_bytes(summary_value, kTag, tag);
  put_fixed(summary_value, kSimpleValue, kFixed32, value);
  std::string summary;
  put_bytes(summary, kSummaryValue, summary_value);
  std::string event;
  put_fixed(event, kWallTime, kFixed64, wall_time);
  put_key(event, kStep, kVarint);
  put_varint(event, static_cast<uint64_t>(step));
  put_bytes(event, kSummary, summary);
  return event;
}

std::string file_version_event(double wall_time) {
  std::string event;
  put_fixed(event, kWallTime, kFixed64, wall_time);
  put_bytes(event, kFileVersion, "brain.Event:2");
  return event;
}

std::string tfrecord(const std::string& data) {
  const uint64_t length = data.size();
  std::string out(reinterpret_cast<const char*>(&length), sizeof(length));
  const uint32_t length_crc = masked_crc32c(&length, sizeof(length));
  out.append(reinterpret_cast<const char*>(&length_crc), sizeof(length_crc));
  out += data;
  const uint32_t data_crc = masked_crc32c(data.data(), data.size());
  out.append(reinterpret_cast<const char*>(&data_crc), sizeof(data_crc));
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  MYRIAD_CHECK(!error, "cannot create the TensorBoard directory '{}': {}", directory,
               error.message());
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const double now = unix_seconds();
  path_ = (std::filesystem::path(directory) /
           str_format("events.out.tfevents.{}.{}", static_cast<int64_t>(now), host))
              .string();
  out_.open(path_, std::ios::binary | std::ios::app);
  MYRIAD_CHECK(out_.is_open(), "cannot create '{}'", path_);
  write_record(file_version_event(now));
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  write_record(scalar_event(tag, static_cast<float>(value), step, unix_seconds()));
}

void TensorBoardWriter::write_record(const std::string& event) {
  const std::string record = tfrecord(event);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  out_.flush();
  MYRIAD_CHECK(out_.good(), "writing '{}' failed (disk full?)", path_);
}

}  // namespace myriad
